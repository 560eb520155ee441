"""Stage 4's "Per-pool percentiles held for N days", measured from the standing watch's rows.

`watch.held` reads the `WatchVerdict` history of the plan's candidate on each of the plan's
routes (every watch of that pool there, oldest to newest) and measures, back from the newest
window, the span covered by passing windows with no failed window and no gap longer than
`max_gap_windows` windows (windows not judged, or judged on too little data, are gaps: they
prove nothing). The span runs from the first passing window's start to the newest one's end;
the newest must itself be recent (within the same gap), or the watch is not watching. A failed
window within the last `min_days` is a fail ("held 1.2 days since the failed window at …"):
the percentiles did not hold for the span asked. Warned windows are counted and shown; they
neither break the span nor count as a fail (the ramp guard's warn: the estimate leans bad, its
bound does not say so). Progress is shown until the span is reached ("3.2 of 7 days, no failed
window")."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from migrations_plan.evidence import (
    FAIL,
    INSUFFICIENT,
    PASS,
    CheckResult,
    EvidenceRef,
    Param,
    Rule,
    RuleContext,
    honest,
    register_rule,
)
from migrations_plan.rules import span_text

KIND = "ramp-slo"


def _progress(seconds: float, min_days: float) -> str:
    """ "3.2 of 7 days" (never rounded up to the requirement), or in hours/minutes for the
    demo's short spans."""
    need = min_days * 86400
    if need >= 86400:
        return f"{honest(seconds / 86400, min_days)} of {min_days:g} days"
    if need >= 3600:
        return f"{honest(seconds / 3600, need / 3600)} of {need / 3600:g} h"
    return f"{honest(seconds / 60, need / 60)} of {need / 60:g} min"


def held_span(rows: list[tuple[datetime, datetime, str]], *, now: datetime, max_gap_s: float
              ) -> dict[str, Any]:
    """From verdict rows (window start, window end, verdict), oldest first: the span held
    back from now. Returns {"seconds", "since", "until", "windows", "warned", "failed_at"
    (the newest fail's window start, or None), "stale_s" (how long since the newest passing
    window ended, or None without one)}."""
    judged = [(s, e, v) for s, e, v in rows if v in ("pass", "warn", "fail")]
    out: dict[str, Any] = {"seconds": 0.0, "since": None, "until": None, "windows": 0,
                           "warned": 0, "failed_at": None, "stale_s": None}
    fails = [s for s, _, v in judged if v == "fail"]
    out["failed_at"] = fails[-1] if fails else None
    held = [(s, e, v) for s, e, v in judged if v != "fail"]
    if out["failed_at"] is not None:
        held = [(s, e, v) for s, e, v in held if s > out["failed_at"]]
    if not held:
        return out
    out["stale_s"] = max(0.0, (now - held[-1][1]).total_seconds())
    if out["stale_s"] > max_gap_s:
        return out
    first = len(held) - 1
    while first > 0 and (held[first][0] - held[first - 1][1]).total_seconds() <= max_gap_s:
        first -= 1
    span = held[first:]
    out.update(seconds=(span[-1][1] - span[0][0]).total_seconds(), since=span[0][0],
               until=span[-1][1], windows=len(span),
               warned=sum(1 for _, _, v in span if v == "warn"))
    return out


