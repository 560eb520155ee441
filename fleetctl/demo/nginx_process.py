"""Start and stop a real nginx for tests and the demo: `nginx -p <prefix> -c <prefix>/nginx.conf`
in the foreground (`daemon off`, so the process we started is the master), with pid file,
error log, temp paths and sockets inside the prefix — never the system service.

The first config is the nginx adapter's rendering of an empty desired state. When started as
root, workers run as the `user` option; the default here is the current user, because test
prefixes live under private (0700) temp directories that `nobody` could not enter.
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import subprocess
from pathlib import Path
from typing import Any

from fleetctl.core.http import OutboundError, shared_client
from fleetctl.core.ports import free_port
from fleetctl.demo import process
from fleetctl.demo.process import answers
from fleetctl.demo.readiness import wait_ready
from fleetctl.traffic.gateways.base import DesiredState, GatewaySpec
from fleetctl.traffic.gateways.nginx.render import NginxSettings, render_config


def _current_user() -> str:
    return f"{pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name}"


class NginxProcess:
    """One nginx master (and its workers) serving `http://127.0.0.1:<port>`."""

    def __init__(self, prefix: Path, *, port: int | None = None, name: str = "nginx-test",
                 nginx_bin: str = "/usr/sbin/nginx", **options: Any) -> None:
        self.prefix = prefix
        self.port = port or free_port()
        prefix.mkdir(parents=True, exist_ok=True)
        defaults: dict[str, Any] = {"listen": f"127.0.0.1:{self.port}", "nginx_bin": nginx_bin}
        if os.geteuid() == 0:
            defaults["user"] = _current_user()
        self.gateway = GatewaySpec(name=name, kind="nginx", admin_address=str(prefix),
                                   options={**defaults, **options})
        # The options are read as the adapter reads them: a bad one fails here, named.
        self.settings = NginxSettings.from_gateway(self.gateway)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> NginxProcess:
        if not self.settings.conf.exists():
            empty = DesiredState(routes=(), pools={})
            self.settings.conf.write_text(render_config(empty, self.settings).text)
        (self.prefix / "tmp").mkdir(exist_ok=True)
        log = (self.prefix / "nginx.stderr").open("ab")
        self.proc = subprocess.Popen(
            [self.settings.options.nginx_bin, "-p", str(self.prefix), "-c", str(self.settings.conf),
             "-e", str(self.prefix / "error.log"), "-g", "daemon off;"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        self._wait_until_serving(timeout_s)
        return self

    def _wait_until_serving(self, timeout_s: float) -> None:
        assert self.proc is not None
        serving = answers(
            lambda: shared_client().get(self.settings.status_url, timeout_s=0.5),
            lambda answer: answer.status_code == 200 and self.settings.pid_file.exists(),
            OutboundError)
        wait_ready(self.proc, serving, what="nginx", timeout_s=timeout_s, log=self.log)

    @property
    def master_pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        text = ""
        for name in ("nginx.stderr", "error.log"):
            path = self.prefix / name
            if path.exists():
                text += path.read_text(errors="replace")[-3000:]
        return text

    def stop(self, timeout_s: float = 10.0, graceful: bool = False) -> None:
        """SIGTERM (fast shutdown) by default; SIGQUIT lets workers finish in-flight requests."""
        process.stop(self.proc, timeout_s, signum=signal.SIGQUIT if graceful else signal.SIGTERM,
                     group=True)
