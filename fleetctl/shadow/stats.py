"""The shadow gate: is the candidate's divergence from the primary within the noise floor
plus the plan's margin? Pure (no Django, no I/O): the judge (services.run_judge) hands it
the stored pairs' metrics, the benchmark (benchmarks/shadow_gate_statistics.py) simulated
ones.

Each pair is two comparisons of the same request (fleetctl.inference.compare): noise = primary
vs secondary (the primary asked again, on another endpoint when it has one), signal =
primary vs candidate. Per metric, the candidate sample is the signal's 0/1 flag and the
reference sample the noise's, on the same requests, so the difference is paired and judged
with confidence.paired_difference (Newcombe's paired interval, exact McNemar) and
confidence.judge (lower is better: fail when the whole interval lies above the margin).

Gated metrics decide the verdict; "diverged_any" is shown, never gated. "divergence" is
compare's `diverged` flag except a lone near-tie text flip (the two sides' tokens within
0.1 nats of each other at the first difference, and nothing else differing): a GPU batch
makes those on the primary itself, so counting them would gate on noise the model does not
own. A near-tie can only be seen when the request asked for logprobs; without them every
text flip counts, on both sides alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


def _judge_metric(name: str, signal: list[int], noise: list[int], *, margin: float,
                  min_pairs: int, level: float) -> MetricJudgement:
    gated = name in GATED
    n = len(signal)
    if n == 0:
        return MetricJudgement(0, None, None, None, None, None, None, "", "insufficient",
                               gated)
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
                margin: float, min_pairs: int, confidence: float) -> RunJudgement:
    """The run's verdict from (noise metrics, signal metrics) per pair.

    Per metric, only the pairs where both comparisons have it count. The run fails when any
    gated metric fails; else it is insufficient while divergence has fewer than min_pairs
    pairs; else it warns when any gated metric warns; else it passes."""
    signal: dict[str, list[int]] = {name: [] for name in METRICS}
    noise: dict[str, list[int]] = {name: [] for name in METRICS}
    for noise_metrics, signal_metrics in pairs:
        nv, sv = metric_values(noise_metrics), metric_values(signal_metrics)
        for name in METRICS:
            if name in nv and name in sv:
                noise[name].append(nv[name])
                signal[name].append(sv[name])
    judged = {name: _judge_metric(name, signal[name], noise[name], margin=margin,
                                  min_pairs=min_pairs, level=confidence)
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
