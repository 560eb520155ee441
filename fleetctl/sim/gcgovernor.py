"""Keep the cyclic garbage collector away from scheduler deadlines.

With a few hundred open streams, CPython's automatic gen-1 collections take ~1 ms and
gen-2 ones several ms, at whatever moment allocation counts happen to trip them —
often right on a step deadline, which shows up as schedule lag. When installed (only by
`serve_async`, which owns its process), automatic collection is limited to the cheap
gen 0 and the engines ask `collect_if_quiet()` after each step's output is flushed,
when they know how long it is until the next deadline of any pool. A collection that is
long overdue runs anyway (and any lag it causes is measured like any other).
"""

from __future__ import annotations

import asyncio
import gc
import time

GEN0_THRESHOLD = 700
DUE_COUNT = 10  # like CPython's default thresholds for gen 1 and gen 2
OVERDUE_COUNT = 100
NEVER = 1_000_000_000
IDLE_CHECK_S = 0.25


class GcGovernor:
    def __init__(self) -> None:
        self.installed = False
        self._saved: tuple[int, int, int] | None = None
        self._deadlines: dict[int, float] = {}
        self._cost_s = {1: 0.001, 2: 0.005}  # running estimates, refreshed by measurement
        self._idle_task: asyncio.Task[None] | None = None
        self.collections = {1: 0, 2: 0}
        self.forced = 0  # collections that ran although a deadline was near
        self.max_pause_s = 0.0

    def install(self) -> None:
        if self.installed:
            return
        self._saved = gc.get_threshold()
        gc.set_threshold(GEN0_THRESHOLD, NEVER, NEVER)
        self.installed = True
        self._idle_task = asyncio.get_running_loop().create_task(self._idle_loop())

    def uninstall(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            self._idle_task = None
        if self._saved is not None:
            gc.set_threshold(*self._saved)
        self.installed = False

    def note_deadline(self, owner: int, deadline: float | None) -> None:
        if deadline is None:
            self._deadlines.pop(owner, None)
        else:
            self._deadlines[owner] = deadline

    def collect_if_quiet(self, now: float) -> None:
        if not self.installed:
            return
        slack = min(self._deadlines.values(), default=now + 1.0) - now
        _, gen1_count, gen2_count = gc.get_count()
        for generation, count in ((2, gen2_count), (1, gen1_count)):
            if count < DUE_COUNT:
                continue
            fits = slack > 2 * self._cost_s[generation]
            if fits or count >= OVERDUE_COUNT:
                self._collect(generation, forced=not fits)
                return

    def stats(self) -> dict[str, object]:
        return {
            "installed": self.installed,
            "collections_gen1": self.collections[1],
            "collections_gen2": self.collections[2],
            "forced": self.forced,
            "max_pause_ms": self.max_pause_s * 1000,
            "cost_estimate_ms": {str(g): c * 1000 for g, c in self._cost_s.items()},
        }

    def _collect(self, generation: int, *, forced: bool) -> None:
        started = time.perf_counter()
        gc.collect(generation)
        took = time.perf_counter() - started
        self.collections[generation] += 1
        self.forced += forced
        self.max_pause_s = max(self.max_pause_s, took)
        # Move quickly towards a slower collection, slowly towards a faster one.
        old = self._cost_s[generation]
        self._cost_s[generation] = max(took, 0.8 * old + 0.2 * took)

    async def _idle_loop(self) -> None:
        """When every pool is idle nobody asks; collect on a slow timer instead."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(IDLE_CHECK_S)
            self.collect_if_quiet(loop.time())


GOVERNOR = GcGovernor()
