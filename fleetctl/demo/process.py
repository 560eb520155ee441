"""What the local gateway processes (Envoy, HAProxy, nginx) share: asking whether one answers
yet, stopping one and killing one."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from typing import TypeVar

Answer = TypeVar("Answer")


def answers(ask: Callable[[], Answer], good: Callable[[Answer], bool],
            refused: type[Exception] | tuple[type[Exception], ...]) -> Callable[[], bool]:
    """A readiness check for wait_ready: `ask()` answered without raising `refused`, and the
    answer is `good`."""
    def ready() -> bool:
        try:
            answer = ask()
        except refused:
            return False
        return good(answer)

    return ready


def kill(proc: subprocess.Popen[bytes] | None, *, group: bool = False) -> None:
    """SIGKILL (to the whole process group with `group`) and wait, if it still runs."""
    if proc is not None and proc.poll() is None:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait()


def stop(proc: subprocess.Popen[bytes] | None, timeout_s: float, *,
         signum: int = signal.SIGTERM, group: bool = False) -> int | None:
    """`signum` to a process that still runs, then kill() if it lingers past `timeout_s`.
    Its exit status (None: never started)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signum)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill(proc, group=group)
    return proc.returncode
