"""Start and stop a real HAProxy for tests and the demo: its own directory, config, pid file,
stats socket and master CLI socket, never the system service.

HAProxy runs in master-worker mode (`-W -S <master socket>`), as the HAProxy adapter expects:
the adapter rewrites `haproxy.cfg` and reloads through the master CLI. The first config is the
adapter's own rendering of an empty desired state (every request answers 404/451).

With an `access_log` option, the rendered config logs each request to stdout (HAProxy writes
no files of its own) and this process appends HAProxy's stdout to that file, where the
telemetry ingester follows it; HAProxy's own messages (stderr) go to haproxy.log.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, BinaryIO

from fleetctl.core.ports import free_port
from fleetctl.demo import process
from fleetctl.demo.process import answers
from fleetctl.demo.readiness import wait_ready
from fleetctl.traffic.gateways.base import AdapterError, DesiredState, GatewaySpec
from fleetctl.traffic.gateways.haproxy.adapter import parse_servers_state, runtime_command
from fleetctl.traffic.gateways.haproxy.render import HAProxySettings, render_config


class HAProxyProcess:
    """One HAProxy master (and its workers) serving `http://127.0.0.1:<port>`."""

    def __init__(self, directory: Path, *, port: int | None = None, name: str = "haproxy-test",
                 haproxy_bin: str = "/usr/sbin/haproxy", **options: Any) -> None:
        self.directory = directory
        self.port = port or free_port()
        directory.mkdir(parents=True, exist_ok=True)
        self.gateway = GatewaySpec(
            name=name, kind="haproxy", admin_address=str(directory / "admin.sock"),
            options={
                "bind": f"127.0.0.1:{self.port}",
                "config_path": str(directory / "haproxy.cfg"),
                "master_socket": str(directory / "master.sock"),
                "state_file": str(directory / "server-state"),
                "haproxy_bin": haproxy_bin,
                **options,
            },
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None
        self._access_log: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def master_socket(self) -> str:
        return str(self.gateway.options["master_socket"])

    def start(self, timeout_s: float = 10.0) -> HAProxyProcess:
        # The options are read as the adapter reads them: a bad one fails here, named.
        settings = HAProxySettings.from_gateway(self.gateway)
        config_path = settings.config_path
        if not config_path.exists():
            config_path.write_text(render_config(DesiredState(routes=(), pools={}), settings).text)
        self._log = (self.directory / "haproxy.log").open("ab")
        if settings.options.access_log:
            # Workers inherit the master's stdout, across reloads too.
            self._access_log = Path(settings.options.access_log).open("ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [settings.options.haproxy_bin, "-W", "-S", self.master_socket, "-f", str(config_path),
             "-p", str(self.directory / "haproxy.pid")],
            stdout=self._access_log or self._log, stderr=self._log, start_new_session=True,
        )
        self._wait_for_runtime_api(timeout_s)
        return self

    def _wait_for_runtime_api(self, timeout_s: float) -> None:
        assert self.proc is not None
        ready = answers(
            lambda: runtime_command(self.gateway.admin_address, "show info", timeout_s=0.5),
            lambda _: True, AdapterError)
        wait_ready(self.proc, ready, what="haproxy's runtime API", timeout_s=timeout_s,
                   log=self.log)

    def reload(self, timeout_s: float = 10.0) -> float:
        """A reload as an operator would do it (same config file): save the live server state,
        ask the master to reload, wait until a new worker answers. Returns seconds taken."""
        started = time.monotonic()
        state = runtime_command(self.gateway.admin_address, "show servers state")
        Path(self.gateway.options["state_file"]).write_text(state)
        before = self.worker_pids()
        runtime_command(self.master_socket, "reload", patience_s=2.0)
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            try:
                current = self.current_worker()
                if current is not None and current not in before:
                    runtime_command(self.gateway.admin_address, "show info", timeout_s=0.5)
                    return time.monotonic() - started
            except AdapterError:
                pass
            time.sleep(0.01)
        raise RuntimeError(f"haproxy did not reload within {timeout_s:g} s: {self.log()}")

    def worker_pids(self) -> list[int]:
        """Current worker first, then old workers still finishing requests."""
        answer = runtime_command(self.master_socket, "show proc", patience_s=2.0)
        return [int(line.split()[0]) for line in answer.splitlines()
                if len(line.split()) > 1 and line.split()[1] == "worker"]

    def current_worker(self) -> int | None:
        pids = self.worker_pids()
        return pids[0] if pids else None

    def servers_state(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(backend, server) -> (admin state flags, weight), straight from the runtime API."""
        answer = runtime_command(self.gateway.admin_address, "show servers state")
        return {(r.backend, r.server): (r.admin_state, r.weight)
                for r in parse_servers_state(answer)}

    def log(self) -> str:
        if self._log is not None:
            self._log.flush()
        path = self.directory / "haproxy.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def kill(self) -> None:
        """A crash: SIGKILL to the master and its workers, nothing saved."""
        process.kill(self.proc, group=True)
        self._close_logs()

    def stop(self, timeout_s: float = 10.0) -> None:
        # SIGTERM: hard stop of master and workers (a test wants its port back now).
        process.stop(self.proc, timeout_s)
        self._close_logs()

    def _close_logs(self) -> None:
        for stream in (self._log, self._access_log):
            if stream is not None:
                stream.close()
        self._log = self._access_log = None
