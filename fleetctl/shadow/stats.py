"""The shadow gate: is the candidate's divergence from the primary within the noise floor
plus the plan's margin? Pure (no Django, no I/O): the judge (services.run_judge) hands it
the stored pairs' metrics, the benchmark (benchmarks/shadow_gate_statistics.py) simulated
ones.

Each pair is two comparisons of the same request (fleetctl.inference.compare): noise = primary
vs secondary (the primary asked again, on another endpoint when it has one), signal =
primary vs candidate. Per metric, the candidate sample is the signal's 0/1 flag and the
reference sample the noise's, on the same requests, so the difference is paired.

The judge looks at a running run every few seconds as pairs arrive, so the verdict is judged
with a **confidence sequence** (`sequence_bounds`): bounds on candidate − reference that hold
at every look at once with probability `confidence`, however often anyone looks (Howard et
al. 2021; Waudby-Smith et al. 2024, the normal-mixture boundary with the sample's own
variance). From `min_pairs` on, the bounds are intersected over the looks (the running
intersection of a confidence sequence is one too), so they only ever narrow: fail when the
whole sequence lies above the margin, pass when it lies within it, and otherwise the
judgement stands at warn — a verdict that does not flip back and forth as pairs accumulate
(docs/shadow.md, "Verdicts that hold"). The old per-look fixed interval
(confidence.paired_difference, Newcombe's paired interval with exact McNemar, judged by
confidence.judge) stays as `sequential=False`, for the benchmark
(benchmarks/verdict_stability.py) and the tests that show why it is not used: judged at every
look its false-fail rate grows with the number of looks (the peeking problem).

Gated metrics decide the verdict; "diverged_any" is shown, never gated. "divergence" is
compare's `diverged` flag except a lone near-tie text flip (the two sides' tokens within
0.1 nats of each other at the first difference, and nothing else differing): a GPU batch
makes those on the primary itself, so counting them would gate on noise the model does not
own. A near-tie can only be seen when the request asked for logprobs; without them every
text flip counts, on both sides alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetctl.inference import confidence

GATED: tuple[str, ...] = ("divergence", "finish_mismatch", "error_mismatch",
                          "validity_mismatch", "refusal_mismatch")
INFORMATIONAL: tuple[str, ...] = ("diverged_any",)
METRICS: tuple[str, ...] = GATED + INFORMATIONAL

# What else, besides the text, makes a comparison diverge (compare.Comparison.metrics()):
# any of these set, and a near-tie flip is not "only" a near-tie.
_OTHER_DIFFERENCES = ("finish_mismatch", "error_mismatch")
_EQUAL_FLAGS = ("tool_names_equal", "tool_args_equal")


def metric_values(metrics: Mapping[str, Any]) -> dict[str, int]:
    """The judged 0/1 values of one comparison's stored metrics: the gated ones it has and
    the informational `diverged_any`."""
    out: dict[str, int] = {}
    if "diverged" in metrics:
        diverged = int(metrics["diverged"])
        out["diverged_any"] = diverged
        near_tie_only = (metrics.get("near_tie") == 1
                         and not any(metrics.get(k) for k in _OTHER_DIFFERENCES)
                         and not any(metrics.get(k) == 0 for k in _EQUAL_FLAGS))
        out["divergence"] = 0 if near_tie_only else diverged
    for name in GATED[1:]:
        if name in metrics:
            out[name] = int(metrics[name])
    return out


@dataclass(frozen=True)
class MetricJudgement:
    n: int
    noise_rate: float | None
    signal_rate: float | None
    estimate: float | None
    lower: float | None
    upper: float | None
    p_value: float | None
    method: str
    verdict: str
    gated: bool

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "noise_rate": self.noise_rate, "signal_rate": self.signal_rate,
                "estimate": self.estimate, "lower": self.lower, "upper": self.upper,
                "p_value": self.p_value, "method": self.method, "verdict": self.verdict,
                "gated": self.gated}


@dataclass(frozen=True)
class RunJudgement:
    verdict: str
    summary: str
    pairs: int
    margin: float
    min_pairs: int
    confidence: float
    metrics: dict[str, MetricJudgement] = field(default_factory=dict)

    def metrics_dict(self) -> dict[str, dict[str, Any]]:
        """metric -> {n, noise_rate, signal_rate, estimate, lower, upper, p_value, method,
        verdict, gated}: what ShadowJudgement.metrics and the evidence store."""
        return {name: m.as_dict() for name, m in self.metrics.items()}


SEQUENCE_METHOD = "confidence-sequence"


def mixture_rho2(alpha: float, design_n: int) -> float:
    """The normal mixture's precision ρ², chosen so the sequence is narrowest near
    `design_n` samples (Waudby-Smith et al. 2024, eq. (2.4)):
    ρ² = (−2 log α + log(1 − 2 log α)) / design_n."""
    spend = -2.0 * math.log(alpha)
    return (spend + math.log(1.0 + spend)) / max(1, design_n)


def sequence_radii(n: np.ndarray, variance: np.ndarray, *, alpha: float,
                   rho2: float) -> np.ndarray:
    """The half-width of the two-sided normal-mixture confidence sequence for a mean after n
    samples of variance `variance` (Howard et al. 2021, eq. (14); Waudby-Smith et al. 2024,
    Theorem 2.2 with the variance estimated):

        σ · sqrt( 2 (n ρ² + 1) / (n² ρ²) · log( sqrt(n ρ² + 1) / α ) ).

    With probability ≥ 1 − α the true mean lies within ± this of the running mean at every
    n at once (asymptotically, for the estimated variance)."""
    scale = n * rho2 + 1.0
    return np.sqrt(variance) * np.sqrt(
        2.0 * scale / (n * n * rho2) * np.log(np.sqrt(scale) / alpha))


@dataclass(frozen=True)
class SequenceBounds:
    """Where the confidence sequence of candidate − reference stands after the last sample.

    `lower`/`upper`: the running intersection of the bounds since `start` + `from_n` (or the
    last sample's own bounds before that); `n`: samples since `start`; `judged`: at least
    `from_n` of them, so the bounds may decide; `restarts`: how many times the intersection
    came out empty and judging started again (at `start`); `p_value`: anytime-valid, for "no
    difference", over the same looks (the reciprocal of the mixture martingale's running
    maximum: Ville's inequality)."""

    estimate: float
    lower: float
    upper: float
    n: int
    start: int
    judged: bool
    restarts: int
    p_value: float


@dataclass(frozen=True)
class SequencePath:
    """The confidence sequence after every sample: per look (sample i is look i + 1) the
    estimate, the bounds, whether they may decide (`judged`), and the restarts so far."""

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    judged: np.ndarray
    restarts: np.ndarray
    start: int  # where the last segment starts
    p_value: float  # anytime-valid, "no difference", over the last segment's judged looks


def sequence_path(differences: Sequence[float] | np.ndarray, *, confidence: float,
                  design_n: int, from_n: int) -> SequencePath:
    """The confidence sequence of the mean of `differences` (each in [−1, 1]: a paired 0/1
    difference) after every sample, in order.

    The variance is each prefix's mean square with one pseudo-observation of 1 added
    ((Σ d² + 1) / (n + 1)): at least the variance of d and never zero, so a few hundred
    pairs without a discordant one do not read as certainty. From the `from_n`-th sample of
    a segment on, the bounds are the running intersection (max of the lower bounds, min of
    the upper ones). Should the intersection come out empty, the samples since some point
    disagree with those before it (the candidate changed): a new segment starts there and is
    judged afresh (each restart spends another α; the judge records it)."""
    d = np.asarray(differences, dtype=float)
    size = int(d.size)
    alpha = 1.0 - float(confidence)
    rho2 = mixture_rho2(alpha, design_n)
    from_n = max(1, int(from_n))
    est, low_out, high_out = np.zeros(size), np.full(size, -1.0), np.ones(size)
    judged, restarts_out = np.zeros(size, dtype=bool), np.zeros(size, dtype=int)
    start, restarts, p_value = 0, 0, 1.0
    while start < size:
        x = d[start:]
        n = np.arange(1, x.size + 1, dtype=float)
        sums = np.cumsum(x)
        variance = (np.cumsum(x * x) + 1.0) / (n + 1.0)
        radii = sequence_radii(n, variance, alpha=alpha, rho2=rho2)
        means = sums / n
        lower = np.maximum(means - radii, -1.0)
        upper = np.minimum(means + radii, 1.0)
        first = from_n - 1
        if x.size > first:
            lower[first:] = np.maximum.accumulate(lower[first:])
            upper[first:] = np.minimum.accumulate(upper[first:])
        empty = (np.flatnonzero(lower[first:] > upper[first:]) if x.size > first
                 else np.zeros(0, dtype=int))
        stop = x.size if not empty.size else first + int(empty[0])
        est[start:start + stop] = means[:stop]
        low_out[start:start + stop] = lower[:stop]
        high_out[start:start + stop] = upper[:stop]
        judged[start:start + stop] = n[:stop] >= from_n
        restarts_out[start:start + stop] = restarts
        if stop > first:
            # The normal-mixture martingale for mean 0 (its log), at its running maximum.
            scale = n[first:stop] * rho2 + 1.0
            log_m = (rho2 * sums[first:stop] ** 2 / (2.0 * variance[first:stop] * scale)
                     - 0.5 * np.log(scale))
            p_value = float(min(1.0, math.exp(-min(700.0, float(np.max(log_m))))))
        else:
            p_value = 1.0
        if stop == x.size:
            break
        start += stop
        restarts += 1
    return SequencePath(est, low_out, high_out, judged, restarts_out, start, p_value)


def sequence_bounds(differences: Sequence[float] | np.ndarray, *, confidence: float,
                    design_n: int, from_n: int) -> SequenceBounds:
    """Where the confidence sequence (`sequence_path`) stands after the last sample."""
    path = sequence_path(differences, confidence=confidence, design_n=design_n,
                         from_n=from_n)
    if not path.estimate.size:
        return SequenceBounds(0.0, -1.0, 1.0, 0, 0, False, 0, 1.0)
    return SequenceBounds(float(path.estimate[-1]), float(path.lower[-1]),
                          float(path.upper[-1]), int(path.estimate.size - path.start),
                          path.start, bool(path.judged[-1]), int(path.restarts[-1]),
                          path.p_value)


def sequence_verdict(bounds: SequenceBounds, margin: float) -> str:
    """Lower is better: fail when the whole sequence lies above the margin, pass when it lies
    within it, warn in between; insufficient before it may judge."""
    if not bounds.judged:
        return "warn" if bounds.restarts else "insufficient"
    if bounds.lower > margin:
        return "fail"
    if bounds.upper <= margin:
        return "pass"
    return "warn"


def _judge_metric(name: str, signal: list[int], noise: list[int], *, margin: float,
                  min_pairs: int, level: float, sequential: bool = True) -> MetricJudgement:
    gated = name in GATED
    n = len(signal)
    if n == 0:
        return MetricJudgement(0, None, None, None, None, None, None, "", "insufficient",
                               gated)
    if sequential:
        bounds = sequence_bounds(np.asarray(signal, dtype=float) - np.asarray(noise, float),
                                 confidence=level, design_n=min_pairs, from_n=min_pairs)
        # The rates and estimate describe the samples judged now (since the last restart).
        tail_signal, tail_noise = signal[bounds.start:], noise[bounds.start:]
        return MetricJudgement(
            n=n, noise_rate=sum(tail_noise) / len(tail_noise),
            signal_rate=sum(tail_signal) / len(tail_signal), estimate=bounds.estimate,
            lower=bounds.lower, upper=bounds.upper, p_value=bounds.p_value,
            method=SEQUENCE_METHOD, verdict=sequence_verdict(bounds, margin), gated=gated)
    interval = confidence.paired_difference(signal, noise, confidence=level)
    verdict = confidence.judge(interval, margin, min_n=min_pairs,
                               direction="lower_is_better")
    return MetricJudgement(n=n, noise_rate=sum(noise) / n, signal_rate=sum(signal) / n,
                           estimate=interval.estimate, lower=interval.lower,
                           upper=interval.upper, p_value=interval.p_value,
                           method=interval.method, verdict=verdict.verdict, gated=gated)


def _pts(value: float) -> str:
    return f"{value * 100:+.1f}".replace("-", "\u2212")


def _summary(verdict: str, metrics: dict[str, MetricJudgement], margin: float,
             min_pairs: int) -> str:
    """"divergence +0.4 pts [−0.9, +1.8] vs noise floor 2.1 % over 412 pairs: pass
    (margin 2 pts)", naming the other gated metrics that fail or warn."""
    div = metrics["divergence"]
    margin_text = f"margin {margin * 100:g} pts"
    if div.n == 0 or div.estimate is None or div.lower is None or div.upper is None:
        head = f"no pairs compared yet (need {min_pairs})"
    else:
        head = (f"divergence {_pts(div.estimate)} pts [{_pts(div.lower)}, {_pts(div.upper)}]"
                f" vs noise floor {(div.noise_rate or 0) * 100:.1f} % over {div.n} pairs")
        if div.n < min_pairs:
            head += f" (of {min_pairs} needed)"
        every = metrics.get("diverged_any")
        if every is not None and every.n and (every.signal_rate, every.noise_rate) != (
                div.signal_rate, div.noise_rate):
            # Say what was excused, or "noise floor 0.0 %" reads as "no noise".
            head += (f" (near-tie flips excused; with them the candidate diverges on "
                     f"{(every.signal_rate or 0) * 100:.1f} % and the primary from itself on "
                     f"{(every.noise_rate or 0) * 100:.1f} %)")
    # Other gated metrics are named when they fail, or warn on a rise actually seen (a metric
    # at 0 on both sides warns only because few pairs bound it loosely: not news).
    others = [f"{name.replace('_', ' ')} {m.verdict}" for name, m in metrics.items()
              if m.gated and name != "divergence" and (
                  m.verdict == "fail" or (m.verdict == "warn" and (m.estimate or 0) > 0))]
    tail = f"; {', '.join(others)}" if others else ""
    return f"{head}: {verdict} ({margin_text}){tail}"


def judge_pairs(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], *,
                margin: float, min_pairs: int, confidence: float,
                sequential: bool = True) -> RunJudgement:
    """The run's verdict from (noise metrics, signal metrics) per pair, the pairs in the
    order they arrived (the confidence sequence is judged look by look in that order).

    Per metric, only the pairs where both comparisons have it count. The run fails when any
    gated metric fails; else it is insufficient while divergence has fewer than min_pairs
    pairs; else it warns when any gated metric warns; else it passes. `sequential=False`
    judges each call as a fixed sample (Newcombe's interval): valid for one look only, kept
    for comparison (benchmarks/verdict_stability.py)."""
    signal: dict[str, list[int]] = {name: [] for name in METRICS}
    noise: dict[str, list[int]] = {name: [] for name in METRICS}
    for noise_metrics, signal_metrics in pairs:
        nv, sv = metric_values(noise_metrics), metric_values(signal_metrics)
        for name in METRICS:
            if name in nv and name in sv:
                noise[name].append(nv[name])
                signal[name].append(sv[name])
    judged = {name: _judge_metric(name, signal[name], noise[name], margin=margin,
                                  min_pairs=min_pairs, level=confidence,
                                  sequential=sequential)
              for name in METRICS}
    gated = [judged[name] for name in GATED]
    if any(m.verdict == "fail" for m in gated):
        verdict = "fail"
    elif judged["divergence"].n < min_pairs:
        verdict = "insufficient"
    elif any(m.verdict == "warn" for m in gated):
        verdict = "warn"
    else:
        verdict = "pass"
    return RunJudgement(verdict=verdict, summary=_summary(verdict, judged, margin, min_pairs),
                        pairs=len(pairs), margin=margin, min_pairs=min_pairs,
                        confidence=confidence, metrics=judged)


SIDES: tuple[str, ...] = ("primary", "secondary", "candidate")
LATENCY_FIGURES: tuple[str, ...] = ("ttft_ms", "tpot_ms", "latency_ms")


def latency_summary(sides: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Side -> figure -> {n, p50, p95} over the pairs' stored sides (ShadowPair.sides), each
    side's successful answers only (an error's timing says nothing about speed). TTFT and
    TPOT exist for streamed answers only; latency_ms (the whole answer) for every answer.
    The three sides answered the same requests at the same moment, so their percentiles
    compare like with like."""
    import numpy as np

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for side in SIDES:
        figures: dict[str, dict[str, Any]] = {}
        for figure in LATENCY_FIGURES:
            values = [float(v) for pair in sides
                      if isinstance(info := pair.get(side), Mapping) and not info.get("error")
                      and isinstance(v := info.get(figure), int | float)
                      and not isinstance(v, bool)]
            if values:
                p50, p95 = np.percentile(values, [50, 95])
                figures[figure] = {"n": len(values), "p50": round(float(p50), 2),
                                   "p95": round(float(p95), 2)}
        if figures:
            out[side] = figures
    return out
