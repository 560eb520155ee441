"""Confidence bounds and gate verdicts: the one place that turns samples into "within margin".

Gates compare a candidate with a reference from samples — shadow divergence rates (candidate
vs primary against the primary-vs-secondary noise floor, paired per request), eval scores
(0/1 or [0, 1] per item, paired on the same items), batch error rates — and ask whether
candidate − reference is within a margin. Every such gate is to compute its interval here and
hand it to `judge`, so each verdict says the same thing the same way (no gate does yet).

Methods (see docs/confidence.md for why):

- one proportion: Wilson score interval (`wilson_interval`);
- a quantile (a latency percentile): binomial order-statistic ranks
  (`quantile_rank_interval`), distribution-free;
- a mean of [0, 1] scores: BCa bootstrap (`bootstrap_mean_interval`);
- paired 0/1 samples: Newcombe's square-and-add interval for paired proportions (method 10,
  Wilson limits of each marginal, corrected phi) with the exact McNemar p-value
  (`paired_difference`); any other paired values: BCa bootstrap of the per-item differences;
- two independent counts (two batches): Newcombe's hybrid score interval
  (`independent_difference`);
- sample size: normal power for two proportions on Cohen's h, one-sided (`samples_needed`).

Everything is deterministic given a seed. Intervals are two-sided at `confidence`, so each
bound is a one-sided bound at 1 − (1 − confidence) / 2: at the default 0.95 a gate that fails
only when the whole interval lies beyond its margin fails a candidate that is as good as the
reference at most 2.5 % of the time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

from fleetctl.core.errors import DomainError

# scipy and statsmodels are imported where they are used: together they take most of a second
# to import, which every web and worker process would otherwise pay at start-up whether or not
# it ever judges a gate.

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
DEFAULT_MIN_N = 30

Direction = Literal["higher_is_better", "lower_is_better"]
Verdict = Literal["pass", "warn", "fail", "insufficient"]
DIRECTIONS: tuple[Direction, ...] = ("higher_is_better", "lower_is_better")

Number = float | int | bool


class ConfidenceInputError(DomainError, ValueError):
    """Samples or parameters that no interval can be computed from (answers 400)."""


@dataclass(frozen=True)
class Interval:
    """An estimate with its two-sided interval at `confidence`.

    For a difference, the estimate is candidate − reference. `p_value` is set when the method
    has a test (exact McNemar for paired 0/1 samples)."""

    estimate: float
    lower: float
    upper: float
    confidence: float
    method: str
    n: int
    p_value: float | None = None
    test: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    estimate: float
    lower: float
    upper: float
    margin: float
    direction: Direction
    confidence: float
    method: str
    n: int
    min_n: int
    explanation: str
    p_value: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- input checks ---------------------------------------------------------------------------

def _check_confidence(confidence: float) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise ConfidenceInputError(
            f"Confidence must be a number between 0 and 1, not {confidence!r}.")
    value = float(confidence)
    if not math.isfinite(value) or not 0.0 < value < 1.0:
        raise ConfidenceInputError(
            f"Confidence must be strictly between 0 and 1 (e.g. 0.95), not {confidence!r}.")
    return value


def _check_count(name: str, value: int, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfidenceInputError(f"{name} must be a whole number, not {value!r}.")
    if value < minimum:
        raise ConfidenceInputError(f"{name} must be at least {minimum}, not {value}.")
    return int(value)


def _values(name: str, values: Sequence[Number] | np.ndarray) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ConfidenceInputError(f"{name} must be numbers: {exc}.") from None
    if array.ndim != 1:
        raise ConfidenceInputError(f"{name} must be a flat list of numbers, one per item.")
    if array.size == 0:
        raise ConfidenceInputError(f"{name} is empty: at least one sample is needed.")
    if not np.all(np.isfinite(array)):
        bad = int(np.flatnonzero(~np.isfinite(array))[0])
        raise ConfidenceInputError(
            f"{name} holds a value that is not a finite number (NaN or infinite) "
            f"at position {bad}.")
    return array


def _is_binary(array: np.ndarray) -> bool:
    return bool(np.all((array == 0.0) | (array == 1.0)))


def _check_seed(seed: int) -> int:
    return _check_count("Seed", seed)


# -- one sample -----------------------------------------------------------------------------

def wilson_interval(successes: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Wilson score interval for successes / n (statsmodels, method "wilson")."""
    confidence = _check_confidence(confidence)
    n = _check_count("The number of samples", n, minimum=1)
    successes = _check_count("The number of successes", successes)
    if successes > n:
        raise ConfidenceInputError(
            f"The number of successes ({successes}) cannot exceed the number of samples ({n}).")
    lower, upper = _wilson_limits(successes, n, confidence)
    return Interval(estimate=successes / n, lower=max(0.0, float(lower)),
                    upper=min(1.0, float(upper)), confidence=confidence, method="wilson", n=n)


