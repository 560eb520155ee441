"""Start and stop a real Prometheus (Debian's package) for tests, benchmarks and the demo: its
own directory, config, data and rule files, on a free port, never the system service.

`targets` are scrape jobs: each pool's `/metrics` (labelled `pool=<name>`, the label the
generated rules and dashboards select on) and each Envoy's admin `/stats/prometheus`.
`rule_files` are loaded at start and on `reload()` (the lifecycle API is on).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import yaml

from fleetctl.core.http import OutboundError, http_get, shared_client
from fleetctl.core.ports import free_port
from fleetctl.demo.readiness import wait_ready

PROMETHEUS_BIN = "/usr/bin/prometheus"
INSTALL_HINT = ("Prometheus is not installed: apt-get install prometheus (Debian's package "
                "provides /usr/bin/prometheus; its system service is not needed).")


def prometheus_binary(path: str = PROMETHEUS_BIN) -> str | None:
    """The binary's path when it is installed, else None."""
    found = shutil.which(path)
    return found


@dataclass
class ScrapeJob:
    name: str
    url: str  # the full metrics URL, e.g. http://127.0.0.1:9001/metrics
    labels: dict[str, str] = field(default_factory=dict)


class PrometheusProcess:
    """One Prometheus serving `http://127.0.0.1:<port>`."""

    def __init__(self, directory: Path, *, jobs: list[ScrapeJob] | None = None,
                 rule_files: list[Path] | None = None, port: int | None = None,
                 scrape_interval_s: float = 1.0, evaluation_interval_s: float = 1.0,
                 binary: str = PROMETHEUS_BIN) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.jobs = list(jobs or [])
        self.rule_files = list(rule_files or [])
        self.scrape_interval_s = scrape_interval_s
        self.evaluation_interval_s = evaluation_interval_s
        self.binary = binary
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.directory / "prometheus.yml"

    def write_config(self) -> None:
        scrape = []
        for job in self.jobs:
            parts = urlsplit(job.url)
            scrape.append({
                "job_name": job.name, "scheme": parts.scheme or "http",
                "metrics_path": parts.path or "/metrics",
                "static_configs": [{"targets": [parts.netloc], "labels": dict(job.labels)}],
            })
        config = {"global": {"scrape_interval": f"{self.scrape_interval_s:g}s",
                             "evaluation_interval": f"{self.evaluation_interval_s:g}s"},
                  "rule_files": [str(p) for p in self.rule_files],
                  "scrape_configs": scrape}
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def start(self, timeout_s: float = 30.0) -> PrometheusProcess:
        if prometheus_binary(self.binary) is None:
            raise RuntimeError(INSTALL_HINT)
        self.write_config()
        self._log = (self.directory / "prometheus.log").open("ab")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.config_path}",
             f"--storage.tsdb.path={self.directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
             "--storage.tsdb.retention.time=2h", "--log.level=warn"],
            stdout=self._log, stderr=self._log, start_new_session=True)
        wait_ready(self.proc, self._ready, what="prometheus", timeout_s=timeout_s,
                   log=self.log)
        return self

    def _ready(self) -> bool:
        try:
            return http_get(f"{self.url}/-/ready", timeout_s=1.0).status_code == 200
        except OutboundError:
            return False

    def reload(self) -> None:
        """Write the config again (jobs, rule files) and have Prometheus read it."""
        self.write_config()
        answer = shared_client().post(f"{self.url}/-/reload", timeout_s=10.0)
        if answer.status_code != 200:
            raise RuntimeError(f"prometheus reload: HTTP {answer.status_code}: {answer.text}")

    def log(self) -> str:
        path = self.directory / "prometheus.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
