"""The guard on its own: figures in, a decision with its reasons out. No database."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.ramps import guard
from fleetctl.ramps.guard import Thresholds
from tests.ramps.poolstats import NOW, stats

# The SLO far away, so only the comparison with the primary is at stake.
LOOSE = Thresholds(slo_ttft_p95_ms=1e9, slo_tpot_p95_ms=1e9, slo_error_rate=0.5,
                   latency_margin_pct=10)


def judge(candidate, primary=None, thresholds=LOOSE, min_samples=50, stale_after_s=30.0):
    return guard.judge(candidate=candidate, primary=primary, thresholds=thresholds,
                       min_samples=min_samples, now=NOW, stale_after_s=stale_after_s)


def lognormal(seed: int, n: int, median: float, sigma: float) -> list[float]:
    return list(np.random.default_rng(seed).lognormal(np.log(median), sigma, n))


def test_waits_on_too_few_requests_and_says_how_many():
    result = judge(stats("cand", ttft=[100.0] * 49), stats("prim", ttft=[100.0] * 500))
    assert result.decision == "wait"
    assert "answered 49 of the 50 requests" in result.reasons[0]


def test_a_pool_whose_every_request_fell_over_is_judged_failing_not_waited_on():
    """A context tier's fallback answers the clients from another pool; the chosen pool
    failed every one of them before its first byte (telemetry's fell_over), so it has no
    answers of its own. The guard judges it on those failures rather than waiting for
    answers that will never come."""
    judged = judge(stats("cand", requests=0, fell_over=60), stats("prim", ttft=[20.0] * 60))
    assert judged.decision == "fail", judged.reasons
    assert "error rate" in " ".join(judged.reasons)
    # Without the fallen-over requests it would only wait (it answered none).
    assert judge(stats("cand", requests=0), stats("prim", ttft=[20.0] * 60)).decision == "wait"


def test_waits_on_stale_telemetry_even_with_samples():
    old = NOW - timedelta(seconds=31)
    result = judge(stats("cand", ttft=[100.0] * 200, last_data_at=old),
                   stats("prim", ttft=[100.0] * 500, last_data_at=old))
    assert result.decision == "wait"
    assert "is the ingester running?" in result.reasons[0]
    assert f"{old:%Y-%m-%d %H:%M:%S}" in result.reasons[0]


def test_waits_with_no_data_at_all():
    result = judge(stats("cand"), stats("prim"))
    assert result.decision == "wait"
    assert "No telemetry" in result.reasons[0]


def test_waits_for_streamed_answers_before_judging_ttft():
    result = judge(stats("cand", ttft=[100.0] * 10, requests=300),
                   stats("prim", ttft=[100.0] * 500))
    assert result.decision == "wait"
    assert "streamed 10 of the 50" in result.reasons[0]


def test_no_streaming_judges_the_rest_and_says_ttft_was_not():
    result = judge(stats("cand", requests=300), stats("prim", requests=3000))
    assert result.decision == "pass"
    assert any("TTFT not judged" in r for r in result.reasons)


def test_a_route_whose_callers_never_stream_is_guarded_on_whole_answers():
    """No streamed answer, so no TTFT: with the plan's whole-answer SLO the guard judges the
    gateway's request durations instead (and says so); without one it cannot."""
    slo = Thresholds(slo_ttft_p95_ms=200, slo_tpot_p95_ms=100, slo_error_rate=0.05,
                     latency_margin_pct=10, slo_e2e_p95_ms=1500)
    slow = judge(stats("cand", requests=300, duration=lognormal(2, 300, 2500, 0.1)), None,
                 thresholds=slo)
    assert slow.decision == "fail"
    assert slow.reasons[0].startswith("cand whole-answer p95 is ")
    assert "even its lower bound is over the SLO 1500 ms" in slow.reasons[0]
    fine = judge(stats("cand", requests=300, duration=lognormal(3, 300, 900, 0.1)), None,
                 thresholds=slo)
    assert fine.decision == "pass"
    assert "whole-answer p95" in fine.reasons[0] and "(SLO 1500 ms)" in fine.reasons[0]
    assert any(r.endswith("whole answers are judged instead.") for r in fine.reasons)
    unguarded = judge(stats("cand", requests=300, duration=lognormal(2, 300, 2500, 0.1)),
                      None, thresholds=Thresholds(**{**slo.as_dict(), "slo_e2e_p95_ms": None}))
    assert unguarded.decision == "pass"  # nothing states a whole-answer SLO
    assert slo.as_dict()["slo_e2e_p95_ms"] == 1500


def test_fails_when_the_lower_bound_is_over_the_ttft_slo():
    slo = Thresholds(slo_ttft_p95_ms=200, slo_tpot_p95_ms=100, slo_error_rate=0.05,
                     latency_margin_pct=10)
    result = judge(stats("cand", ttft=lognormal(1, 200, 400, 0.1)), None, thresholds=slo)
    assert result.decision == "fail"
    assert "even its lower bound is over the SLO 200 ms" in result.reasons[0]


def test_warns_when_the_estimate_is_over_the_slo_but_its_bound_is_not():
    slo = Thresholds(slo_ttft_p95_ms=200, slo_tpot_p95_ms=100, slo_error_rate=0.05,
                     latency_margin_pct=10)
    # 52 samples: the p95 is the slowest few (250 ms), its lower bound the fast bulk.
    samples = [100.0] * 48 + [250.0] * 4
    result = judge(stats("cand", ttft=samples), None, thresholds=slo)
    assert result.decision == "warn"
    assert "but its lower bound is not" in result.reasons[0]


def test_error_rate_bound_fails_and_estimate_warns():
    slo = Thresholds(slo_ttft_p95_ms=60_000, slo_tpot_p95_ms=10_000, slo_error_rate=0.01,
                     latency_margin_pct=10)
    failing = judge(stats("cand", ttft=[100.0] * 400, errors=40), None, thresholds=slo)
    assert failing.decision == "fail" and "error rate" in failing.reasons[0]
    leaning = judge(stats("cand", ttft=[100.0] * 100, errors=2), None, thresholds=slo)
    assert leaning.decision == "warn"


def test_tpot_is_judged_against_the_slo():
    slo = Thresholds(slo_ttft_p95_ms=60_000, slo_tpot_p95_ms=20, slo_error_rate=0.5,
                     latency_margin_pct=10)
    result = judge(stats("cand", ttft=[100.0] * 100, tpot=lognormal(2, 2000, 40, 0.05)),
                   None, thresholds=slo)
    assert result.decision == "fail"
    assert "TPOT p95" in result.reasons[0]


def test_fails_against_the_primary_bound_to_bound():
    primary = stats("prim", ttft=lognormal(3, 1000, 100, 0.2))
    candidate = stats("cand", ttft=lognormal(4, 100, 400, 0.2))
    result = judge(candidate, primary)
    assert result.decision == "fail"
    assert "against prim's" in result.reasons[0] and "10 % margin" in result.reasons[0]
    assert result.numbers["candidate"]["pool"] == "cand"
    assert result.numbers["primary"]["ttft_p95"]["n"] == 1000
    assert result.numbers["thresholds"]["latency_margin_pct"] == 10


def test_a_difference_under_the_floor_never_fails():
    # 3 ms against 10 ms is three times slower, and still nothing a user notices.
    result = judge(stats("cand", ttft=[10.0] * 200), stats("prim", ttft=[3.0] * 2000))
    assert result.decision == "pass"


def test_a_small_primary_sample_is_not_compared_with():
    result = judge(stats("cand", ttft=[400.0] * 200), stats("prim", ttft=[100.0] * 20))
    assert result.decision == "pass"


def test_numbers_are_json_safe():
    import json

    result = judge(stats("cand", ttft=[100.0] * 100), stats("prim", ttft=[100.0] * 100))
    assert json.loads(json.dumps(result.numbers))["window"]["seconds"] == 30.0


# --- client disconnects ------------------------------------------------------------------------

STRICT = Thresholds(slo_ttft_p95_ms=250, slo_tpot_p95_ms=50, slo_error_rate=0.05,
                    latency_margin_pct=100)


def test_hang_ups_on_both_pools_are_shown_and_never_judged():
    # The attack of issue 25: as many hang-ups as answers, spread by weight over both pools.
    result = judge(stats("cand", ttft=[20.0] * 60, disconnects=60),
                   stats("prim", ttft=[20.0] * 60, disconnects=55), thresholds=STRICT)
    assert result.decision == "pass", result.reasons
    assert "error rate 0.00 %" in result.reasons[0]
    assert ("Client disconnects, not counted against any pool: cand 60 (50.00 %), prim 55"
            in result.reasons[-1])
    assert result.numbers["candidate"]["client_disconnects"] == 60
    assert result.numbers["candidate"]["disconnect_rate"]["n"] == 120


def test_hang_ups_alone_never_make_up_the_samples_a_judgement_needs():
    result = judge(stats("cand", ttft=[20.0] * 10, disconnects=500),
                   stats("prim", ttft=[20.0] * 500), thresholds=STRICT)
    assert result.decision == "wait"
    assert "answered 10 of the 50 requests" in result.reasons[0]
    assert "500 more were abandoned by their clients and do not count" in result.reasons[0]


def test_a_candidate_whose_clients_give_up_far_more_often_waits_instead_of_passing():
    result = judge(stats("cand", ttft=[20.0] * 100, disconnects=60),
                   stats("prim", ttft=[20.0] * 500, disconnects=10), thresholds=STRICT)
    assert result.decision == "wait"
    assert "Clients abandoned 37.50 % of cand's requests" in result.reasons[0]
    assert "Disconnects never fail a ramp." in result.reasons[0]


def test_a_disconnect_share_a_little_over_the_primarys_is_no_reason_to_wait():
    # 6 % against 3 %, thousands of samples: the bounds part, the floor (5 points) does not.
    result = judge(stats("cand", ttft=[20.0] * 4700, disconnects=300),
                   stats("prim", ttft=[20.0] * 4850, disconnects=150), thresholds=STRICT,
                   min_samples=50)
    assert result.decision == "pass", result.reasons


def test_hang_ups_never_hide_a_failing_pool():
    # A failing candidate whose clients also leave in numbers still fails: a wait for the
    # disconnects never stands in for a fail (nor for a warn).
    result = judge(stats("cand", ttft=[20.0] * 200, errors=40, disconnects=400),
                   stats("prim", ttft=[20.0] * 500), thresholds=STRICT)
    assert result.decision == "fail"
    assert "error rate" in result.reasons[0]
    slow = judge(stats("cand", ttft=[20.0] * 48 + [400.0] * 4, disconnects=400),
                 stats("prim", ttft=[20.0] * 52), thresholds=STRICT)
    assert slow.decision == "warn"


# --- properties -------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), median=st.floats(5, 3000), sigma=st.floats(0.02, 1.2),
       n_candidate=st.integers(50, 600), n_primary=st.integers(50, 5000))
