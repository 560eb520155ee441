"""Histogram properties against exact numpy quantiles, and the Prometheus conversion."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.inference.confidence import ConfidenceInputError, quantile_rank_interval
from fleetctl.telemetry import histogram as H

durations = st.lists(st.floats(min_value=1.0, max_value=3_000_000.0, allow_nan=False),
                     min_size=1, max_size=300)
histograms = durations.map(lambda values: _of(values))


def _of(values: list[float]) -> dict[str, int]:
    h: dict[str, int] = {}
    for value in values:
        H.add(h, value)
    return h


def test_buckets_are_log_spaced_and_capped() -> None:
    assert H.bucket_of(0.2) == 0 and H.bucket_of(-5) == 0 and H.bucket_of(math.nan) == 0
    assert H.bucket_of(1.0) == 0 and H.bucket_of(2.0) == 8 and H.bucket_of(1000.0) == 79
    assert H.bucket_of(1e12) == H.MAX_BUCKET and H.bucket_of(math.inf) == H.MAX_BUCKET
    for i in (0, 10, 80, 150):
        assert H.lower_edge(i) <= H.value_of(i) < H.upper_edge(i)
        assert H.bucket_of(H.value_of(i)) == i
    assert H.RELATIVE_ERROR < 0.0443


@given(histograms, histograms, histograms)
def test_merge_is_associative_and_commutative(a: dict[str, int], b: dict[str, int],
                                              c: dict[str, int]) -> None:
    assert H.merge(a, b) == H.merge(b, a)
    assert H.merge(H.merge(a, b), c) == H.merge(a, H.merge(b, c))
    assert H.count(H.merge(a, b)) == H.count(a) + H.count(b)


@settings(max_examples=200, deadline=None)
@given(durations, st.sampled_from([0.0, 0.01, 0.5, 0.9, 0.95, 0.99, 1.0]))
def test_quantile_within_bucket_error_of_exact(values: list[float], q: float) -> None:
    exact = float(np.quantile(np.array(values), q))
    estimate = H.quantile(_of(values), q)
    assert estimate is not None
    assert abs(estimate - exact) <= exact * H.RELATIVE_ERROR + 1e-9


@settings(max_examples=200, deadline=None)
@given(durations, st.sampled_from([0.5, 0.95, 0.99]), st.sampled_from([0.9, 0.99]))
def test_quantile_interval_contains_the_exact_sample_quantile(
        values: list[float], q: float, confidence: float) -> None:
    exact = float(np.quantile(np.array(values), q))
    bounds = H.quantile_interval(_of(values), q, confidence)
    assert bounds is not None
    low, high = bounds
    assert low <= exact <= high


def test_quantile_interval_covers_the_true_quantile_at_about_its_confidence() -> None:
    # Lognormal latencies, true p95 known: the 90 % interval should miss about 10 % of the
    # time (bucket edges only widen it). 400 trials: the miss rate stays well under 20 %.
    rng = np.random.default_rng(7)
    true_p95 = float(np.exp(5.0 + 1.0 * 1.6448536))
    misses = 0
    for _ in range(400):
        bounds = H.quantile_interval(_of(list(rng.lognormal(5.0, 1.0, 200))), 0.95, 0.90)
        assert bounds is not None
        misses += not bounds[0] <= true_p95 <= bounds[1]
    assert misses < 80


def test_empty_histogram_has_no_quantile() -> None:
    assert H.quantile({}, 0.5) is None and H.quantile_interval({}, 0.5) is None
    with pytest.raises(ValueError):
        H.quantile({"1": 1}, 1.5)


def test_rank_interval_brackets_the_rank_and_validates() -> None:
    lo, hi = quantile_rank_interval(100, 0.95, 0.99)
    assert 0 <= lo <= 94 and 95 <= hi <= 99
    assert quantile_rank_interval(1, 0.5, 0.99) == (0, 0)
    lo50, hi50 = quantile_rank_interval(1000, 0.5, 0.95)
    assert lo50 < 499 < hi50 and hi50 - lo50 < 80
    for bad in ({"n": 0, "q": 0.5}, {"n": 10, "q": 1.5}, {"n": 10, "q": 0.5, "confidence": 1}):
        with pytest.raises(ConfidenceInputError):
            quantile_rank_interval(**bad)  # type: ignore[arg-type]


def test_from_cumulative_spreads_each_bucket_and_keeps_the_total() -> None:
    current = [(0.1, 5.0), (0.5, 15.0), (1.0, 20.0), ("+Inf", 21.0)]
    h = H.from_cumulative(current)  # type: ignore[arg-type]
    assert H.count(h) == 21
    # Each Prometheus bucket's samples stay inside its bounds (in ms).
    assert all(int(i) <= H.bucket_of(1000.0) for i in h)
    assert sum(n for i, n in h.items() if int(i) <= H.bucket_of(100.0)) == 5
    # The +Inf sample sits at the highest finite bound, as histogram_quantile puts it.
    assert h[str(H.bucket_of(1000.0))] >= 1


def test_from_cumulative_delta_and_counter_reset() -> None:
    before = [(0.1, 5.0), (0.5, 15.0), ("+Inf", 15.0)]
    after = [(0.1, 6.0), (0.5, 25.0), ("+Inf", 25.0)]
    delta = H.from_cumulative(after, before)  # type: ignore[arg-type]
    assert H.count(delta) == 10
    assert sum(n for i, n in delta.items() if int(i) <= H.bucket_of(100.0)) == 1
    # The server restarted: its counts fell, so they are all new.
    restarted = [(0.1, 1.0), (0.5, 3.0), ("+Inf", 3.0)]
    assert H.count(H.from_cumulative(restarted, after)) == 3  # type: ignore[arg-type]
    assert H.from_cumulative(after, after) == {}  # type: ignore[arg-type]
