"""Batch worker processes for tests: `python -m fleetctl.batch.worker` on the test database
with a short lease (BATCH_LEASE_S=2 unless given), killed or stopped by the test."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from tests.conftest import ROOT, _worker_env

LEASE_S = "2"


class WorkerProcess:
    def __init__(self, log_dir: Path, name: str, *, store: str | None = None,
                 lease_s: str = LEASE_S, poll_s: float = 0.2,
                 extra_env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}-{len(list(log_dir.glob(name + '*.log')))}.log"
        env = _worker_env(connection.settings_dict["NAME"])
        env.update({"BATCH_LEASE_S": lease_s, "BATCH_FILES_DIR": str(settings.BATCH_FILES_DIR),
                    "PYTHONUNBUFFERED": "1", **(extra_env or {})})
        argv = [sys.executable, "-m", "fleetctl.batch.worker", "--name", name,
                "--poll", str(poll_s)]
        if store:
            argv += ["--store", store]
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    @property
    def owner(self) -> str:
        return f"{self.name}:{self.proc.pid}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """kill -9, as a crash or an OOM kill would."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 20) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


@contextmanager
def worker_starter(log_dir: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """start(name, **options) -> WorkerProcess; every one started is stopped at the end."""
    started: list[WorkerProcess] = []

    def start(name: str = "w", **options: Any) -> WorkerProcess:
        worker = WorkerProcess(log_dir, name, **options)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()