def test_aa_never_fails(seed, median, sigma, n_candidate, n_primary):
    """A candidate drawn from the primary's own distribution: the guard never fails it."""
    rng = np.random.default_rng(seed)
    draw = lambda n: list(rng.lognormal(np.log(median), sigma, n))  # noqa: E731
    result = judge(stats("cand", ttft=draw(n_candidate), tpot=draw(n_candidate)),
                   stats("prim", ttft=draw(n_primary), tpot=draw(n_primary)))
    assert result.decision != "fail", result.reasons


@settings(max_examples=200, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), median=st.floats(2, 200), sigma=st.floats(0.02, 0.4),
       n_candidate=st.integers(20, 300), n_primary=st.integers(200, 3000))
def test_300ms_slower_first_tokens_fail(seed, median, sigma, n_candidate, n_primary):
    """The fault the ramps are for: +300 ms to every first token of the candidate, seen in
    as few as 20 streamed answers."""
    rng = np.random.default_rng(seed)
    primary = list(rng.lognormal(np.log(median), sigma, n_primary))
    candidate = [ms + 300 for ms in rng.lognormal(np.log(median), sigma, n_candidate)]
    result = judge(stats("cand", ttft=candidate), stats("prim", ttft=primary),
                   min_samples=20)
    assert result.decision == "fail", result.reasons
