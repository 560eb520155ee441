"""The concurrency search: the highest level that meets the SLO.

Pure logic over an async `measure(concurrency) -> verdict` (anything with an `outcome` of
"pass" | "fail" | "insufficient" | "invalid"); it returns every level it measured, in order.

`search`:
1. **Bracket**: start, 2×start, 4×start, … (the last step clamped to `max_concurrency`) until a
   level does not pass.
2. **Bisect** between the highest pass and the lowest non-pass until they are `resolution`
   apart (1 = exact).
3. **Re-test** the best passing level once. A level that passes once and fails once does not
   pass: the search then steps down (the new upper bound is that level, the lower bound the
   highest pass below it), bisects again and re-tests again, until a level passes twice.

"insufficient" is not a pass: it bounds the search from above like a fail (a level that
cannot finish its samples in time is not usable), and is reported as such. "invalid" (the
client was the bottleneck) is neither pass nor fail: it also bounds the search from above —
nothing above it can be measured by this client — and the result says `client_bound=True`:
the server might sustain more than `best`; add client processes to find out.

`run_levels` measures an explicit list instead (ascending; levels above an invalid one are
skipped for the same reason).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class HasOutcome(Protocol):
    @property
    def outcome(self) -> str: ...


V = TypeVar("V", bound=HasOutcome)
Measure = Callable[[int], Awaitable[V]]


@dataclass(frozen=True, slots=True)
class Step(Generic[V]):
    concurrency: int
    phase: str  # "bracket" | "bisect" | "retest" | "list"
    verdict: V

    @property
    def outcome(self) -> str:
        return self.verdict.outcome


@dataclass(slots=True)
class SweepResult(Generic[V]):
    steps: list[Step[V]] = field(default_factory=list)
    best: int | None = None  # highest level that passed (twice, when re-tested)
    first_fail: int | None = None  # lowest level that failed or was insufficient
    client_bound: bool = False  # an invalid level capped the search
    skipped: list[int] = field(default_factory=list)  # explicit levels not measured

    @property
    def best_verdict(self) -> V | None:
        """The latest passing verdict of the best level (its throughput is the result's)."""
        for step in reversed(self.steps):
            if step.concurrency == self.best and step.outcome == "pass":
                return step.verdict
        return None

    @property
    def invalid_levels(self) -> list[int]:
        return sorted({s.concurrency for s in self.steps if s.outcome == "invalid"})

    @property
    def note(self) -> str:
        parts = []
        if self.best is None:
            parts.append("no level passed")
        else:
            parts.append(f"highest passing concurrency {self.best}")
        if self.first_fail is not None:
            parts.append(f"lowest failing {self.first_fail}")
        if self.client_bound:
            parts.append(f"client was the bottleneck at {self.invalid_levels}: "
                         "the server may sustain more; add client processes")
        return "; ".join(parts)


class _Search(Generic[V]):
    def __init__(self, measure: Measure[V]) -> None:
        self.measure = measure
        self.result: SweepResult[V] = SweepResult()
        self.outcomes: dict[int, list[str]] = {}

    async def at(self, concurrency: int, phase: str) -> str:
        verdict = await self.measure(concurrency)
        self.result.steps.append(Step(concurrency, phase, verdict))
        outcome = verdict.outcome
        self.outcomes.setdefault(concurrency, []).append(outcome)
        if outcome == "invalid":
            self.result.client_bound = True
        elif outcome != "pass":
            ff = self.result.first_fail
            self.result.first_fail = concurrency if ff is None else min(ff, concurrency)
        return outcome

    def passes(self, concurrency: int) -> bool:
        """Every measurement of this level passed."""
        seen = self.outcomes.get(concurrency, [])
        return bool(seen) and all(o == "pass" for o in seen)


async def search(measure: Measure[V], *, max_concurrency: int, start: int = 1,
                 resolution: int = 1, retest: bool = True) -> SweepResult[V]:
    """Highest concurrency in [start, max_concurrency] whose verdict is "pass" (see module doc)."""
    if not 1 <= start <= max_concurrency:
        raise ValueError("need 1 <= start <= max_concurrency")
    if resolution < 1:
        raise ValueError("resolution must be >= 1")
    s: _Search[V] = _Search(measure)
    lo, hi = 0, max_concurrency + 1  # lo passes (0 = none yet), hi does not (or is beyond max)
    level = start
    while True:  # bracket
        if await s.at(level, "bracket") != "pass":
            hi = level
            break
        lo = level
        if level >= max_concurrency:
            break
        level = min(level * 2, max_concurrency)
    while True:
        lo = await _bisect(s, lo, hi, resolution)
        if lo == 0 or not retest:
            break
        if await s.at(lo, "retest") == "pass":
            break
        hi = lo  # passed once, failed once: not a pass; step down
        lo = max((c for c in s.outcomes if c < hi and s.passes(c)), default=0)
    s.result.best = lo or None
    return s.result


async def _bisect(s: _Search[V], lo: int, hi: int, resolution: int) -> int:
    while hi - lo > resolution:
        mid = (lo + hi) // 2  # >= 1: hi - lo >= 2
        if await s.at(mid, "bisect") == "pass":
            lo = mid
        else:
            hi = mid
    return lo


async def run_levels(measure: Measure[V], levels: Iterable[int]) -> SweepResult[V]:
    """Measure an explicit list of levels in ascending order; stop raising after an invalid."""
    s: _Search[V] = _Search(measure)
    ordered = sorted(set(levels))
    if not ordered or ordered[0] < 1:
        raise ValueError("levels must be a non-empty list of integers >= 1")
    for i, level in enumerate(ordered):
        if await s.at(level, "list") == "invalid":
            s.result.skipped = ordered[i + 1:]
            break
    passing = [c for c in s.outcomes if s.passes(c)]
    s.result.best = max(passing, default=None)
    return s.result
