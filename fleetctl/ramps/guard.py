"""The ramp guard: one judgement of a candidate pool against its SLO and its primary, from the
figures telemetry measured over a window. Pure (no database, no clock of its own), so every
rule here is read and tested on its own, and the controller (services.py) only acts on the
decision.

The rule, in plain words:
- wait when there is nothing trustworthy to judge: telemetry is stale (the ingester stopped),
  or the candidate answered fewer than `min_samples` requests in the window (or, when it
  streams, fewer than `min_samples` streamed answers for TTFT). A ramp never advances on no
  data.
- fail only when a confidence bound (99 %) says so clearly: the candidate's *lower* bound is
  over the SLO, or over the primary's *upper* bound plus the latency margin. Comparing
  bound to bound makes two pools drawn from the same distribution (an A/A ramp) all but
  never fail; the controller also needs `failure_threshold` failing checks in a row.
- warn when a point estimate is over a threshold but its bound is not (the data leans bad
  but does not prove it: a person decides).
- pass otherwise.

Latency differences smaller than a floor are never a fail or a warn against the primary: a
p95 measured in log buckets 4.4 % wide, on tens of samples, moves by that much between two
identical pools, and nobody rolls back a ramp for it.

Requests the client abandoned (client disconnects: telemetry counts them apart) are not the
pool's: they are in neither the error rate nor the latencies the guard judges, nor in the
requests it needs (`min_samples`), so anyone who can reach the gateway and hang up cannot
fail a ramp. They are shown with every judgement. One thing they may mean is the pool's,
though: clients giving up on a slow pool, whose slowest answers are then missing from its
figures. So a check that would pass *waits* instead when the candidate's share of abandoned
requests is clearly over the primary's (bound to bound, and by DISCONNECT_FLOOR or more).
Hang-ups from outside land on every pool in proportion to its weight, so they raise both
shares alike. A disconnect never makes a fail, a warn, or a rollback, and never turns a
failing check into a wait.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.telemetry.selectors import Figure, PoolStats

# A candidate's TTFT p95 this close to the primary's (ms) is the same pool for the guard's
# purposes: below it, bucket width and sampling noise dominate, and the SLO itself (checked
# separately) is what protects users.
TTFT_FLOOR_MS = 25.0
# TPOT is per token (tens of ms): the same reasoning at its scale.
TPOT_FLOOR_MS = 2.0

# A candidate whose clients abandon at most this much more of its requests than the
# primary's (a share, 0..1) is not waited for, whatever the bounds say.
DISCONNECT_FLOOR = 0.05

WAIT, PASS, WARN, FAIL = "wait", "pass", "warn", "fail"


@dataclass(frozen=True)
class Thresholds:
    slo_ttft_p95_ms: float
    slo_tpot_p95_ms: float
    slo_error_rate: float
    latency_margin_pct: float
    # Whole-answer latency (the gateway's request duration, streamed or not), when the plan
    # states one: a route whose callers never stream has no first-token latency to judge.
    slo_e2e_p95_ms: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Judgement:
    decision: str  # wait | pass | warn | fail
    reasons: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)


def judge(*, candidate: PoolStats, primary: PoolStats | None, thresholds: Thresholds,
          min_samples: int, now: datetime, stale_after_s: float) -> Judgement:
    """The decision, the reasons (plain sentences with the numbers) and the numbers used."""
    numbers = {"candidate": stats_dict(candidate),
               "primary": stats_dict(primary) if primary is not None else None,
               "thresholds": thresholds.as_dict(), "min_samples": min_samples,
               "window": {"since": candidate.since.isoformat(),
                          "until": candidate.until.isoformat(),
                          "seconds": round((candidate.until - candidate.since)
                                           .total_seconds(), 3)},
               "floors_ms": {"ttft": TTFT_FLOOR_MS, "tpot": TPOT_FLOOR_MS},
               "disconnect_floor": DISCONNECT_FLOOR}
    waiting = _wait_reasons(candidate, primary, min_samples, now, stale_after_s)
    if waiting:
        return Judgement(WAIT, waiting, numbers)
    fails: list[str] = []
    warns: list[str] = []
    name = candidate.pool
    _against_slo(f"{name} error rate", candidate.error_rate, thresholds.slo_error_rate,
                 fails, warns, rate=True)
    judge_ttft = candidate.ttft_p95.n >= min_samples
    if judge_ttft:
        _against_slo(f"{name} TTFT p95", candidate.ttft_p95, thresholds.slo_ttft_p95_ms,
                     fails, warns)
    judge_tpot = candidate.tpot_p95.n >= min_samples
    if judge_tpot:
        _against_slo(f"{name} TPOT p95", candidate.tpot_p95, thresholds.slo_tpot_p95_ms,
                     fails, warns)
    judge_e2e = thresholds.slo_e2e_p95_ms is not None and \
        candidate.duration_p95.n >= min_samples
    if judge_e2e:
        _against_slo(f"{name} whole-answer p95", candidate.duration_p95,
                     float(thresholds.slo_e2e_p95_ms or 0), fails, warns)
    if primary is not None and primary.requests >= min_samples:
        if judge_ttft and primary.ttft_p95.n >= min_samples:
            _against_primary("TTFT p95", candidate, primary, candidate.ttft_p95,
                             primary.ttft_p95, thresholds.latency_margin_pct, TTFT_FLOOR_MS,
                             fails, warns)
        if judge_tpot and primary.tpot_p95.n >= min_samples:
            _against_primary("TPOT p95", candidate, primary, candidate.tpot_p95,
                             primary.tpot_p95, thresholds.latency_margin_pct, TPOT_FLOOR_MS,
                             fails, warns)
    if fails:
        return Judgement(FAIL, fails + warns, numbers)
    if warns:
        return Judgement(WARN, warns, numbers)
    abandoned = _abandoned_more(candidate, primary, min_samples)
    if abandoned:
        return Judgement(WAIT, abandoned, numbers)
    held = _held(candidate, thresholds, ttft=judge_ttft, tpot=judge_tpot, e2e=judge_e2e)
    held += _disconnects_note(candidate, primary)
    return Judgement(PASS, held, numbers)


def failures_after(previous: int, decision: str) -> int:
    """The count of failing checks in a row after one more judgement: a fail adds one, a
    wait (nothing trustworthy to judge) leaves it, a pass or a warn resets it. The ramp
    controller and the standing watch act only when it reaches their `failure_threshold`,
    so a single noisy window never rolls back nor drains."""
    if decision == FAIL:
        return previous + 1
    return previous if decision == WAIT else 0


def _held(candidate: PoolStats, thresholds: Thresholds, *, ttft: bool, tpot: bool,
          e2e: bool) -> list[str]:
    """What a passing check says: each figure judged against its SLO, and what was not
    judged and why."""
    held = [f"{candidate.pool} held its SLO over {candidate.requests} requests: error rate "
            f"{_rate(candidate.error_rate.value)} (SLO {_rate(thresholds.slo_error_rate)})"
            + (f", TTFT p95 {_ms(candidate.ttft_p95.value)} (SLO "
               f"{_ms(thresholds.slo_ttft_p95_ms)})" if ttft else "")
            + (f", TPOT p95 {_ms(candidate.tpot_p95.value)} (SLO "
               f"{_ms(thresholds.slo_tpot_p95_ms)})" if tpot else "")
            + (f", whole-answer p95 {_ms(candidate.duration_p95.value)} (SLO "
               f"{_ms(thresholds.slo_e2e_p95_ms or 0)})" if e2e else "") + "."]
    if not ttft:
        held.append(f"TTFT not judged: {candidate.ttft_p95.n} streamed answers (the gateway "
                    f"times the first byte of streamed answers only)"
                    + ("; whole answers are judged instead." if e2e else "."))
    if not tpot:
        held.append(f"TPOT not judged: {candidate.tpot_p95.n} samples from the pool's "
                    f"/metrics.")
    return held


def _disconnects_note(candidate: PoolStats, primary: PoolStats | None) -> list[str]:
    """Say how many requests the clients abandoned, when they did: shown, never judged."""
    parts = [f"{stats.pool} {stats.client_disconnects} "
             f"({_rate(stats.disconnect_rate.value)})"
             for stats in (candidate, primary) if stats is not None and stats.client_disconnects]
    if not parts:
        return []
    return [f"Client disconnects, not counted against any pool: {', '.join(parts)}."]


def _abandoned_more(candidate: PoolStats, primary: PoolStats | None,
                    min_samples: int) -> list[str]:
    """The reason to wait when the candidate's clients abandon clearly more of its requests
    than the primary's do (bound to bound, and by the floor); none otherwise, or when the
    primary has too few requests to compare with."""
    if primary is None or primary.requests + primary.client_disconnects < min_samples:
        return []
    cand, prim = candidate.disconnect_rate, primary.disconnect_rate
    if cand.value is None or cand.low is None or prim.value is None or prim.high is None:
        return []
    if cand.low <= prim.high or cand.value - prim.value < DISCONNECT_FLOOR:
        return []
    return [f"Clients abandoned {_rate(cand.value)} of {candidate.pool}'s requests (lower "
            f"bound {_rate(cand.low)}, {candidate.client_disconnects} of {cand.n}) against "
            f"{_rate(prim.value)} of {primary.pool}'s (upper bound {_rate(prim.high)}, "
            f"{primary.client_disconnects} of {prim.n}). They may be giving up on a slow "
            f"pool, whose slowest answers are then missing from its figures: waiting. "
            f"Disconnects never fail a ramp."]


def _wait_reasons(candidate: PoolStats, primary: PoolStats | None, min_samples: int,
                  now: datetime, stale_after_s: float) -> list[str]:
    seen = [s.last_data_at for s in (candidate, primary) if s is not None and s.last_data_at]
    newest = max(seen) if seen else None
    if newest is None or (now - newest).total_seconds() > stale_after_s:
        since = f"{newest:%Y-%m-%d %H:%M:%S} UTC" if newest else "the window started"
        return [f"No telemetry from the gateways since {since} (nothing updated in the last "
                f"{stale_after_s:g} s); is the ingester running?"]
    # A request the pool failed before its first byte and another pool of the tier answered
    # (fell_over) was the pool's to answer: it counts toward judging it (as a failure, in
    # its error rate), so a pool whose every request falls over is judged, not waited on.
    if candidate.requests + candidate.fell_over < min_samples:
        abandoned = (f" ({candidate.client_disconnects} more were abandoned by their clients "
                     f"and do not count)" if candidate.client_disconnects else "")
        return [f"{candidate.pool} answered {candidate.requests} of the {min_samples} requests "
                f"needed to judge it in this window{abandoned}; waiting for more."]
    streamed = candidate.ttft_p95.n
    if 0 < streamed < min_samples:
        return [f"{candidate.pool} streamed {streamed} of the {min_samples} answers needed to "
                f"judge its TTFT in this window; waiting for more."]
    return []


def _against_slo(what: str, figure: Figure, slo: float, fails: list[str], warns: list[str],
                 *, rate: bool = False) -> None:
    show = _rate if rate else _ms
    if figure.value is None:
        return
    bounds = f"{show(figure.value)} (99 % bounds {show(figure.low)}–{show(figure.high)}, " \
             f"n={figure.n})"
    if figure.low is not None and figure.low > slo:
        fails.append(f"{what} is {bounds}: even its lower bound is over the SLO {show(slo)}.")
    elif figure.value > slo:
        warns.append(f"{what} is {bounds}, over the SLO {show(slo)}, but its lower bound is "
                     f"not.")


def _against_primary(what: str, candidate: PoolStats, primary: PoolStats, cand: Figure,
                     prim: Figure, margin_pct: float, floor_ms: float, fails: list[str],
                     warns: list[str]) -> None:
    """Bound to bound: the candidate's lower bound over the primary's upper bound plus the
    margin (and by more than the floor) is a fail; its point estimate over that limit is a
    warn. Without the primary's upper bound (too few samples for it) nothing is concluded."""
    if cand.value is None or prim.high is None:
        return
    limit = prim.high * (1 + margin_pct / 100)
    line = (f"{candidate.pool} {what} is {_ms(cand.value)} (lower bound {_ms(cand.low)}, "
            f"n={cand.n}) against {primary.pool}'s {_ms(prim.value)} (upper bound "
            f"{_ms(prim.high)}, n={prim.n}) + {margin_pct:g} % margin = {_ms(limit)}")
    if cand.low is not None and cand.low > limit and cand.low - prim.high >= floor_ms:
        fails.append(f"{line}: even the candidate's lower bound is over it.")
    elif cand.value > limit and cand.value - prim.high >= floor_ms:
        warns.append(f"{line}: over it, but the candidate's lower bound is not.")


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.2f} %"


