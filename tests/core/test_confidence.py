"""Confidence bounds and verdicts: textbook values, symmetry, direction, min_n, seeded A/A and
regressed samples, and clear errors on bad input."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fleetctl.core.errors import DomainError
from fleetctl.inference import confidence as conf
from fleetctl.inference.confidence import ConfidenceInputError, Interval


def _pairs(both: int, only_candidate: int, only_reference: int,
           neither: int) -> tuple[list[int], list[int]]:
    candidate = [1] * both + [1] * only_candidate + [0] * only_reference + [0] * neither
    reference = [1] * both + [0] * only_candidate + [1] * only_reference + [0] * neither
    return candidate, reference


def test_importing_the_module_leaves_scipy_and_statsmodels_for_first_use() -> None:
    # Web and worker processes import gate code at start-up; the heavy libraries load only
    # when a bound is computed.
    probe = ("import sys, fleetctl.inference.confidence as c; "
             "print(sorted(m for m in ('scipy', 'statsmodels') if m in sys.modules)); "
             "c.wilson_interval(1, 2); print('statsmodels' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


# -- textbook values ------------------------------------------------------------------------

@pytest.mark.parametrize(("successes", "lower", "upper"), [
    # Wilson 95 % for n = 20 (Newcombe 1998, single proportion): 0/20 is 0 to z²/(n + z²).
    (0, 0.0, 0.1611),
    (5, 0.1119, 0.4687),
    (20, 0.8389, 1.0),
])
def test_wilson_textbook_values(successes: int, lower: float, upper: float) -> None:
    iv = conf.wilson_interval(successes, 20, 0.95)
    assert iv.lower == pytest.approx(lower, abs=5e-5)
    assert iv.upper == pytest.approx(upper, abs=5e-5)
    assert iv.estimate == successes / 20
    assert (iv.method, iv.n, iv.confidence) == ("wilson", 20, 0.95)


def test_wilson_zero_successes_upper_bound_is_closed_form() -> None:
    z = 1.959963984540054
    assert conf.wilson_interval(0, 50).upper == pytest.approx(z * z / (50 + z * z))


def test_mcnemar_exact_p_for_a_known_table() -> None:
    # 1 vs 7 discordant pairs: two-sided binomial p = 2 · (C(8,0) + C(8,1)) / 2^8 = 18/256.
    candidate, reference = _pairs(1, 1, 7, 12)
    iv = conf.paired_difference(candidate, reference)
    assert iv.p_value == pytest.approx(18 / 256)
    assert iv.test == "mcnemar-exact"
    assert iv.method == "newcombe-paired"
    assert iv.estimate == pytest.approx((1 - 7) / 21)
    assert iv.lower < iv.estimate < iv.upper < 0


def test_newcombe_paired_interval_matches_the_square_and_add_formula() -> None:
    # With no concordant-pair correlation (phi = 0 after Newcombe's correction) the interval is
    # plain square-and-add of the two marginals' Wilson limits.
    a, b, c, d = 10, 5, 5, 10  # ad − bc = 75 > n/2 = 15, so phi = (75 − 15)/sqrt(15⁴)
    n = a + b + c + d
    p = (a + b) / n
    lo, hi = conf.wilson_interval(a + b, n).lower, conf.wilson_interval(a + b, n).upper
    phi = (a * d - b * c - n / 2) / math.sqrt(15 ** 4)
    half_low = math.sqrt((p - lo) ** 2 - 2 * phi * (p - lo) * (hi - p) + (hi - p) ** 2)
    lower, upper = conf.newcombe_paired_interval(a, b, c, d)
    assert lower == pytest.approx(-half_low)
    assert upper == pytest.approx(half_low)  # symmetric table → symmetric interval


def test_all_pairs_agree_gives_p_one_and_an_interval_around_zero() -> None:
    iv = conf.paired_difference([1, 0] * 50, [1, 0] * 50)
    assert iv.estimate == 0.0
    assert iv.p_value == 1.0
    assert iv.lower < 0 < iv.upper


# -- symmetry and determinism ---------------------------------------------------------------

def test_swapping_sides_mirrors_the_paired_interval() -> None:
    candidate, reference = _pairs(30, 12, 4, 154)
    forward = conf.paired_difference(candidate, reference)
    backward = conf.paired_difference(reference, candidate)
    assert backward.estimate == pytest.approx(-forward.estimate)
    assert backward.lower == pytest.approx(-forward.upper)
    assert backward.upper == pytest.approx(-forward.lower)
    assert backward.p_value == pytest.approx(forward.p_value)


def test_wilson_is_symmetric_in_successes_and_failures() -> None:
    low = conf.wilson_interval(3, 40)
    high = conf.wilson_interval(37, 40)
    assert high.lower == pytest.approx(1 - low.upper)
    assert high.upper == pytest.approx(1 - low.lower)


def test_bootstrap_is_deterministic_given_a_seed() -> None:
    rng = np.random.default_rng(7)
    scores = rng.random(300)
    first = conf.bootstrap_mean_interval(scores, 0.9, resamples=500, seed=11)
    again = conf.bootstrap_mean_interval(scores, 0.9, resamples=500, seed=11)
    other = conf.bootstrap_mean_interval(scores, 0.9, resamples=500, seed=12)
    assert first == again
    assert (first.lower, first.upper) != (other.lower, other.upper)
    assert first.lower < float(np.mean(scores)) < first.upper
    assert first.method == "bootstrap-bca"


def test_paired_scores_use_the_paired_bootstrap_and_swap_symmetrically() -> None:
    rng = np.random.default_rng(3)
    reference = rng.random(400)
    candidate = np.clip(reference + rng.normal(0.0, 0.05, 400), 0.0, 1.0)
    forward = conf.paired_difference(candidate, reference, seed=5)
    backward = conf.paired_difference(reference, candidate, seed=5)
    assert forward.method == "paired-bootstrap-bca"
    assert forward.p_value is None
    assert backward.estimate == pytest.approx(-forward.estimate)
    # Resampling the same indices: the mirrored interval, up to BCa's skew correction.
    assert backward.lower == pytest.approx(-forward.upper, abs=2e-3)
    assert backward.upper == pytest.approx(-forward.lower, abs=2e-3)
    # Pairing matters: the paired interval is far narrower than the spread of either side.
    assert forward.upper - forward.lower < 0.02


def test_bca_agrees_with_scipy_on_a_skewed_sample() -> None:
    # The same method as scipy.stats.bootstrap(method="BCa"), up to Monte-Carlo error.
    from scipy import stats

    scores = np.random.default_rng(0).beta(0.5, 3.0, 300)
    ours = conf.bootstrap_mean_interval(scores, resamples=20_000, seed=1)
    theirs = stats.bootstrap((scores,), np.mean, method="BCa", n_resamples=20_000,
                             rng=np.random.default_rng(1)).confidence_interval
    width = ours.upper - ours.lower
    assert ours.lower == pytest.approx(float(theirs.low), abs=0.05 * width)
    assert ours.upper == pytest.approx(float(theirs.high), abs=0.05 * width)
    # Skewed right: the interval reaches further above the mean than below it.
    assert ours.upper - ours.estimate > ours.estimate - ours.lower


def test_bootstrap_of_many_items_keeps_memory_bounded() -> None:
    # Large eval suites and shadow runs: the jackknife is closed form and resamples are drawn
    # in batches, so 50,000 paired items need tens of megabytes, not gigabytes.
    import tracemalloc

    rng = np.random.default_rng(8)
    reference = rng.random(50_000)
    candidate = np.clip(reference - 0.01 + rng.normal(0.0, 0.05, 50_000), 0.0, 1.0)
    tracemalloc.start()
    try:
        iv = conf.paired_difference(candidate, reference, seed=3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2 ** 20
    assert iv.method == "paired-bootstrap-bca" and iv.n == 50_000
    assert iv.lower < iv.estimate < iv.upper < 0


def test_constant_values_give_a_point_interval() -> None:
    iv = conf.bootstrap_mean_interval([0.5] * 40)
    assert (iv.lower, iv.estimate, iv.upper) == (0.5, 0.5, 0.5)


# -- verdicts -------------------------------------------------------------------------------

def _iv(estimate: float, lower: float, upper: float, n: int = 500) -> Interval:
    return Interval(estimate=estimate, lower=lower, upper=upper, confidence=0.95,
                    method="test", n=n)


@pytest.mark.parametrize(("lower", "upper", "verdict"), [
    (-0.01, 0.03, "pass"),    # lower bound above −margin
    (-0.02, 0.03, "pass"),    # exactly on the margin passes
    (-0.05, 0.01, "warn"),    # crosses −margin
    (-0.09, -0.03, "fail"),   # wholly below −margin
])
def test_judge_higher_is_better(lower: float, upper: float, verdict: str) -> None:
    j = conf.judge(_iv((lower + upper) / 2, lower, upper), 0.02, min_n=30)
    assert j.verdict == verdict
    assert j.direction == "higher_is_better"
    assert (j.lower, j.upper, j.margin, j.n) == (lower, upper, 0.02, 500)
    assert j.explanation and "\n" not in j.explanation


@pytest.mark.parametrize(("lower", "upper", "verdict"), [
    (-0.03, 0.01, "pass"),    # upper bound within +margin
    (-0.01, 0.05, "warn"),
    (0.03, 0.09, "fail"),     # wholly above +margin
])
def test_judge_lower_is_better(lower: float, upper: float, verdict: str) -> None:
    j = conf.judge(_iv((lower + upper) / 2, lower, upper), 0.02, min_n=30,
                   direction="lower_is_better")
    assert j.verdict == verdict


def test_direction_changes_the_verdict_on_the_same_interval() -> None:
    iv = _iv(0.06, 0.03, 0.09)  # the candidate is clearly higher
    assert conf.judge(iv, 0.02).verdict == "pass"
    assert conf.judge(iv, 0.02, direction="lower_is_better").verdict == "fail"


def test_insufficient_below_min_n() -> None:
    j = conf.judge(_iv(-0.2, -0.3, -0.1, n=29), 0.02, min_n=30)
    assert j.verdict == "insufficient"
    assert "29" in j.explanation and "30" in j.explanation
    assert conf.judge(_iv(-0.2, -0.3, -0.1, n=29), 0.02, min_n=29).verdict == "fail"
    # n given explicitly overrides the interval's.
    assert conf.judge(_iv(0.0, -0.01, 0.01, n=500), 0.02, n=10, min_n=30).verdict == \
        "insufficient"


def test_a_regressed_divergence_sample_fails() -> None:
    # Noise floor 1 % (primary vs secondary), candidate diverges 6 % of the time, 2,000 pairs.
    rng = np.random.default_rng(2024)
    noise = (rng.random(2000) < 0.01).astype(int)
    candidate = (rng.random(2000) < 0.06).astype(int)
    iv = conf.paired_difference(candidate, noise, seed=1)
    j = conf.judge(iv, 0.02, min_n=100, direction="lower_is_better")
    assert j.verdict == "fail", j.explanation
    assert j.p_value is not None and j.p_value < 1e-6


def test_an_aa_divergence_sample_passes() -> None:
    # Same 1 % rate on both sides, 5,000 pairs: within a 1-point margin.
    rng = np.random.default_rng(99)
    noise = (rng.random(5000) < 0.01).astype(int)
    candidate = (rng.random(5000) < 0.01).astype(int)
    j = conf.judge(conf.paired_difference(candidate, noise, seed=1), 0.01, min_n=100,
                   direction="lower_is_better")
    assert j.verdict == "pass", j.explanation


def test_an_aa_eval_score_sample_passes_and_a_regressed_one_fails() -> None:
    rng = np.random.default_rng(5)
    truth = rng.random(800)
    same = np.clip(truth + rng.normal(0.0, 0.05, 800), 0.0, 1.0)
    worse = np.clip(truth - 0.08 + rng.normal(0.0, 0.05, 800), 0.0, 1.0)
    assert conf.judge(conf.paired_difference(same, truth, seed=2), 0.02).verdict == "pass"
    assert conf.judge(conf.paired_difference(worse, truth, seed=2), 0.02).verdict == "fail"


def test_independent_difference_for_two_batches() -> None:
    iv = conf.independent_difference(60, 1000, 10, 1000)
    assert iv.method == "newcombe-independent"
    assert iv.estimate == pytest.approx(0.05)
    assert 0 < iv.lower < 0.05 < iv.upper
    assert conf.judge(iv, 0.02, direction="lower_is_better").verdict == "fail"


def test_judgement_as_dict_is_json_ready() -> None:
    d = conf.judge(_iv(0.0, -0.01, 0.01), 0.02).as_dict()
    assert d["verdict"] == "pass" and d["method"] == "test" and d["min_n"] == 30


# -- planning -------------------------------------------------------------------------------

def test_samples_needed_for_a_two_point_rise_over_a_one_percent_floor() -> None:
    n = conf.samples_needed(0.01, 0.02, alpha=0.05, power=0.8)
    # Cohen's h for 3 % vs 1 %: 2·asin(√.03) − 2·asin(√.01). Each side's transformed rate has
    # variance 1/n, their difference 2/n, so n per side = 2·((z.95 + z.8)/h)².
    h = 2 * math.asin(math.sqrt(0.03)) - 2 * math.asin(math.sqrt(0.01))
    expected = 2 * ((1.6448536269514722 + 0.8416212335729143) / h) ** 2
    assert n == math.ceil(expected)
    assert conf.samples_needed(0.01, 0.01) > n  # a smaller rise needs more pairs
    assert conf.samples_needed(0.01, 0.02, power=0.9) > n


# -- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize(("call", "message"), [
    (lambda: conf.wilson_interval(0, 0), "at least 1"),
    (lambda: conf.wilson_interval(21, 20), "cannot exceed"),
    (lambda: conf.wilson_interval(-1, 20), "at least 0"),
    (lambda: conf.wilson_interval(5, 20, 1.0), "between 0 and 1"),
    (lambda: conf.wilson_interval(5, 20, 0.0), "between 0 and 1"),
    (lambda: conf.wilson_interval(5, 20, float("nan")), "between 0 and 1"),
    (lambda: conf.wilson_interval(5, 20, 95), "between 0 and 1"),
    (lambda: conf.bootstrap_mean_interval([]), "empty"),
    (lambda: conf.bootstrap_mean_interval([0.1, float("nan"), 0.3]), "position 1"),
    (lambda: conf.bootstrap_mean_interval([0.1, 0.2], resamples=5), "at least 100"),
    (lambda: conf.bootstrap_mean_interval(["a", "b"]), "must be numbers"),  # type: ignore[list-item]
    (lambda: conf.bootstrap_mean_interval([[0.1], [0.2]]), "flat list"),  # type: ignore[list-item]
    (lambda: conf.paired_difference([1, 0, 1], [1, 0]), "candidate has 3 and the reference 2"),
    (lambda: conf.paired_difference([], []), "empty"),
    (lambda: conf.paired_difference([1, 0], [1, float("inf")]), "not a finite number"),
    (lambda: conf.paired_difference([1, 0], [1, 0], confidence=-0.5), "between 0 and 1"),
    (lambda: conf.paired_difference([1, 0], [1, 0], seed=-1), "at least 0"),
    (lambda: conf.newcombe_paired_interval(0, 0, 0, 0), "No pairs"),
    (lambda: conf.independent_difference(1, 0, 1, 10), "at least 1"),
    (lambda: conf.judge(_iv(0, -1, 1), -0.01), "margin"),
    (lambda: conf.judge(_iv(0, -1, 1), float("nan")), "margin"),
    (lambda: conf.judge(_iv(0, -1, 1), 0.02, direction="up"), "Direction"),  # type: ignore[arg-type]
    (lambda: conf.judge(_iv(0, -1, 1), 0.02, min_n=0), "at least 1"),
    (lambda: conf.judge((0, -1, 1), 0.02), "Interval"),  # type: ignore[arg-type]
    (lambda: conf.samples_needed(0.0, 0.02), "p0"),
    (lambda: conf.samples_needed(0.99, 0.02), "delta"),
    (lambda: conf.samples_needed(0.01, 0.0), "delta"),
    (lambda: conf.samples_needed(0.01, 0.02, power=1.0), "power"),
])
def test_bad_input_is_refused_with_a_message(call: object, message: str) -> None:
    with pytest.raises(ConfidenceInputError, match=message) as info:
        call()  # type: ignore[operator]
    # The API and the CLI answer domain errors with 400 and the message.
    assert isinstance(info.value, DomainError) and isinstance(info.value, ValueError)
    assert info.value.status_code == 400
