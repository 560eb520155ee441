"""Statistics of a benchmark level, from raw samples only; SLO verdicts; cost per 1M tokens.

**Percentiles are exact nearest-rank**: the p-th percentile of n samples is the smallest sample
with at least p % of the samples at or below it, i.e. `sorted(x)[ceil(p/100 × n) − 1]`. Always
an observed value (no interpolation), and unchanged when a sample set is duplicated, so it can
be recomputed from stored per-request rows. Never averaged: parts measured by several client
processes are merged by concatenating their raw samples (`merge`), then summarised once.

Which samples count (published definitions):

- Warm-up requests (`warmup=True`) are left out of everything.
- Latency percentiles (TTFT, TPOT, ITL, E2E) use requests with status "ok" only.
- Error rate = (errors + timeouts) / (ok + errors + timeouts).
- Output tokens/s = output tokens whose chunk arrived inside the steady-state window, over the
  window's length, summed over client processes (each has its own window). Request rate =
  measured requests (started inside the window) over the window, summed likewise.
- Client CPU share = client CPU seconds / wall seconds of the level, the busiest client process.
- Schedule lag: per request, how late it was sent (trace timing: after its deadline; fixed
  concurrency: after its worker was free); loop lag: how late the client's event loop woke a
  5 ms timer. Either one's p99 above the limit means the client, not the server, set the pace.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from fleetctl.fleet.costs import cost_per_1m  # noqa: F401 - re-exported: stats.cost_per_1m

Outcome = Literal["pass", "fail", "insufficient", "invalid"]


class Sample(Protocol):
    """One request's raw result (`runner.RequestResult`, or a stored row)."""

    @property
    def status(self) -> str: ...
    @property
    def warmup(self) -> bool: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def tpot_s(self) -> float | None: ...
    @property
    def e2e_s(self) -> float: ...
    @property
    def itl_s(self) -> Sequence[float]: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def window_tokens(self) -> float: ...
    @property
    def schedule_lag_s(self) -> float: ...
    @property
    def tokens_source(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ClientPart:
    """Rate inputs of one client process for one level (rates add up across processes)."""

    window_s: float
    window_tokens: float
    measured_requests: int
    client_cpu_s: float
    wall_s: float


@dataclass(slots=True)
class LevelSamples:
    """The raw samples of one level, from one client process or merged from several."""

    results: list[Sample]
    parts: list[ClientPart]
    loop_lag_s: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, results: Iterable[Sample], *, window_s: float, client_cpu_s: float = 0.0,
           wall_s: float = 0.0, loop_lag_s: Iterable[float] = ()) -> LevelSamples:
        """One client process's level; its window totals are computed from its results."""
        rows = list(results)
        measured = [r for r in rows if not r.warmup]
        part = ClientPart(window_s=window_s,
                          window_tokens=sum(r.window_tokens for r in rows),
                          measured_requests=len(measured),
                          client_cpu_s=client_cpu_s, wall_s=wall_s)
        return cls(results=rows, parts=[part], loop_lag_s=list(loop_lag_s))


def merge(samples_lists: Iterable[LevelSamples]) -> LevelSamples:
    """Exact merge: raw samples, client parts and lag samples concatenated, nothing averaged."""
    merged = LevelSamples(results=[], parts=[], loop_lag_s=[])
    for samples in samples_lists:
        merged.results.extend(samples.results)
        merged.parts.extend(samples.parts)
        merged.loop_lag_s.extend(samples.loop_lag_s)
    return merged


def percentile(values: Iterable[float], p: float) -> float | None:
    """Nearest-rank percentile (see module doc); None for no values."""
    return percentiles(values, (p,))[0]


def percentiles(values: Iterable[float], ps: Sequence[float]) -> list[float | None]:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return [None] * len(ps)
    out: list[float | None] = []
    for p in ps:
        if not 0 <= p <= 100:
            raise ValueError(f"percentile must be within 0..100, got {p}")
        out.append(ordered[max(0, math.ceil(p / 100 * n) - 1)])
    return out


@dataclass(frozen=True, slots=True)
class LevelSummary:
    n_ok: int
    n_errors: int
    n_timeouts: int
    n_warmup: int  # left out
    n_tokens_fallback: int  # measured requests whose tokens were counted from chunks (no usage)
    error_rate: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    output_tokens_per_s: float
    request_rate_per_s: float
    schedule_lag_p50_s: float | None
    schedule_lag_p99_s: float | None
    loop_lag_p99_s: float | None
    client_cpu_share: float | None
    window_s: float  # the longest client window

    @property
    def n_measured(self) -> int:
        return self.n_ok + self.n_errors + self.n_timeouts


