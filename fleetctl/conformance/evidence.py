"""The evidence kinds this app's probes produce, registered with their producers.

`conformance`: a finished conformance run records one Evidence row about the pool under
test (services.py); the stage-1 check "Passes the OpenAI-contract conformance probe" (rule
`evidence.latest`) reads the newest still-valid one.

`routing-policy`: a finished routing probe of a plan's route (routing_services.py) records one
row about the plan's candidate on that route; the stage-4 check "Routing policy holds" (rule
`routing.policy_holds`, below) reads the newest per route.
"""

from __future__ import annotations

from typing import Any

from migrations_plan.evidence import (
    FAIL,
    INSUFFICIENT,
    PASS,
    WARN,
    CheckResult,
    EvidenceKind,
    Param,
    Rule,
    RuleContext,
    data_schema,
    evidence_ref,
    register_kind,
    register_rule,
)

KIND = "conformance"
PRODUCED_BY = ("the conformance probe (Conformance → Run, the stage-1 gate's button, "
               "fleetctl conformance run, POST /api/v1/conformance-runs/)")

# What a run's evidence row carries in `data` (a run always writes every field; none is
# required so that rows recorded before the probe existed, with no data, still read).
DATA_SCHEMA: dict[str, Any] = data_schema({
    "run": {"type": "integer"},
    "counts": {"type": "object",
               "additionalProperties": {"type": "integer", "minimum": 0}},
    "failing": {"type": "array", "items": {"type": "string"}},
    "required_failing": {"type": "array", "items": {"type": "string"}},
    "required_skipped": {"type": "array", "items": {"type": "string"}},
    "cases": {"type": "object", "additionalProperties": {
        "enum": ["pass", "fail", "skip", "error"]}},
    "primary": {"type": ["string", "null"]},
    "endpoints": {"type": "array", "items": {"type": "string"}},
    "model": {"type": "string"},
})

ROUTING_KIND = "routing-policy"
ROUTING_PRODUCED_BY = ("the routing probe (the stage-4 gate's button, fleetctl conformance "
                       "routing-probe, POST /api/v1/routing-probes/)")
ROUTING_DATA_SCHEMA: dict[str, Any] = data_schema({
    "probe": {"type": "integer"},
    "route": {"type": "string"},
    "gateways": {"type": "array", "items": {"type": "string"}},
    "requests": {"type": "integer", "minimum": 0},
    "violations": {"type": "array", "items": {"type": "string"}},
    "unjudged": {"type": "integer", "minimum": 0},
    "pools_seen": {"type": "array", "items": {"type": "string"}},
})


def policy_holds(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    """For every route of the plan, the newest routing probe within N days found no
    violation: a violation on any route fails; a route never probed (or probed too long ago)
    is insufficient data; a probe that could not judge every request warns."""
    days = params["within_days"]
    if not ctx.routes:
        return CheckResult(FAIL, "The plan names no route.")
    valid, expired = ctx.evidence(ROUTING_KIND, within_days=days)
    latest: dict[int, Any] = {}
    for row in valid:  # newest first
        if row.route_id is not None:
            latest.setdefault(row.route_id, row)
    refs = [evidence_ref(row) for row in latest.values()]
    verdicts = {route.name: latest[route.pk].verdict if route.pk in latest else None
                for route in ctx.routes}
    numbers: dict[str, Any] = {"verdicts": verdicts, "within_days": days}
    failed = [r for r in ctx.routes if verdicts[r.name] == "fail"]
    if failed:
        return CheckResult(FAIL, "; ".join(f"{r.name}: {latest[r.pk].summary}" for r in failed),
                           numbers, refs)
    missing = [r.name for r in ctx.routes if verdicts[r.name] is None]
    if missing:
        why = f" (the latest no longer counts: {expired[0][1]})" if expired else ""
        return CheckResult(INSUFFICIENT, f"No routing probe of {', '.join(missing)} in the "
                                         f"last {days:g} days{why}. It comes from "
                                         f"{ROUTING_PRODUCED_BY}.", numbers, refs)
    warned = [r for r in ctx.routes if verdicts[r.name] == "warn"]
    if warned:
        return CheckResult(WARN, "; ".join(f"{r.name}: {latest[r.pk].summary}" for r in warned),
                           numbers, refs)
    return CheckResult(PASS, "The routing policy held on "
                       + "; ".join(f"{r.name} ({latest[r.pk].summary})" for r in ctx.routes)
                       + ".", numbers, refs)


def register() -> None:
    register_kind(EvidenceKind(KIND, "OpenAI-contract conformance", PRODUCED_BY,
                               data_schema=DATA_SCHEMA))
    register_kind(EvidenceKind(ROUTING_KIND, "routing policy through the gateway",
                               ROUTING_PRODUCED_BY, data_schema=ROUTING_DATA_SCHEMA))
    register_rule(Rule(
        "routing.policy_holds", ROUTING_KIND, "Routing policy holds (probed within "
                                              "{within_days:g} days)",
        "A probe through each route's gateways (one prompt at each end of every context "
        "tier, one of unknown size, the route's jurisdiction on a pinned route) found every "
        "request answered by a pool its tier and pin allow, and every due refusal (413, 503) "
        "answered by the gateway itself; the newest probe of each route decides.",
        {"within_days": Param(float, 7.0, "oldest acceptable probe, days", 0.01, 365)},
        policy_holds))
