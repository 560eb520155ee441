"""The one starter of the tests' Celery worker processes (the session's worker in
tests/conftest.py, the ramp world's in tests/ramps/e2e.py, the evals resume test's): threads,
as the demo's, no gossip or mingle, returned once it answers a ping of its own."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def start_celery_worker(env: dict[str, str], log: Path, *, node: str, queues: Iterable[str],
                        concurrency: int, timeout_s: float = 120) -> subprocess.Popen[bytes]:
    """`celery -A fleetctl worker` named `node` ("name@%h") on `queues`, logging to `log`
    (appended to). A generous limit: starting Celery (and importing Django) can take many
    seconds on a loaded 2-core machine, and waiting costs nothing once it answers. A worker
    that exits first fails at once; one that never answers is killed."""
    from fleetctl.celery import app

    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "fleetctl", "worker", "-Q", ",".join(queues),
             "-c", str(concurrency), "--pool", "threads", "-l", "INFO", "--without-gossip",
             "--without-mingle", "-n", node],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    name = node.replace("%h", socket.gethostname())

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"Celery worker {name} exited with {proc.returncode}; see {log}")
        # The ping itself waits up to 0.5 s for an answer: no pause between two.
        return bool(app.control.ping(destination=[name], timeout=0.5))

    try:
        wait_until(answers, timeout_s=timeout_s, every_s=0,
                   what=f"Celery worker {name} to answer a ping; see {log}")
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    return proc