def summarize(samples: LevelSamples) -> LevelSummary:
    measured = [r for r in samples.results if not r.warmup]
    ok = [r for r in measured if r.status == "ok"]
    n_timeouts = sum(1 for r in measured if r.status == "timeout")
    n_errors = len(measured) - len(ok) - n_timeouts
    ttft = percentiles((r.ttft_s for r in ok if r.ttft_s is not None), (50, 95, 99))
    tpot = percentiles((r.tpot_s for r in ok if r.tpot_s is not None), (50, 95))
    itl = percentiles((gap for r in ok for gap in r.itl_s), (50, 95, 99))
    e2e = percentiles((r.e2e_s for r in ok), (50, 95))
    lag = percentiles((r.schedule_lag_s for r in measured), (50, 99))
    parts = [p for p in samples.parts if p.window_s > 0]
    return LevelSummary(
        n_ok=len(ok), n_errors=n_errors, n_timeouts=n_timeouts,
        n_warmup=len(samples.results) - len(measured),
        n_tokens_fallback=sum(1 for r in measured if r.tokens_source != "usage"),
        error_rate=(n_errors + n_timeouts) / len(measured) if measured else None,
        ttft_p50_s=ttft[0], ttft_p95_s=ttft[1], ttft_p99_s=ttft[2],
        tpot_p50_s=tpot[0], tpot_p95_s=tpot[1],
        itl_p50_s=itl[0], itl_p95_s=itl[1], itl_p99_s=itl[2],
        e2e_p50_s=e2e[0], e2e_p95_s=e2e[1],
        output_tokens_per_s=sum(p.window_tokens / p.window_s for p in parts),
        request_rate_per_s=sum(p.measured_requests / p.window_s for p in parts),
        schedule_lag_p50_s=lag[0], schedule_lag_p99_s=lag[1],
        loop_lag_p99_s=percentile(samples.loop_lag_s, 99),
        client_cpu_share=max((p.client_cpu_s / p.wall_s for p in samples.parts if p.wall_s > 0),
                             default=None),
        window_s=max((p.window_s for p in samples.parts), default=0.0),
    )


# ---- verdicts -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_p95_s: float
    tpot_p95_s: float
    error_rate: float  # at most this share of errors + timeouts

    def __post_init__(self) -> None:
        if not (self.ttft_p95_s > 0 and self.tpot_p95_s > 0 and 0 <= self.error_rate < 1):
            raise ValueError("SLO needs ttft_p95_s > 0, tpot_p95_s > 0 and 0 <= error_rate < 1")


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    binding: str  # the SLO term that failed or is closest to its limit, or why not judged
    ratio: float | None  # binding term's value / limit (> 1 fails)
    ratios: dict[str, float]  # every SLO term judged
    reason: str


def verdict(summary: LevelSummary, slo: Slo, *, min_samples: int,
            lag_limit_s: float = 0.010, cpu_limit: float = 0.85) -> Verdict:
    """pass / fail / insufficient / invalid, in this order of precedence: fail when every
    request failed > invalid (the client was the bottleneck) > insufficient (fewer than
    `min_samples` measured requests) > fail (any SLO term above its limit) > pass."""
    ratios = _slo_ratios(summary, slo)
    binding, ratio = max(ratios.items(), key=lambda kv: kv[1]) if ratios else ("none", None)
    if summary.n_measured and summary.n_ok == 0:
        # Nothing succeeded: the server decided this level. (A client spinning on refused
        # connections can look CPU- or lag-bound; that must not hide a pool that is down.)
        return Verdict("fail", "error_rate", ratios.get("error_rate"), ratios,
                       "every request failed")
    lag = max((x for x in (summary.schedule_lag_p99_s, summary.loop_lag_p99_s) if x is not None),
              default=None)
    if lag is not None and lag > lag_limit_s:
        return Verdict("invalid", "client_schedule_lag", lag / lag_limit_s, ratios,
                       f"client lag p99 {lag * 1000:.1f} ms > {lag_limit_s * 1000:g} ms:"
                       " the client set the pace, not the server")
    cpu = summary.client_cpu_share
    if cpu is not None and cpu > cpu_limit:
        return Verdict("invalid", "client_cpu", cpu / cpu_limit, ratios,
                       f"client CPU {cpu:.0%} of a core > {cpu_limit:.0%}:"
                       " the client set the pace, not the server")
    if summary.n_measured < min_samples:
        return Verdict("insufficient", "samples", None, ratios,
                       f"{summary.n_measured} measured requests < {min_samples} required")
    assert ratio is not None  # error_rate is always judged once there are samples
    if ratio > 1:
        return Verdict("fail", binding, ratio, ratios, f"{binding} at {ratio:.2f}× its limit")
    return Verdict("pass", binding, ratio, ratios,
                   f"all terms met; closest: {binding} at {ratio:.2f}× its limit")


def _slo_ratios(summary: LevelSummary, slo: Slo) -> dict[str, float]:
    ratios: dict[str, float] = {}
    if summary.error_rate is not None:
        if slo.error_rate > 0:
            ratios["error_rate"] = summary.error_rate / slo.error_rate
        else:
            ratios["error_rate"] = math.inf if summary.error_rate > 0 else 0.0
    if summary.ttft_p95_s is not None:
        ratios["ttft_p95"] = summary.ttft_p95_s / slo.ttft_p95_s
    if summary.tpot_p95_s is not None:
        ratios["tpot_p95"] = summary.tpot_p95_s / slo.tpot_p95_s
    return ratios


# ---- cost -----------------------------------------------------------------------------------


