"""Waiting for a process the demo, a test or a benchmark started to answer."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable


def wait_ready(proc: subprocess.Popen[bytes], ready: Callable[[], bool], *, what: str,
               timeout_s: float, log: Callable[[], str], pause_s: float = 0.02) -> None:
    """Until `ready()` is true (it handles its own connection errors as not ready yet);
    RuntimeError with the process's log if it exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log()}")
        if ready():
            return
        time.sleep(pause_s)
    raise RuntimeError(f"{what} did not answer within {timeout_s:g} s:\n{log()}")
