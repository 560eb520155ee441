"""Worker code: the evidence jobs record what they measured (`evidence_record`), the
`plans.refresh` beat voids approvals whose evidence expired or changed, and
`plans.rehearsal_finish` ends a rehearsal."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool
from fleetctl.traffic.models import Drain, Route
from fleetctl.webhooks.services import notify
from migrations_plan import evidence as ev
from migrations_plan.models import CheckStatusChange, Evidence, GateCheck, Plan, StageMove
from migrations_plan.services._shared import (
    _evidence_problems,
    _lock,
    _measured_by_whom,
    _store_evidence,
    _void_stale_approvals,
)


def evidence_record(*, actor: Actor, pool: Pool, kind: str, verdict: str, summary: str,
                    data: Any = None, url: str = "", route: Route | None = None,
                    model_id: str = "", ttl_hours: float | None = None,
                    source: str = "") -> Evidence:
    """Record what one of fleetctl's own jobs measured about a pool, bound to the pool as it is
    now. Only the platform's jobs call this (the actor is a system actor, e.g.
    `Actor.for_system("benchmark")`); the API does not expose it. `source` names the job
    ("benchmark run 12"; default: the actor) and `url` links to its record."""
    actor.require(roles.JOBS, action="evidence.record", target=pool)
    known = ev.KINDS.get(kind)
    if known is None:
        raise ValidationError({"kind": [f"Unknown evidence kind {kind!r}; kinds: "
                                        f"{', '.join(sorted(ev.KINDS))}."]})
    if not known.measured:
        raise ValidationError({"kind": [f"{kind} is what other systems report: record it with "
                                        f"evidence_report (POST /api/v1/evidence/)."]})
    if not actor.system:
        raise ValidationError({"kind": [
            f"{kind} is measured by fleetctl ({_measured_by_whom(known)}); only its own jobs "
            f"record it, not {actor.label}."]})
    if data is not None and not isinstance(data, dict):
        raise ValidationError({"data": ["An object of numbers and labels."]})
    _evidence_problems(known, verdict=verdict, summary=summary, data=data, ttl_hours=ttl_hours)
    return _store_evidence(actor=actor, pool=pool, kind=kind, verdict=verdict, summary=summary,
                           data=data, url=url, route=route, model_id=model_id,
                           ttl_hours=ttl_hours, source=source or actor.label)


def _worse(now: str, before: str) -> bool:
    """`now` is a worse status than `before` (ev.STATUSES runs worst first; a word it does
    not know is never worse)."""
    rank = {status: i for i, status in enumerate(ev.STATUSES)}
    return rank.get(ev.normalise_status(now), len(rank)) < \
        rank.get(ev.normalise_status(before), len(rank))


def passed_gate_risks(plan: Plan, current: ev.GateEvaluation | None = None) -> list[str]:
    """What the gates up to the current one lost: a check whose evidence stopped counting
    because the pool reports something new of itself (being re-verified); and, for each
    stage before the current one, the gate as its advance recorded it (the move's snapshot)
    against the same gate now — a check whose status got worse (pass → fail, or its evidence
    expired: → insufficient data). Checks added since are not the approval's. Each gate is
    evaluated once (`current`: the current stage's, when the caller has it)."""
    gates = {stage: current if current is not None and stage == plan.stage
             else ev.evaluate_gate(plan, stage=stage) for stage in range(1, plan.stage + 1)}
    risks = [f"stage {stage}: {o.check.title} is being re-verified: "
             f"{o.result.numbers['expired_why']}"[:600]
             for stage, gate in gates.items() for o in gate.outcomes if _reported_change(o)]
    moves = StageMove.objects.filter(plan=plan, kind=StageMove.Kind.ADVANCE).order_by("-at")
    seen: set[str] = set()
    for move in moves:
        if move.from_state in seen or not move.from_state.startswith("stage-"):
            continue
        seen.add(move.from_state)
        stage = int(move.from_state.removeprefix("stage-"))
        if stage >= plan.stage:
            continue  # a stage the plan went back to: its gate is the current one
        then = {c.get("key"): c.get("status") for c in move.gate_snapshot.get("checks", [])}
        for outcome in gates[stage].outcomes:
            before = then.get(outcome.check.key)
            now = outcome.status
            if before is None or not _worse(now, before) or _reported_change(outcome):
                continue  # (a reported change is listed once, as being re-verified)
            risks.append(f"stage {stage}: {outcome.check.title} was "
                         f"{ev.status_label(before)} when approved, now "
                         f"{ev.status_label(now)}: {outcome.result.summary}"[:600])
    return risks


def _reported_change(outcome: ev.CheckOutcome) -> bool:
    """The check's latest evidence stopped counting because of what the pool reports."""
    why = str(outcome.result.numbers.get("expired_why") or "")
    return any(why.startswith(ev.FINGERPRINT_LABELS[key]) for key in ev.REPORTED_FIELDS)


def _mark_risk(plan: Plan, risks: list[str], system: Actor) -> None:
    """Set or clear the plan's at-risk mark; each change is audited and notified."""
    was = plan.at_risk_since is not None
    if risks == (plan.risk or []) and was == bool(risks):
        return
    plan.at_risk_since = (plan.at_risk_since or timezone.now()) if risks else None
    plan.risk = risks
    plan.save(update_fields=["at_risk_since", "risk"])
    text = ("at risk: " + "; ".join(risks)) if risks else "no longer at risk"
    audit_record(actor=system, action="plan.at_risk", target=plan, message=text[:2000],
                 before={"at_risk": was}, after={"at_risk": bool(risks), "risk": risks})
    notify("plan.at_risk", {"plan": plan.name, "stage": plan.stage, "at_risk": bool(risks),
                            "risk": risks, "url": f"/plans/{plan.name}/"},
           text=f"fleetctl plan {plan.name} (stage {plan.stage}) {text}")


def plan_refresh(*, plan: Plan, now: datetime | None = None) -> list[str]:
    """Re-evaluate the current gate: void approvals whose evidence moved, and put every
    check whose status changed on the plan's timeline; mark the plan at risk when a gate it
    already passed lost what it was approved on. Each status change (and a check's first
    status) is a row of the check's history. Run by beat for every open plan."""
    if not plan.in_stage:
        return []
    _void_stale_approvals(plan)
    system = Actor.for_system("plan-gate")
    changes: list[str] = []
    with transaction.atomic():
        locked = _lock(plan)
        if not locked.in_stage:
            return []
        gate = ev.evaluate_gate(locked, now=now)
        for outcome in gate.outcomes:
            check = outcome.check
            if ev.normalise_status(check.last_status) == outcome.status:
                continue
            if check.last_status:
                line = (f"stage {check.stage}: {check.title} — "
                        f"{ev.status_label(check.last_status)} → "
                        f"{ev.status_label(outcome.status)}: {outcome.result.summary}")
                audit_record(actor=system, action="plan.check.status", target=locked,
                             message=line[:2000], before={"status": check.last_status},
                             after={"status": outcome.status, "check": check.key})
                changes.append(line)
            GateCheck.objects.filter(pk=check.pk).update(last_status=outcome.status,
                                                         last_status_at=gate.at)
            CheckStatusChange.objects.create(check_item=check, status=outcome.status,
                                             at=gate.at,
                                             summary=outcome.result.summary[:300])
        _mark_risk(locked, passed_gate_risks(locked, gate), system)
        if changes:
            notify("gate.changed", {
                "plan": locked.name, "kind": "check-status", "stage": locked.stage,
                "state": locked.state, "gate_status": gate.status, "changes": changes,
                "url": f"/plans/{locked.name}/"},
                text=f"fleetctl plan {locked.name} stage {locked.stage} gate "
                     f"{ev.status_label(gate.status)}: " + "; ".join(changes))
    return changes


def rehearsal_finish(*, drain_id: int, timeout_s: float) -> tuple[bool, Drain | None]:
    """One look at a rehearsal drain (the `plans.rehearsal_finish` task re-queues it while
    it is not done): once the drain completed, restore the split and push it. Returns
    (done, the restore). Done without a restore when the drain failed (it says why on its
    record) or did not complete within `timeout_s` of its request: traffic stays on the
    primary, the safe side."""
    from fleetctl.traffic import push
    from fleetctl.traffic import services as traffic

    drain = Drain.objects.filter(pk=drain_id).first()
    if drain is None or drain.status == Drain.Status.FAILED:
        return True, None
    if drain.status == Drain.Status.COMPLETE:
        if drain.restored_by.exists():  # a look queued twice: the first one restored
            return True, None
        try:
            restore = traffic.drain_restore(actor=Actor.for_system("drain-rehearsal"),
                                            drain=drain,
                                            reason=f"rehearsal over (drain #{drain.pk})")
        except ConflictError:  # someone changed the route since: their split stands
            return True, None
        push.drain_push_now(restore)
        return True, restore
    if timezone.now() - drain.requested_at > timedelta(seconds=timeout_s):
        return True, None
    return False, None