def quantile_rank_interval(n: int, q: float,
                           confidence: float = DEFAULT_CONFIDENCE) -> tuple[int, int]:
    """The 0-based ranks (lo, hi) of the sorted samples whose values bound the q-quantile of
    the distribution the n samples came from, at `confidence`.

    The number of samples below the true quantile is Binomial(n, q), so the lo-th smallest
    sample is below it and the hi-th above it each with probability at least
    1 − (1 − confidence) / 2 (exact binomial, scipy; no assumption about the distribution:
    latencies are anything but normal). With too few samples for that the ranks stop at the
    smallest and largest sample and the coverage is lower than asked: the caller shows n.
    The sample's own linear quantile (numpy's default) always lies between the two ranks."""
    from scipy.stats import binom

    confidence = _check_confidence(confidence)
    n = _check_count("The number of samples", n, minimum=1)
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(float(q)) \
            or not 0.0 <= q <= 1.0:
        raise ConfidenceInputError(f"The quantile must be a number from 0 to 1, not {q!r}.")
    tail = (1.0 - confidence) / 2.0
    # 1-based order statistics X(j) <= quantile <= X(k): j = ppf(tail), k = ppf(1 - tail) + 1.
    lo = int(binom.ppf(tail, n, q)) - 1
    hi = int(binom.ppf(1.0 - tail, n, q))
    rank = q * (n - 1)
    lo = max(0, min(lo, math.floor(rank)))
    hi = min(n - 1, max(hi, math.ceil(rank)))
    return lo, hi