def stats_dict(stats: PoolStats) -> dict[str, Any]:
    """PoolStats as JSON (datetimes as ISO strings), for events and evidence."""
    out: dict[str, Any] = {}
    for key, value in dataclasses.asdict(stats).items():
        if key == "reported" and not value:
            continue  # the guard never reads a Prometheus's windows (telemetry.Reported)
        out[key] = value.isoformat() if isinstance(value, datetime) else value
    return out


def with_metrics(judgement: Judgement, measurements: list[dict[str, Any]]) -> Judgement:
    """The guard's own judgement combined with its extra metrics (query checks a ramp lists,
    each measured once: {"status": pass|warn|fail|insufficient, "reason": ...}). A failing
    metric fails the check like the guard's own figures (counted toward the rollback); a
    metric with no data, an error or a source that is down makes a passing or warning check
    wait: the guard never advances on no data, and never rolls back on it either. A warning
    metric warns. The measurements are kept in the numbers (`metrics`)."""
    if not measurements:
        return judgement
    numbers = {**judgement.numbers, "metrics": measurements}
    failing = [m["reason"] for m in measurements if m["status"] == FAIL]
    unknown = [m["reason"] for m in measurements if m["status"] not in (PASS, WARN, FAIL)]
    warning = [m["reason"] for m in measurements if m["status"] == WARN]
    passing = [m["reason"] for m in measurements if m["status"] == PASS]
    if judgement.decision == FAIL or failing:
        return Judgement(FAIL, judgement.reasons * (judgement.decision == FAIL) + failing,
                         numbers)
    if judgement.decision == WAIT or unknown:
        waits = [f"No data to judge: {why}; waiting (the guard never advances on no data)."
                 for why in unknown]
        return Judgement(WAIT, judgement.reasons * (judgement.decision == WAIT) + waits,
                         numbers)
    if judgement.decision == WARN or warning:
        return Judgement(WARN, judgement.reasons * (judgement.decision == WARN) + warning,
                         numbers)
    return Judgement(PASS, judgement.reasons + [f"{why}." for why in passing], numbers)
