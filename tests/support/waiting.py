"""Waiting in tests: one helper for "until this holds", one for "this stays so".

    wait_until(lambda: job_state(job) == "completed", timeout_s=30, what="the job to complete",
               explain=worker.log)
    observe_for(0.5, lambda: sink.copies == [], what="no copy to arrive")

No test synchronises on a fixed sleep: it waits for what the sleep stood for (an answer, a
row, a log line), which costs nothing once it is there and gives a loaded machine all the
time it needs. Only a negative check ("nothing more is sent") needs a window of time, and
it says so by calling `observe_for`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, timeout_s: float = 20, every_s: float = 0.05,
               what: str = "condition", explain: Callable[[], str] | None = None) -> T:
    """Call `predicate` every `every_s` until it returns something truthy, and return that.

    It is called at least once (so `timeout_s=0` is one look) and once more at the deadline,
    so a slow last call does not turn into a timeout. On timeout: AssertionError("timed out
    after N s waiting for <what>"), followed by `explain()` when given (the state that did
    not come about: a ramp's timeline, a process's log). An exception the predicate raises
    (a process that exited, an assertion of its own) ends the wait at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(every_s, left))
    message = f"timed out after {timeout_s:g} s waiting for {what}"
    if explain is not None:
        message += f"\n{explain()}"
    raise AssertionError(message)


def observe_for(seconds: float, holds: Callable[[], Any], *, every_s: float = 0.05,
                what: str = "condition") -> None:
    """A negative check: `holds()` stays truthy for `seconds` (checked every `every_s` and at
    the end); AssertionError as soon as it does not. Use it only where no later event can
    show that the thing did not happen (prefer waiting for one that would come after it)."""
    deadline = time.monotonic() + seconds
    while True:
        if not holds():
            raise AssertionError(f"{what} did not hold during {seconds:g} s")
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(every_s, left))
