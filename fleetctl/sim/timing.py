"""Waking the scheduler at an absolute deadline with sub-millisecond precision.

asyncio can only wait in whole milliseconds (it rounds epoll timeouts up), and this kind
of VM wakes a sleeper ~0.2 ms late: a plain `asyncio.sleep` to a deadline lags ~1 ms on
average and ~2 ms at p99 with nothing else running. So the scheduler

1. sleeps until a margin before the deadline — on Linux through a `timerfd` armed with
   the absolute CLOCK_MONOTONIC deadline (the clock of `loop.time()`) and registered with
   the event loop, which wakes with ~0.2 ms latency; elsewhere through `asyncio.sleep`,
   with a wider margin;
2. then yields to the loop (`sleep(0)`, which keeps serving I/O) until the deadline.

The margin is the CPU price of precision: ~0.4 ms of cooperative spinning per step with a
timerfd, ~1.5 ms without. (`os.timerfd_create` only exists from Python 3.13, hence ctypes.)
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os

TIMERFD_MARGIN_S = 0.0004
SLEEP_MARGIN_S = 0.0015
_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create  # noqa: B018 - probe: absent on non-Linux systems
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


class DeadlineTimer:
    """One per scheduler loop. `await wait_until(t)` returns at or shortly after `t`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fd = -1
        self._waiter: asyncio.Future[None] | None = None
        self._libc = _libc()
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                loop.add_reader(fd, self._on_fire)
        self.margin_s = TIMERFD_MARGIN_S if self._fd >= 0 else SLEEP_MARGIN_S

    @property
    def precise(self) -> bool:
        return self._fd >= 0

    async def wait_until(self, deadline: float) -> None:
        if self._fd < 0 or not self._arm(deadline):
            await asyncio.sleep(max(0.0, deadline - self._loop.time()))
            return
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _arm(self, deadline: float) -> bool:
        seconds = int(deadline)
        nanos = int((deadline - seconds) * 1e9)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(seconds, max(1, nanos)))
        assert self._libc is not None
        return self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec),
                                          None) == 0

    def _on_fire(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


async def sleep_until(loop: asyncio.AbstractEventLoop, timer: DeadlineTimer,
                      deadline: float) -> None:
    """Wake as close to `deadline` (loop.time()) as the loop allows, without blocking it."""
    early = deadline - timer.margin_s
    if early > loop.time():
        await timer.wait_until(early)
    while loop.time() < deadline:
        await asyncio.sleep(0)
