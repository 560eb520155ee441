"""Stage 3's "Batch soak of N days with no manual intervention", measured on the clock.

`soak.sustained` reads the plan candidate's newest soak evidence and asks what its title
says: the soak passed (no manual intervention, its jobs within the plan's error rate and
throughput margins), its scheduled jobs covered at least `min_days` from the first job's
start to the last one's end, and no scheduled job was missed (two job starts further apart
than one and a half times the soak's cadence). A soak still running shows its progress
("3.2 of 7 days, no intervention so far"); the configured length is never read as the
measured one.
"""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise
from typing import Any

from fleetctl.batch.evidence import SOAK_KIND
from migrations_plan.evidence import (
    FAIL,
    INSUFFICIENT,
    PASS,
    CheckResult,
    Param,
    Rule,
    RuleContext,
    evidence_ref,
    register_rule,
)
from migrations_plan.rules import latest_evidence, span_text

# A start-to-start interval longer than this many cadences is a scheduled job that did not run.
MISSED_AFTER = 1.5


def _times(jobs: list[dict[str, Any]]) -> list[tuple[datetime, datetime | None, int]]:
    out = []
    for job in jobs:
        if job.get("started_at"):
            ended = job.get("finished_at")
            out.append((datetime.fromisoformat(job["started_at"]),
                        datetime.fromisoformat(ended) if ended else None, int(job["job"])))
    return sorted(out)


def measured(data: dict[str, Any]) -> tuple[float, list[str]]:
    """(seconds the soak's jobs covered, the scheduled jobs it missed, one sentence each)."""
    times = _times(data.get("jobs") or [])
    if not times:
        return 0.0, []
    last_end = max((end or start) for start, end, _ in times)
    span = (last_end - times[0][0]).total_seconds()
    limit = MISSED_AFTER * float(data.get("every_s") or 0)
    missed = [f"no job between job {a} ({s1:%Y-%m-%d %H:%M}) and job {b} ({s2:%H:%M}): "
              f"{span_text((s2 - s1).total_seconds())} apart, every "
              f"{span_text(float(data.get('every_s') or 0))} scheduled"
              for (s1, _, a), (s2, _, b) in pairwise(times)
              if limit and (s2 - s1).total_seconds() > limit]
    return span, missed


def _running(ctx: RuleContext, min_days: float) -> str | None:
    """A soak of the candidate still running for this plan, said as progress."""
    from fleetctl.batch.models import Soak
    from fleetctl.batch.soak_verdict import soak_interventions

    soak = (Soak.objects.filter(plan=ctx.plan, pool=ctx.candidate, state=Soak.State.RUNNING)
            .order_by("-started_at").first())
    if soak is None:
        return None
    so_far = max(0.0, (ctx.now - soak.started_at).total_seconds())
    touched = soak_interventions(soak)
    return (f"Soak {soak.pk} running: {span_text(so_far)} of {span_text(min_days * 86400)}, "
            + (f"{len(touched)} manual intervention(s) already" if touched
               else "no intervention so far") + ".")


def soak_sustained(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    min_days = params["min_days"]
    valid, _ = ctx.evidence(SOAK_KIND, within_days=params["within_days"])
    running = _running(ctx, min_days)
    if not valid:
        result = latest_evidence(ctx, {"kind": SOAK_KIND, "within_days": params["within_days"]})
        if running:
            result.summary = f"{running} {result.summary}"
        return result
    row = valid[0]
    span, missed = measured(row.data or {})
    numbers = {"soak": (row.data or {}).get("soak"), "measured_days": round(span / 86400, 4),
               "required_days": min_days, "missed_jobs": len(missed)}
    refs = [evidence_ref(row)]
    if row.verdict == "fail":
        return CheckResult(FAIL, row.summary, numbers, refs)
    if missed:
        return CheckResult(FAIL, f"Soak {numbers['soak']} missed {len(missed)} scheduled "
                                 f"job(s): {missed[0]}.", numbers, refs)
    if span < min_days * 86400:
        where = f" {running}" if running else ""
        return CheckResult(INSUFFICIENT, f"Soak {numbers['soak']} passed but covered "
                                         f"{span_text(span)} of the "
                                         f"{span_text(min_days * 86400)} asked.{where}",
                           numbers, refs)
    return CheckResult(PASS, f"{row.summary} Measured: {span_text(span)} of jobs, every "
                             f"scheduled job ran.", numbers, refs)


def register() -> None:
    register_rule(Rule(
        "soak.sustained", SOAK_KIND, "Batch soak of {min_days:g} days with no manual "
        "intervention",
        "The candidate's newest soak passed (no manual intervention, jobs within the plan's "
        "margins), its scheduled jobs covered at least the span from the first start to the "
        "last end on the clock, and none was missed; a running soak shows its progress.",
        {"min_days": Param(float, 7.0, "least span the soak's jobs covered, days", 0, 365),
         "within_days": Param(float, 30.0, "oldest acceptable soak, days", 0.01, 365)},
        soak_sustained))
