"""Percentiles from raw samples, exact merges, SLO verdicts and the cost arithmetic."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pytest

from fleetctl.bench.stats import (
    LevelSamples,
    LevelSummary,
    Slo,
    cost_per_1m,
    merge,
    percentile,
    percentiles,
    summarize,
    verdict,
)


@dataclass
class S:
    """A request sample as stats reads it."""

    ttft_s: float | None = 0.1
    tpot_s: float | None = 0.02
    e2e_s: float = 1.0
    itl_s: Sequence[float] = field(default_factory=lambda: [0.02, 0.02])
    status: str = "ok"
    warmup: bool = False
    output_tokens: int = 50
    window_tokens: float = 50.0
    schedule_lag_s: float = 0.0001
    tokens_source: str = "usage"


def random_samples(n: int, seed: int = 7) -> list[S]:
    rng = random.Random(seed)
    status = ["ok"] * 18 + ["error", "timeout"]
    return [S(ttft_s=rng.lognormvariate(-2, 0.5), tpot_s=rng.uniform(0.01, 0.05),
              e2e_s=rng.uniform(0.5, 3), itl_s=[rng.uniform(0.005, 0.06) for _ in range(5)],
              status=rng.choice(status), warmup=rng.random() < 0.1,
              window_tokens=rng.uniform(0, 100), schedule_lag_s=rng.uniform(0, 0.002))
            for _ in range(n)]


def test_percentiles_are_nearest_rank_observed_values() -> None:
    values = [15.0, 20, 35, 40, 50]
    assert percentiles(values, (5, 30, 40, 50, 100)) == [15, 20, 20, 35, 50]
    assert percentile(range(1, 101), 95) == 95
    assert percentile(range(1, 101), 99) == 99
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile([1.0], 101)


def test_a_summary_counts_errors_and_timeouts_in_the_error_rate_and_skips_warm_up() -> None:
    samples = [S(), S(), S(status="error", ttft_s=None), S(status="timeout"),
               S(warmup=True, ttft_s=9.0)]
    summary = summarize(LevelSamples.of(samples, window_s=2.0, client_cpu_s=0.5, wall_s=4.0))
    assert (summary.n_ok, summary.n_errors, summary.n_timeouts, summary.n_warmup) == (2, 1, 1, 1)
    assert summary.error_rate == 0.5
    assert summary.ttft_p99_s == 0.1  # the warm-up's 9 s and failures left out
    assert summary.output_tokens_per_s == 5 * 50 / 2.0  # window tokens of every request
    assert summary.request_rate_per_s == 4 / 2.0
    assert summary.client_cpu_share == 0.125


def test_merging_two_halves_gives_exactly_the_summary_of_all_samples() -> None:
    samples = random_samples(401)
    lags = [random.Random(1).uniform(0, 0.003) for _ in range(300)]
    whole = LevelSamples.of(samples, window_s=10.0, client_cpu_s=2.0, wall_s=12.0,
                            loop_lag_s=lags)
    halves = [LevelSamples.of(samples[:150], window_s=10.0, client_cpu_s=2.0, wall_s=12.0,
                              loop_lag_s=lags[:100]),
              LevelSamples.of(samples[150:], window_s=10.0, client_cpu_s=2.0, wall_s=12.0,
                              loop_lag_s=lags[100:])]
    merged, all_at_once = summarize(merge(halves)), summarize(whole)
    assert merged == replace(all_at_once, output_tokens_per_s=merged.output_tokens_per_s,
                             request_rate_per_s=merged.request_rate_per_s)
    assert merged.output_tokens_per_s == pytest.approx(all_at_once.output_tokens_per_s)
    assert merged.request_rate_per_s == pytest.approx(all_at_once.request_rate_per_s)
    ok_ttft = sorted(s.ttft_s for s in samples
                     if s.status == "ok" and not s.warmup and s.ttft_s is not None)
    assert merged.ttft_p95_s == ok_ttft[-(-95 * len(ok_ttft) // 100) - 1]


def test_two_client_processes_add_their_rates_and_the_busiest_sets_the_cpu_share() -> None:
    a = LevelSamples.of([S(window_tokens=100)] * 4, window_s=10.0, client_cpu_s=1, wall_s=10)
    b = LevelSamples.of([S(window_tokens=100)] * 6, window_s=12.0, client_cpu_s=6, wall_s=12)
    summary = summarize(merge([a, b]))
    assert summary.output_tokens_per_s == pytest.approx(400 / 10 + 600 / 12)
    assert summary.request_rate_per_s == pytest.approx(4 / 10 + 6 / 12)
    assert summary.client_cpu_share == 0.5


# ---- verdicts ---------------------------------------------------------------------------------

SLO = Slo(ttft_p95_s=0.5, tpot_p95_s=0.05, error_rate=0.01)


def level(n: int = 100, **changes: Any) -> LevelSummary:
    summary = summarize(LevelSamples.of([S(ttft_s=0.2, tpot_s=0.03)] * n, window_s=10.0,
                                        client_cpu_s=1.0, wall_s=10.0, loop_lag_s=[0.001]))
    return replace(summary, **changes)


def judge(summary: LevelSummary) -> tuple[str, str]:
    v = verdict(summary, SLO, min_samples=50, lag_limit_s=0.01, cpu_limit=0.8)
    return v.outcome, v.binding


def test_a_level_within_every_slo_term_passes_and_names_the_closest_term() -> None:
    v = verdict(level(), SLO, min_samples=50)
    assert (v.outcome, v.binding) == ("pass", "tpot_p95") and v.ratio == pytest.approx(0.6)
    assert v.ratios == pytest.approx({"ttft_p95": 0.4, "tpot_p95": 0.6, "error_rate": 0.0})


@pytest.mark.parametrize(("changes", "binding"), [
    ({"ttft_p95_s": 0.6}, "ttft_p95"),
    ({"tpot_p95_s": 0.051}, "tpot_p95"),
    ({"error_rate": 0.02}, "error_rate"),
])
def test_a_level_over_any_slo_term_fails_on_that_term(changes: dict[str, Any],
                                                      binding: str) -> None:
    assert judge(level(**changes)) == ("fail", binding)


def test_a_level_with_too_few_samples_is_insufficient_not_a_pass() -> None:
    assert judge(level(n=49)) == ("insufficient", "samples")


def test_a_level_where_every_request_failed_fails_even_if_the_client_looks_busy() -> None:
    down = level(n_ok=0, n_errors=100, error_rate=1.0, client_cpu_share=0.95)
    assert judge(down) == ("fail", "error_rate")


def test_a_level_where_the_client_was_the_bottleneck_is_invalid() -> None:
    assert judge(level(loop_lag_p99_s=0.02)) == ("invalid", "client_schedule_lag")
    assert judge(level(schedule_lag_p99_s=0.02)) == ("invalid", "client_schedule_lag")
    assert judge(level(client_cpu_share=0.95)) == ("invalid", "client_cpu")
    assert judge(level(n=3, client_cpu_share=0.95))[0] == "invalid"  # before insufficient


def test_an_slo_of_zero_errors_fails_on_the_first_error() -> None:
    strict = Slo(ttft_p95_s=0.5, tpot_p95_s=0.05, error_rate=0.0)
    assert verdict(level(error_rate=0.001), strict, min_samples=1).outcome == "fail"
    assert verdict(level(), strict, min_samples=1).outcome == "pass"


def test_slo_values_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="SLO"):
        Slo(ttft_p95_s=0, tpot_p95_s=0.05, error_rate=0.01)
    with pytest.raises(ValueError, match="SLO"):
        Slo(ttft_p95_s=1, tpot_p95_s=0.05, error_rate=1.5)


# ---- cost ---------------------------------------------------------------------------------------


def test_cost_per_million_output_tokens() -> None:
    assert cost_per_1m("39.80", 1000) == Decimal("11.0556")  # 39.80 / 1000 × 1e6 / 3600
    assert cost_per_1m(Decimal("32.00"), "2500.5") == Decimal("3.5548")
    assert cost_per_1m(0.1, 0.3, places=6) == Decimal("92.592593")  # floats via repr, not binary
    assert cost_per_1m(0, 100) == Decimal("0.0000")


def test_cost_needs_a_positive_throughput() -> None:
    with pytest.raises(ValueError, match="tokens per second"):
        cost_per_1m("10", 0)
    with pytest.raises(ValueError, match="hourly rate"):
        cost_per_1m("-1", 10)