def watch_held(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    from fleetctl.ramps.models import Watch, WatchVerdict
    from fleetctl.ramps.services.watch import watch_span_s

    min_days, gap_windows = params["min_days"], params["max_gap_windows"]
    if not ctx.routes:
        return CheckResult(INSUFFICIENT, "The plan names no route.")
    refs: list[EvidenceRef] = []
    per_route: dict[str, dict[str, Any]] = {}
    failed, short, missing = [], [], []
    for route in ctx.routes:
        watches = list(Watch.objects.filter(route=route, pool=ctx.candidate)
                       .order_by("started_at", "pk"))
        if not watches:
            missing.append(route.name)
            per_route[route.name] = {"days": 0.0}
            continue
        newest = watches[-1]
        span_s = watch_span_s(newest)
        max_gap_s = gap_windows * span_s
        # Enough history to measure min_days back (a fail older than that does not matter).
        since = ctx.now - timedelta(days=min_days, seconds=max_gap_s + span_s)
        rows = list(WatchVerdict.objects.filter(watch__in=watches, window_end__gt=since,
                                                window_start__lt=ctx.now)
                    .order_by("window_start", "id")
                    .values_list("window_start", "window_end", "verdict"))
        held = held_span(rows, now=ctx.now, max_gap_s=max_gap_s)
        days = held["seconds"] / 86400
        per_route[route.name] = {
            "days": round(days, 4), "windows": held["windows"], "warned": held["warned"],
            "since": held["since"].isoformat() if held["since"] else None,
            "failed_at": held["failed_at"].isoformat() if held["failed_at"] else None,
            "watch": newest.pk, "watch_state": newest.state, "window_s": span_s}
        refs.append(EvidenceRef(
            KIND, f"watch:{newest.pk}",
            f"live watch {newest.pk} of {ctx.candidate.name} on {route.name} ({newest.state})",
            # Stable while the span holds (an approval bound to it stays valid as days pass;
            # the rows read start ever later): it changes when the span breaks or ends.
            version=(f"{newest.pk}:{newest.state}:held" if held["seconds"] >= min_days * 86400
                     else f"{newest.pk}:{newest.state}:"
                          f"{held['since'].isoformat() if held['since'] else '-'}:"
                          f"{held['failed_at'].isoformat() if held['failed_at'] else '-'}"),
            url=f"/ramps/watches/{newest.pk}/", observed_at=held["until"],
            source=f"live watch {newest.pk}"))
        where = f"{route.name}: {_progress(held['seconds'], min_days)}"
        if held["failed_at"] is not None and held["seconds"] < min_days * 86400:
            failed.append(f"{route.name}: a window failed at {held['failed_at']:%Y-%m-%d %H:%M} "
                          f"UTC; held {span_text(held['seconds'])} since")
        elif not newest.active and newest.drain_id:
            failed.append(f"{route.name}: watch {newest.pk} drained the pool "
                          f"({newest.ended_reason[:200]})")
        elif held["seconds"] < min_days * 86400:
            stale = held["stale_s"]
            if not newest.active:
                where += f", watch {newest.pk} ended ({newest.ended_reason[:200]})"
            elif stale is not None and stale > max_gap_s:
                where += f", not judged for {span_text(stale)}"
            short.append(where + (f", {held['warned']} warned window(s)"
                                  if held["warned"] else "") + ", no failed window")
    numbers = {"required_days": min_days, "max_gap_windows": gap_windows, "routes": per_route}
    if failed:
        return CheckResult(FAIL, f"{ctx.candidate.name}'s percentiles did not hold for "
                                 f"{min_days:g} days: " + "; ".join(failed) + ".",
                           numbers, refs)
    if missing:
        return CheckResult(INSUFFICIENT, f"No standing watch of {ctx.candidate.name} on "
                                         f"{', '.join(missing)}: one starts when a guarded "
                                         f"ramp of it completes.", numbers, refs)
    if short:
        return CheckResult(INSUFFICIENT, "Held so far — " + "; ".join(short) + ".",
                           numbers, refs)
    warned = sum(int(r.get("warned") or 0) for r in per_route.values())
    return CheckResult(PASS, f"{ctx.candidate.name}'s percentiles held for "
                             + "; ".join(f"{name} {span_text(r['days'] * 86400)}"
                                         for name, r in per_route.items())
                             + f" (≥ {min_days:g} days), no failed window"
                             + (f", {warned} warned" if warned else "") + ".", numbers, refs)


RULE = Rule(
    "watch.held", KIND, "Per-pool percentiles held for {min_days:g} days",
    "The standing live watch of the candidate on each route (it starts when a guarded ramp "
    "completes): the span covered by its judged windows back from now — passing, no failed "
    "window, no gap longer than the given number of windows — is at least the days asked, "
    "measured from the rows (progress shown until then).",
    {"min_days": Param(float, 7.0, "least span the watch's passing windows covered, days",
                       0.0001, 365),
     "max_gap_windows": Param(float, 3.0, "longest gap (unjudged or too little data) that "
                                          "does not break the span, in windows", 0, 10_000)},
    watch_held)


def register() -> None:
    register_rule(RULE)
