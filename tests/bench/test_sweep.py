"""The concurrency search on synthetic verdict functions (no server, no timing)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from fleetctl.bench.sweep import SweepResult, run_levels, search


@dataclass(frozen=True)
class V:
    outcome: str


def measured_by(judge: Callable[[int], str]) -> Callable[[int], Awaitable[V]]:
    async def measure(concurrency: int) -> V:
        return V(judge(concurrency))
    return measure


def sweep(judge: Callable[[int], str], max_concurrency: int = 512,
          start: int = 1) -> SweepResult[V]:
    return asyncio.run(search(measured_by(judge), max_concurrency=max_concurrency, start=start))


def levels(result: SweepResult[V]) -> list[tuple[int, str, str]]:
    return [(s.concurrency, s.phase, s.outcome) for s in result.steps]


def test_a_monotonic_boundary_is_found_by_bracketing_then_bisecting() -> None:
    result = sweep(lambda c: "pass" if c <= 37 else "fail")
    assert result.best == 37 and result.first_fail == 38 and not result.client_bound
    assert [c for c, phase, _ in levels(result) if phase == "bracket"] == [1, 2, 4, 8, 16, 32, 64]
    assert [c for c, phase, _ in levels(result) if phase == "bisect"] == [48, 40, 36, 38, 37]
    assert levels(result)[-1] == (37, "retest", "pass")
    assert result.best_verdict == V("pass")


def test_the_bracket_stops_at_the_maximum_when_everything_passes() -> None:
    result = sweep(lambda c: "pass", max_concurrency=100)
    assert [c for c, _, _ in levels(result)] == [1, 2, 4, 8, 16, 32, 64, 100, 100]
    assert result.best == 100 and result.first_fail is None


def test_nothing_passes() -> None:
    result = sweep(lambda c: "fail")
    assert result.best is None and levels(result) == [(1, "bracket", "fail")]
    assert "no level passed" in result.note


def test_a_noisy_boundary_ends_on_a_level_that_passed_twice() -> None:
    rng = random.Random(3)

    def noisy(c: int) -> str:  # sure below 34, sure above 40, a coin in between
        return "pass" if c < 34 or (c <= 40 and rng.random() < 0.5) else "fail"

    for _ in range(20):
        result = sweep(noisy)
        assert result.best is not None and 33 <= result.best <= 40
        outcomes = [o for c, _, o in levels(result) if c == result.best]
        assert outcomes.count("pass") >= 2 and "fail" not in outcomes


def test_a_retest_that_fails_steps_down() -> None:
    seen: dict[int, int] = {}

    def flaky_at_37(c: int) -> str:
        seen[c] = seen.get(c, 0) + 1
        return "pass" if c < 37 or (c == 37 and seen[c] == 1) else "fail"

    result = sweep(flaky_at_37)
    assert result.best == 36
    assert levels(result)[-3:] == [(37, "bisect", "pass"), (37, "retest", "fail"),
                                   (36, "retest", "pass")]


def test_an_invalid_level_is_neither_pass_nor_fail_and_stops_the_climb() -> None:
    # The server would pass up to 300, but this client cannot drive more than 100 streams.
    result = sweep(lambda c: "invalid" if c > 100 else "pass")
    assert result.client_bound and result.first_fail is None
    assert result.best == 100 and result.invalid_levels == [101, 102, 104, 112, 128]
    assert max(c for c, _, _ in levels(result)) == 128  # nothing above the first invalid
    assert "client was the bottleneck" in result.note


def test_insufficient_bounds_the_search_like_a_fail() -> None:
    result = sweep(lambda c: "pass" if c <= 10 else "insufficient")
    assert result.best == 10 and result.first_fail == 11


def test_an_explicit_list_is_measured_in_order_and_stops_after_an_invalid() -> None:
    judge = {1: "pass", 4: "pass", 16: "fail", 64: "invalid"}
    result = asyncio.run(run_levels(measured_by(lambda c: judge[c]), [64, 1, 16, 4, 256]))
    assert [c for c, _, _ in levels(result)] == [1, 4, 16, 64]
    assert result.best == 4 and result.skipped == [256] and result.client_bound


def test_search_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        sweep(lambda c: "pass", start=0)
    with pytest.raises(ValueError):
        asyncio.run(run_levels(measured_by(lambda c: "pass"), []))
