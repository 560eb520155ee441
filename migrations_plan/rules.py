"""The evidence kinds and rules this version ships. Each reads what exists today: pool health,
routes and gateways, the pool's cost field, drain records, and `Evidence` rows that evidence
jobs write. Registered when the app loads (apps.py)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from typing import Any

from migrations_plan.evidence import (
    EXTERNAL,
    FAIL,
    INSUFFICIENT,
    PASS,
    WARN,
    CheckResult,
    EvidenceKind,
    EvidenceRef,
    Param,
    Rule,
    RuleContext,
    duration_of,
    evidence_ref,
    honest,
    register_kind,
    register_rule,
    reports_about,
)

# What another system reports: flat facts (numbers, labels, flags), at most 50 of them.
EXTERNAL_DATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "maxProperties": 50,
    "additionalProperties": {"type": ["string", "number", "boolean", "null"],
                             "maxLength": 1000},
}

KIND_DEFINITIONS = [
    # Measured: read from the records fleetctl keeps, never from an Evidence row.
    EvidenceKind("health", "pool health", "the health probe (every pool, continuously)"),
    EvidenceKind("routing", "routing", "routes and gateways (the traffic registry)"),
    EvidenceKind("cost", "cost per 1M output tokens",
                 "the latest passing benchmark (set by bench services); read from the pool"),
    EvidenceKind("drain-rehearsal", "drain rehearsal", "drain records (dashboard, CLI, REST)"),
    # Measured by fleetctl's own jobs. No job in this version produces the ones with an empty
    # producer yet: a check over one reads "insufficient data" until its job records a row;
    # nobody can post them (an `external` report about one is shown, and does not satisfy
    # it). The bench and conformance apps register their kinds again, with their producer and
    # data schema, when they load.
    EvidenceKind("conformance", "OpenAI-contract conformance", ""),
    EvidenceKind("benchmark", "benchmark sweep", ""),
    EvidenceKind("eval", "eval suite", ""),
    EvidenceKind("shadow", "shadow divergence", ""),
    EvidenceKind("soak", "batch soak", ""),
    EvidenceKind("checkpoint-resume", "checkpoint and resume", ""),
    EvidenceKind("cost-arbitrage", "measured cost arbitrage", ""),
    EvidenceKind("ramp-slo", "per-pool SLO during the ramp", ""),
    EvidenceKind("live-quality", "quality on live traffic (stage 4)", ""),
    # Not measured: what another system reports (POST /api/v1/evidence/). Shown as "reported
    # by <system>"; never satisfies a check over a measured kind.
    EvidenceKind(EXTERNAL, "reported by another system",
                 "other systems, through POST /api/v1/evidence/ (scope jobs)",
                 data_schema=EXTERNAL_DATA_SCHEMA, measured=False),
]


def _pool_url(name: str) -> str:
    return f"/pools/{name}/"


def healthy_for(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    from fleetctl.fleet.models import HealthTransition, Pool

    pool = ctx.candidate
    hours = params["hours"]
    if pool.last_probe_at is None:
        return CheckResult(INSUFFICIENT, f"{pool.name} has not been probed yet.")
    if pool.health_state != Pool.Health.HEALTHY:
        return CheckResult(FAIL, f"{pool.name} is {pool.health_state} now "
                                 f"({pool.last_probe_error or 'see its probes'}).",
                           numbers={"state": pool.health_state},
                           evidence=[EvidenceRef("health", f"pool:{pool.pk}", pool.name,
                                                 version=f"{pool.health_state}",
                                                 url=_pool_url(pool.name),
                                                 source="the health probe")])
    since = pool.health_changed_at
    flip = (HealthTransition.objects.filter(pool=pool, to_state=Pool.Health.HEALTHY)
            .order_by("-at", "-id").first())
    healthy_h = ((ctx.now - since).total_seconds() / 3600) if since else 0.0
    ref = EvidenceRef("health", f"health-transition:{flip.pk}" if flip else f"pool:{pool.pk}",
                      f"{pool.name} healthy since {since:%Y-%m-%d %H:%M} UTC" if since
                      else f"{pool.name} healthy", version=str(flip.pk if flip else "healthy"),
                      url=_pool_url(pool.name), observed_at=since, source="the health probe")
    numbers = {"healthy_hours": float(honest(healthy_h, hours, 2)), "required_hours": hours}
    have, need = duration_of(healthy_h, hours)
    if healthy_h < hours:
        return CheckResult(INSUFFICIENT, f"{pool.name} healthy for {have} of the {need} "
                                         f"required.", numbers, [ref])
    return CheckResult(PASS, f"{pool.name} healthy for {have} (≥ {need}).", numbers, [ref])


def _served_revisions(pool: Any) -> dict[str, str]:
    """What the pool's servers report serving, per model: the weights revision its
    `/v1/models` lists (fleet/probe.py); a model it does not report is absent."""
    served = (pool.reported or {}).get("model_revision") or {}
    return {str(m): str(r) for m, r in served.items() if r} if isinstance(served, dict) else {}


def same_revision(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    """Candidate and primary serve the same weights revision of every model of the plan's
    routes, as their servers report it (not as the registry says)."""
    candidate, primary = _served_revisions(ctx.candidate), _served_revisions(ctx.primary)
    numbers: dict[str, Any] = {"candidate_reports": {m: candidate.get(m) for m in ctx.model_ids},
                               "primary_reports": {m: primary.get(m) for m in ctx.model_ids}}
    refs = [EvidenceRef("health", f"pool-reported:{pool.pk}",
                        f"{pool.name} reports "
                        + (", ".join(f"{m}@{r}" for m, r in sorted(rev.items()))
                           or "no weights revision"),
                        version=json.dumps(rev, sort_keys=True), url=_pool_url(pool.name),
                        observed_at=pool.reported_at, source="the health probe")
            for pool, rev in ((ctx.candidate, candidate), (ctx.primary, primary))]
    if not ctx.model_ids:
        return CheckResult(INSUFFICIENT, "The plan names no route, so no model to compare.",
                           numbers)
    silent = [f"{pool.name} does not report the revision of {m}"
              for m in ctx.model_ids for pool, rev in ((ctx.candidate, candidate),
                                                       (ctx.primary, primary)) if m not in rev]
    differ = [f"{m}: {ctx.candidate.name} serves {candidate[m]}, {ctx.primary.name} serves "
              f"{primary[m]}" for m in ctx.model_ids
              if m in candidate and m in primary and candidate[m] != primary[m]]
    if differ:
        return CheckResult(FAIL, "Different weights: " + "; ".join(differ) + ".", numbers, refs)
    if silent:
        return CheckResult(INSUFFICIENT, "Not reported: " + "; ".join(silent) + ".",
                           numbers, refs)
    return CheckResult(PASS, "Both serve " + ", ".join(f"{m}@{candidate[m]}"
                                                       for m in ctx.model_ids) + ".",
                       numbers, refs)


def only_through_route(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    """Callers reach the candidate only through routes (gateways), and which pool serves
    which model is configuration: each route of the plan is carried by a gateway and lists the
    candidate among the pools it may send to."""
    from fleetctl.traffic import selectors

    if not ctx.routes:
        return CheckResult(FAIL, "The plan names no route.")
    problems: list[str] = []
    refs: list[EvidenceRef] = []
    carried: dict[str, list[str]] = {}
    for route in ctx.routes:
        gateways = sorted(g.name for g in route.gateways.all())
        eligible = selectors.pools_eligible(route=route)
        carried[route.name] = gateways
        if not gateways:
            problems.append(f"route {route.name} is carried by no gateway")
        if ctx.candidate.name not in eligible:
            problems.append(f"route {route.name} cannot send to {ctx.candidate.name} "
                            f"(it does not serve {route.model_id} in the route's jurisdiction)")
        refs.append(EvidenceRef("routing", f"route:{route.pk}", f"route {route.name}",
                                version=f"{','.join(gateways)}|{ctx.candidate.name in eligible}",
                                url=f"/traffic/routes/{route.name}/",
                                source="the traffic registry"))
    numbers = {"gateways_by_route": carried}
    if problems:
        text = "; ".join(problems)
        return CheckResult(FAIL, text[:1].upper() + text[1:] + ".", numbers, refs)
    detail = "; ".join(f"{r} via {', '.join(g)}" for r, g in carried.items())
    return CheckResult(PASS, f"{ctx.candidate.name} is reached through routes only: {detail}.",
                       numbers, refs)


def cost_reported(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    pool = ctx.candidate
    max_age = params["max_age_days"]
    primary_cost = ctx.primary.cost_per_1m_output_tokens
    numbers: dict[str, Any] = {
        "candidate_cost_per_1m": str(pool.cost_per_1m_output_tokens)
        if pool.cost_per_1m_output_tokens is not None else None,
        "primary_cost_per_1m": str(primary_cost) if primary_cost is not None else None,
        "currency": pool.currency,
    }
    if pool.cost_per_1m_output_tokens is None or pool.cost_measured_at is None:
        return CheckResult(INSUFFICIENT, f"No cost per 1M output tokens for {pool.name} yet: it "
                                         f"is derived from its latest passing benchmark.",
                           numbers)
    age_days = (ctx.now - pool.cost_measured_at).total_seconds() / 86400
    numbers["age_days"] = round(age_days, 2)
    ref = EvidenceRef("cost", f"pool-cost:{pool.pk}",
                      f"{pool.cost_per_1m_output_tokens} {pool.currency} per 1M output tokens",
                      version=f"{pool.cost_per_1m_output_tokens}@{pool.cost_measured_at.isoformat()}",
                      url=_pool_url(pool.name), observed_at=pool.cost_measured_at,
                      expires_at=pool.cost_measured_at + timedelta(days=max_age),
                      source="its latest passing benchmark")
    stale = pool.cost_stale_reason
    if stale:
        numbers["stale"] = stale
        then = f"{pool.cost_per_1m_output_tokens} {pool.cost_currency or pool.currency}"
        return CheckResult(INSUFFICIENT, f"The cost of {pool.name} ({then} per 1M output "
                                         f"tokens) no longer holds: {stale}.", numbers, [ref])
    if age_days > max_age:
        return CheckResult(INSUFFICIENT, f"Cost of {pool.name} was measured "
                                         f"{honest(age_days, max_age, 0)} days ago (older than "
                                         f"{max_age:g}); re-run its benchmark.",
                           numbers, [ref])
    # The interruption tax of an interruptible pool is in its cost (fleet/interruption.py).
    from fleetctl.fleet.interruption import effective_rate

    tax = effective_rate(pool, on=ctx.now)
    numbers["interruption"] = tax.as_json()
    if tax.not_measured:
        return CheckResult(INSUFFICIENT, f"The cost of {pool.name} is {tax.not_measured}.",
                           numbers, [ref])
    cost = tax.apply(pool.cost_per_1m_output_tokens)
    numbers["candidate_cost_per_1m"] = str(cost)
    if tax.interruptible:  # a changed tax is another cost: approvals bound to it void
        ref = dataclasses.replace(ref, version=f"{ref.version}×{tax.factor}")
    taxed = f" ({tax.text})" if tax.text else ""
    return CheckResult(PASS, f"{pool.name}: {cost} {pool.currency} per 1M output tokens"
                             f"{taxed}, measured {age_days:.1f} days ago.", numbers, [ref])


def _candidate_drain(ctx: RuleContext, route: Any, since: datetime) -> Any:
    """The newest finished drain since `since` that took the candidate's weight off `route`
    (a drain of the pool, or of the whole route while it carried weight)."""
    from fleetctl.traffic.models import Drain

    drains = (Drain.objects.filter(action=Drain.Action.DRAIN, requested_at__gte=since,
                                   revisions__route=route)
              .exclude(status__in=[Drain.Status.PUSHING, Drain.Status.VERIFIED])
              .order_by("-requested_at", "-id"))
    return next((d for d in drains.iterator()
                 if ctx.candidate.name in (d.drained_pools or [])), None)


def drain_rehearsed(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    """For every route of the plan, the latest drain **of the plan's candidate** within N days
    finished, and every gateway verified within the target time (drain call → last gateway's
    read-back matched): a drain that took the candidate's weight off, of the pool or of the
    whole route. A drain of another pool only (a ramp's rollback, an on-call drain) says
    nothing about how fast the candidate's weight comes off, so it is not read."""
    from fleetctl.traffic.models import Drain, GatewayPush

    days, max_ms = params["within_days"], params["max_ms"]
    since = ctx.now - timedelta(days=days)
    refs: list[EvidenceRef] = []
    timings: dict[str, float | None] = {}
    missing, slow, failed, lost = [], [], [], []
    for route in ctx.routes:
        drain = _candidate_drain(ctx, route, since)
        if drain is None:
            missing.append(route.name)
            timings[route.name] = None
            continue
        ms = drain.verified_ms
        timings[route.name] = round(ms, 1) if ms is not None else None
        refs.append(EvidenceRef("drain-rehearsal", f"drain:{drain.pk}",
                                f"drain #{drain.pk} of {ctx.candidate.name} off "
                                f"{route.name}: {drain.status}"
                                + (f", verified in {honest(ms, max_ms, 0)} ms"
                                   if ms is not None else ""),
                                version=f"{drain.pk}:{drain.status}",
                                url=f"/traffic/drains/{drain.pk}/",
                                source=f"drain #{drain.pk}",
                                observed_at=drain.requested_at,
                                expires_at=drain.requested_at + timedelta(days=days)))
        gone = sorted({p.gateway_name for p in GatewayPush.objects.filter(
            revision__drains=drain, status=GatewayPush.Status.ABANDONED)})
        if drain.status != Drain.Status.COMPLETE or ms is None:
            failed.append(f"{route.name} (drain #{drain.pk} {drain.status})")
        elif gone:
            # Verified only on the gateways that remained: not a rehearsal of every gateway.
            lost.append(f"{route.name} (drain #{drain.pk}: {', '.join(gone)} deleted before "
                        f"verifying)")
        elif ms > max_ms:
            slow.append(f"{route.name} ({honest(ms, max_ms, 0)} ms > {max_ms:g} ms)")
    numbers = {"verified_ms_by_route": timings, "target_ms": max_ms, "within_days": days}
    if failed:
        return CheckResult(FAIL, f"Latest drain did not complete: {', '.join(failed)}.",
                           numbers, refs)
    if slow:
        return CheckResult(FAIL, f"Drain slower than the target: {', '.join(slow)}.",
                           numbers, refs)
    if lost:
        return CheckResult(INSUFFICIENT, f"The latest drain did not reach every gateway: "
                                         f"{'; '.join(lost)}. Rehearse it again.", numbers, refs)
    if missing:
        return CheckResult(INSUFFICIENT, f"No drain of {ctx.candidate.name} off "
                                         f"{', '.join(missing)} in the last {days:g} days: "
                                         f"rehearse one.", numbers, refs)
    return CheckResult(PASS, "Drained and verified on every gateway within the target: "
                             + ", ".join(f"{r} {honest(ms, max_ms, 0)} ms"
                                         for r, ms in timings.items()
                                         if ms is not None) + ".", numbers, refs)


def latest_evidence(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    """The latest still-valid Evidence row of one kind decides: its verdict is the check's."""
    from migrations_plan.evidence import KINDS

    kind, days = params["kind"], params["within_days"]
    valid, expired = ctx.evidence(kind, within_days=days)
    label = KINDS[kind].label
    if not valid:
        if expired:
            row, why = expired[0]
            return CheckResult(INSUFFICIENT,
                               f"The latest {label} evidence no longer counts: {why}.",
                               {"expired": len(expired), "expired_why": why},
                               [evidence_ref(row)])
        producer = KINDS[kind].produced_by
        hint = f" It comes from {producer}." if producer else \
            " No job in this version measures it yet."
        return CheckResult(INSUFFICIENT, f"No {label} evidence for {ctx.candidate.name} yet.{hint}")
    row = valid[0]
    status = {"pass": PASS, "warn": WARN, "fail": FAIL}.get(row.verdict, INSUFFICIENT)
    return CheckResult(status, row.summary, {"data": row.data, "observed_at":
                                              row.observed_at.isoformat()}, [evidence_ref(row)])


def ramp_each_step(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    """The candidate's newest guarded ramp decides, step by step: each hold the guard judged
    wrote a `ramp-slo` row (ramps/services/), and the check passes only when every step of
    that ramp has a passing row — one good hold at 1 % says nothing about 50 %. A failing or
    warning step is the check's status; steps not judged yet are insufficient data."""
    from migrations_plan.evidence import KINDS

    valid, expired = ctx.evidence("ramp-slo", within_days=params["within_days"])
    ramp_rows = [row for row in valid if isinstance((row.data or {}).get("ramp"), int)]
    if not ramp_rows:
        if expired:
            row, why = expired[0]
            return CheckResult(INSUFFICIENT, f"The latest ramp evidence no longer counts: {why}.",
                               {"expired": len(expired)}, [evidence_ref(row)])
        return CheckResult(INSUFFICIENT, f"No guarded ramp of {ctx.candidate.name} has been "
                                         f"judged yet. It comes from "
                                         f"{KINDS['ramp-slo'].produced_by or 'guarded ramps'}.")
    ramp = ramp_rows[0].data["ramp"]
    rows = [row for row in ramp_rows if row.data["ramp"] == ramp]
    total = max(int(row.data.get("steps_total") or 0) for row in rows)
    newest: dict[int, Any] = {}
    for row in rows:  # newest first: the first row seen for a step is its latest judgement
        newest.setdefault(int(row.data.get("step", -1)), row)
    refs = [evidence_ref(newest[step]) for step in sorted(newest)]

    def describe(step: int) -> str:
        return f"step {step + 1} ({newest[step].data.get('percent', '?'):g} %)"

    numbers = {"ramp": ramp, "steps_total": total, "steps_judged": len(newest),
               "verdicts": {str(step + 1): newest[step].verdict for step in sorted(newest)}}
    failed = [step for step in sorted(newest) if newest[step].verdict == "fail"]
    if failed:
        return CheckResult(FAIL, f"Ramp {ramp}: {describe(failed[0])} failed — "
                                 f"{newest[failed[0]].summary}", numbers, refs)
    missing = [step for step in range(total) if step not in newest]
    if missing:
        return CheckResult(INSUFFICIENT, f"Ramp {ramp} has held {len(newest)} of its {total} "
                                         f"steps so far; every step must be judged.",
                           numbers, refs)
    warned = [step for step in sorted(newest) if newest[step].verdict == "warn"]
    if warned:
        return CheckResult(WARN, f"Ramp {ramp}: {describe(warned[0])} warned — "
                                 f"{newest[warned[0]].summary}", numbers, refs)
    short = _first_step_short(newest[0].data, params["first_step_min_days"], numbers)
    if short:
        return CheckResult(INSUFFICIENT, f"Ramp {ramp}: {describe(0)} {short}", numbers, refs)
    return CheckResult(PASS, f"Ramp {ramp} held the SLO at each of its {total} steps ("
                             + ", ".join(f"{newest[s].data.get('percent', '?'):g} %"
                                         for s in sorted(newest)) + ").", numbers, refs)


def _first_step_short(data: dict[str, Any], min_days: float, numbers: dict[str, Any]
                      ) -> str | None:
    """Why the first live step did not hold long enough on the clock (`held_s`, as its ramp
    measured it), or None. A week at the first percentage is what lets slow faults (a leak,
    a weekly batch peak) show before the candidate takes more."""
    if min_days <= 0:
        return None
    held_s = data.get("held_s")
    numbers["first_step"] = {"held_days": None if held_s is None else
                             round(float(held_s) / 86400, 4), "required_days": min_days}
    if held_s is None:
        return ("did not record how long it held (a ramp from before holds were timed): "
                "ramp again.")
    if float(held_s) >= min_days * 86400:
        return None
    return (f"held {span_text(float(held_s))} of the {span_text(min_days * 86400)} the first "
            f"live step must hold: a longer first hold, or wait for it.")


def span_text(seconds: float) -> str:
    """A span as people say it: days from a day up, else hours, minutes or seconds."""
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def _kind_names() -> list[str]:
    """Kinds a check can read rows of: the measured ones (reports: `external.reported`)."""
    from migrations_plan.evidence import KINDS

    return sorted(name for name, kind in KINDS.items() if kind.measured)


def _not_measured(about: Any) -> str | None:
    from migrations_plan.evidence import KINDS

    if about in KINDS and KINDS[about].measured:
        return (f"{about} is measured by fleetctl; a report cannot stand in for it (use "
                f"evidence.latest with kind {about}, or a rule of the {about} kind).")
    return None


def external_reported(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    """An organisation's own check, answered by another system: the latest report about it
    decides, and the check says who reported it. It can only speak to what fleetctl does not
    measure (`about` is not a measured kind)."""
    from migrations_plan.evidence import KINDS

    about, days = params["about"], params["within_days"]
    if about in KINDS and KINDS[about].measured:
        return CheckResult(FAIL, f"{about} is measured by fleetctl; a report cannot stand in "
                                 f"for it. Use the rule that reads the measured {about} "
                                 f"evidence instead.")
    reports = [r for r in reports_about(ctx, about)
               if r.observed_at >= ctx.now - timedelta(days=days)]
    if not reports:
        return CheckResult(INSUFFICIENT, f"No report about {about} for {ctx.candidate.name} in "
                                         f"the last {days:g} days (POST /api/v1/evidence/, kind "
                                         f"external, about {about}).")
    row = reports[0]
    status = {"pass": PASS, "warn": WARN, "fail": FAIL}.get(row.verdict, INSUFFICIENT)
    return CheckResult(status, f"Reported by {row.reported_by}: {row.verdict} — {row.summary}",
                       {"data": row.data, "reported_by": row.reported_by,
                        "observed_at": row.observed_at.isoformat()}, [evidence_ref(row)])


RULE_DEFINITIONS = [
    Rule("pool.healthy_for", "health", "Candidate healthy for {hours:g} h",
         "The candidate pool's health probe has reported healthy without a break for N hours.",
         {"hours": Param(float, 24.0, "hours healthy without a break", 0.01, 24 * 90)},
         healthy_for),
    Rule("models.same_revision", "health",
         "Candidate and primary serve the same weights revision",
         "Each model of the plan's routes: the weights revision the candidate's servers report "
         "(`/v1/models`) equals the primary's; different revisions fail, a pool that does not "
         "report one is insufficient data.",
         {}, same_revision),
    Rule("routing.only_through_route", "routing",
         "The model reaches the candidate only through a route",
         "Every route of the plan is carried by a gateway and may send to the candidate; the "
         "model→pool mapping is the route's configuration, not the callers'.",
         {}, only_through_route),
    Rule("cost.reported", "cost",
         "Cost per 1M output tokens reported (≤ {max_age_days:g} days old)",
         "The candidate has a cost per 1M output tokens derived from a benchmark, recent enough.",
         {"max_age_days": Param(float, 30.0, "oldest acceptable measurement, days", 0.01, 365)},
         cost_reported),
    Rule("drain.rehearsed", "drain-rehearsal",
         "Drain rehearsed within {within_days:g} days, verified under {max_ms:g} ms",
         "For each route, the latest drain of the plan's candidate in the window completed "
         "and all gateways verified it under the target time (drain call → last gateway's "
         "read-back). Drains of other pools do not count.",
         {"within_days": Param(float, 7.0, "window, days", 0.01, 365),
          "max_ms": Param(float, 500.0, "target, milliseconds to all gateways verified", 1,
                          600_000)},
         drain_rehearsed),
    Rule("evidence.latest", "conformance", "Latest {kind} evidence passes",
         "The newest still-valid evidence row of a kind decides: pass, warn or fail; none is "
         "insufficient data.",
         {"kind": Param(str, "conformance", "evidence kind", choices=_kind_names),
          "within_days": Param(float, 30.0, "oldest acceptable evidence, days", 0.01, 365)},
         latest_evidence),
    Rule("ramp.each_step", "ramp-slo", "Per-pool percentiles hold at each ramp step",
         "The candidate's newest guarded ramp: every step's hold was judged by the guard "
         "(TTFT p95, TPOT p95 and error rate against the SLO and the primary) and passed, "
         "and its first live step held at least the minimum on the clock (progress shown "
         "until then).",
         {"within_days": Param(float, 30.0, "oldest acceptable ramp evidence, days", 0.01,
                               365),
          "first_step_min_days": Param(float, 7.0, "least time the first live step held, "
                                                   "days (0: any)", 0, 365)},
         ramp_each_step),
    Rule("external.reported", EXTERNAL, "Reported by another system: {about}",
         "An organisation's own check that another system answers (e.g. an SLO bot): the "
         "newest report about it decides, shown as reported by that system. It cannot stand in "
         "for a kind fleetctl measures.",
         {"about": Param(str, "", "what the reports speak to, e.g. slo-burn (not a measured "
                                  "kind)", refuse=_not_measured),
          "within_days": Param(float, 7.0, "oldest acceptable report, days", 0.01, 365)},
         external_reported),
]


def register_builtin() -> None:
    for kind in KIND_DEFINITIONS:
        register_kind(kind)
    for rule in RULE_DEFINITIONS:
        register_rule(rule)