def bootstrap_mean_interval(
    values: Sequence[Number] | np.ndarray,
    confidence: float = DEFAULT_CONFIDENCE,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """BCa bootstrap interval for the mean of `values` (see `_bootstrap`).

    When every value is the same there is nothing to resample: the interval is that value."""
    confidence = _check_confidence(confidence)
    array = _values("The values", values)
    resamples = _check_count("The number of resamples", resamples, minimum=100)
    seed = _check_seed(seed)
    return _bootstrap(array, confidence, resamples, seed, method="bootstrap-bca")


# Resampled values held at once while bootstrapping (a batch of resamples × n).
_BOOTSTRAP_BATCH_VALUES = 2_000_000


def _bootstrap(array: np.ndarray, confidence: float, resamples: int, seed: int,
               *, method: str) -> Interval:
    """BCa interval for the mean (Efron 1987), computed directly.

    scipy.stats.bootstrap jackknifes by recomputing the statistic n times on n − 1 values,
    O(n²): 19 s at 20,000 items and out of memory at 50,000. The mean's jackknife is closed
    form ((sum − xᵢ)/(n − 1)), and resamples are drawn in batches, so this is O(resamples · n)
    time and bounded memory."""
    mean = float(np.mean(array))
    n = int(array.size)
    if n == 1 or float(np.ptp(array)) == 0.0:
        return Interval(estimate=mean, lower=mean, upper=mean, confidence=confidence,
                        method=method, n=n)
    rng = np.random.default_rng(seed)
    batch = max(1, _BOOTSTRAP_BATCH_VALUES // n)
    means = np.empty(resamples)
    for start in range(0, resamples, batch):
        stop = min(resamples, start + batch)
        means[start:stop] = array[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    means.sort()
    normal = NormalDist()
    tail = (1.0 - confidence) / 2.0
    # Bias correction: where the estimate sits among the resampled means.
    below = (np.count_nonzero(means < mean) + 0.5 * np.count_nonzero(means == mean)) / resamples
    z0 = normal.inv_cdf(min(max(below, 0.5 / resamples), 1.0 - 0.5 / resamples))
    # Acceleration: the skew of the jackknife means.
    jack = (float(np.sum(array)) - array) / (n - 1)
    dev = jack.mean() - jack
    spread = float(np.sum(dev ** 2))
    accel = float(np.sum(dev ** 3)) / (6.0 * spread ** 1.5) if spread > 0 else 0.0
    levels = []
    for z in (normal.inv_cdf(tail), normal.inv_cdf(1.0 - tail)):
        denominator = 1.0 - accel * (z0 + z)
        # As the denominator falls to 0 the level runs to 0 or 1; past it, stay there (the
        # extreme resample) rather than wrap around.
        levels.append(normal.cdf(z0 + (z0 + z) / denominator) if denominator > 0
                      else float(z0 + z > 0))
    lower, upper = (float(np.quantile(means, level)) for level in levels)
    return Interval(estimate=mean, lower=min(lower, mean), upper=max(upper, mean),
                    confidence=confidence, method=method, n=n)


# -- differences ----------------------------------------------------------------------------

def _wilson_limits(successes: int, n: int, confidence: float) -> tuple[float, float]:
    from statsmodels.stats.proportion import proportion_confint

    lower, upper = proportion_confint(successes, n, alpha=1.0 - confidence, method="wilson")
    return float(lower), float(upper)


def newcombe_paired_interval(
    both: int, only_candidate: int, only_reference: int, neither: int,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float]:
    """Newcombe (1998) method 10 for candidate rate − reference rate on paired 0/1 data.

    `both` items are 1 on both sides, `only_candidate` 1 only for the candidate, and so on.
    Square-and-add of each marginal's Wilson limits, with the correlation phi corrected toward
    zero as Newcombe gives it (ad − bc reduced by n/2 when positive)."""
    confidence = _check_confidence(confidence)
    a, b, c, d = (_check_count("A paired count", x) for x in
                  (both, only_candidate, only_reference, neither))
    n = a + b + c + d
    if n == 0:
        raise ConfidenceInputError("No pairs: at least one paired sample is needed.")
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = _wilson_limits(a + b, n, confidence)
    l2, u2 = _wilson_limits(a + c, n, confidence)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    phi = 0.0
    if margins > 0:
        cross = a * d - b * c
        if cross > n / 2:
            phi = (cross - n / 2) / math.sqrt(margins)
        elif cross < 0:
            phi = cross / math.sqrt(margins)
    diff = p1 - p2
    low_sq = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    high_sq = (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2
    lower = diff - math.sqrt(max(low_sq, 0.0))
    upper = diff + math.sqrt(max(high_sq, 0.0))
    return max(-1.0, lower), min(1.0, upper)


def paired_difference(
    candidate: Sequence[Number] | np.ndarray,
    reference: Sequence[Number] | np.ndarray,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
    resamples: int = DEFAULT_RESAMPLES,
) -> Interval:
    """Candidate − reference on the same items, item i of each side being one pair.

    0/1 samples: Newcombe's paired interval for the difference of proportions and the exact
    McNemar p-value (two-sided, binomial on the discordant pairs). Anything else (scores in
    [0, 1], latencies): BCa bootstrap of the mean of the per-item differences."""
    confidence = _check_confidence(confidence)
    a = _values("The candidate samples", candidate)
    b = _values("The reference samples", reference)
    if a.size != b.size:
        raise ConfidenceInputError(
            f"Paired samples must have one value per item on each side: the candidate has "
            f"{a.size} and the reference {b.size}.")
    seed = _check_seed(seed)
    resamples = _check_count("The number of resamples", resamples, minimum=100)
    n = int(a.size)
    if _is_binary(a) and _is_binary(b):
        both = int(np.sum((a == 1) & (b == 1)))
        only_candidate = int(np.sum((a == 1) & (b == 0)))
        only_reference = int(np.sum((a == 0) & (b == 1)))
        neither = n - both - only_candidate - only_reference
        lower, upper = newcombe_paired_interval(
            both, only_candidate, only_reference, neither, confidence)
        from statsmodels.stats.contingency_tables import mcnemar

        if only_candidate + only_reference == 0:
            p_value = 1.0
        else:
            table = [[both, only_candidate], [only_reference, neither]]
            p_value = float(mcnemar(table, exact=True).pvalue)
        return Interval(estimate=(only_candidate - only_reference) / n, lower=lower, upper=upper,
                        confidence=confidence, method="newcombe-paired", n=n,
                        p_value=min(1.0, p_value), test="mcnemar-exact")
    return _bootstrap(a - b, confidence, resamples, seed, method="paired-bootstrap-bca")


def independent_difference(
    candidate_successes: int, candidate_n: int, reference_successes: int, reference_n: int,
    *, confidence: float = DEFAULT_CONFIDENCE,
) -> Interval:
    """Candidate rate − reference rate from two independent samples (e.g. two batches'
    error counts): Newcombe's hybrid score interval (statsmodels, method "newcomb")."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    confidence = _check_confidence(confidence)
    n1 = _check_count("The candidate's number of samples", candidate_n, minimum=1)
    n2 = _check_count("The reference's number of samples", reference_n, minimum=1)
    s1 = _check_count("The candidate's number of successes", candidate_successes)
    s2 = _check_count("The reference's number of successes", reference_successes)
    if s1 > n1 or s2 > n2:
        raise ConfidenceInputError("A number of successes cannot exceed its number of samples.")
    lower, upper = confint_proportions_2indep(
        s1, n1, s2, n2, method="newcomb", compare="diff", alpha=1.0 - confidence)
    return Interval(estimate=s1 / n1 - s2 / n2, lower=float(lower), upper=float(upper),
                    confidence=confidence, method="newcombe-independent", n=min(n1, n2))


# -- verdicts -------------------------------------------------------------------------------

def _pct(value: float) -> str:
    return f"{value * 100:+.2f} pts"


def judge(
    difference_interval: Interval,
    margin: float,
    *,
    n: int | None = None,
    min_n: int = DEFAULT_MIN_N,
    direction: Direction = "higher_is_better",
) -> Judgement:
    """The verdict on candidate − reference against `margin` (≥ 0, in the metric's units).

    higher_is_better (eval scores): pass when the lower bound ≥ −margin, fail when the upper
    bound < −margin. lower_is_better (divergence, error rate): pass when the upper bound ≤
    margin, fail when the lower bound > margin. Warn in between; insufficient below min_n
    (n defaults to the interval's)."""
    _check_judge_inputs(difference_interval, margin, direction)
    count = difference_interval.n if n is None else _check_count("n", n)
    min_n = _check_count("min_n", min_n, minimum=1)
    margin = float(margin)
    iv = difference_interval
    level = f"{iv.confidence * 100:g} %"
    span = f"{_pct(iv.estimate)} [{_pct(iv.lower)}, {_pct(iv.upper)}] at {level}"
    verdict: Verdict
    if count < min_n:
        verdict = "insufficient"
        explanation = f"Only {count} samples; at least {min_n} are needed to judge ({span})."
    else:
        verdict, explanation = _verdict(iv, margin, direction, span)
    return Judgement(verdict=verdict, estimate=iv.estimate, lower=iv.lower, upper=iv.upper,
                     margin=margin, direction=direction, confidence=iv.confidence,
                     method=iv.method, n=count, min_n=min_n, explanation=explanation,
                     p_value=iv.p_value)


def _check_judge_inputs(difference_interval: Any, margin: Any, direction: Any) -> None:
    if not isinstance(difference_interval, Interval):
        raise ConfidenceInputError(
            "judge() needs an Interval (from paired_difference and the like).")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) \
            or not math.isfinite(float(margin)) or margin < 0:
        raise ConfidenceInputError(
            f"The margin must be a finite number at least 0 (e.g. 0.02 for two points), "
            f"not {margin!r}.")
    if direction not in DIRECTIONS:
        raise ConfidenceInputError(
            f"Direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}.")


def _verdict(iv: Interval, margin: float, direction: Direction,
             span: str) -> tuple[Verdict, str]:
    """Pass, fail or warn, and why, for an interval with enough samples. The two directions
    mirror each other: higher_is_better holds the lower bound to −margin, lower_is_better
    the upper bound to +margin."""
    if direction == "higher_is_better":
        passed, failed, bound, sign = iv.lower >= -margin, iv.upper < -margin, "lower", "−"
    else:
        passed, failed, bound, sign = iv.upper <= margin, iv.lower > margin, "upper", "+"
    limit = f"the margin of {sign}{margin * 100:.2f} pts"
    head = f"Candidate − reference {span}: "
    if passed:
        return "pass", f"{head}the {bound} bound is within {limit}."
    if failed:
        return "fail", f"{head}the whole interval is worse than {limit}."
    return "warn", f"{head}the interval crosses {limit}; more samples would settle it."


# -- planning -------------------------------------------------------------------------------

def samples_needed(p0: float, delta: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """Samples per side to detect a rise from rate p0 to p0 + delta (one-sided test at
    `alpha`, normal power on Cohen's h, statsmodels). E.g. samples_needed(0.01, 0.02): pairs
    needed to see a two-point divergence increase over a 1 % noise floor.

    It treats the two sides as independent samples; pairs that agree more than chance need
    fewer, so the figure is on the safe side for paired data."""
    for name, value in (("p0", p0), ("delta", delta), ("alpha", alpha), ("power", power)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(float(value)):
            raise ConfidenceInputError(f"{name} must be a finite number, not {value!r}.")
    if not 0.0 < p0 < 1.0:
        raise ConfidenceInputError(f"p0 must be a rate strictly between 0 and 1, not {p0!r}.")
    if delta == 0 or not 0.0 < p0 + delta < 1.0:
        raise ConfidenceInputError(
            f"delta must be non-zero and keep p0 + delta strictly between 0 and 1 "
            f"(p0 = {p0}, delta = {delta}).")
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ConfidenceInputError("alpha and power must be strictly between 0 and 1.")
    from statsmodels.stats.power import NormalIndPower
    from statsmodels.stats.proportion import proportion_effectsize

    effect = abs(float(proportion_effectsize(p0 + delta, p0)))
    size = NormalIndPower().solve_power(effect_size=effect, alpha=alpha, power=power,
                                        ratio=1.0, alternative="larger")
    return math.ceil(float(size))
