"""What a person's writes and the workers share: refusals audited as `denied`, locking an
open plan, moving a plan between stages, voiding approvals whose evidence moved on,
pushing the drains a move made, and storing evidence."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record, audit_refused, snapshot
from fleetctl.core.errors import DomainError
from fleetctl.fleet.models import Pool
from fleetctl.traffic.models import Drain, Route
from fleetctl.webhooks.services import notify
from migrations_plan import evidence as ev
from migrations_plan import permissions
from migrations_plan.models import Approval, Evidence, Plan, StageMove

# Stage 3's predicted cost per 1M output tokens: an amount and its currency, set together.
PREDICTION_FIELDS = ["predicted_cost_per_1m", "predicted_cost_currency", "predicted_cost_source"]


@contextlib.contextmanager
def _refusals(actor: Actor, action: str, target: object) -> Iterator[None]:
    """Audit a refused attempt (a rule said no) and let the error answer the caller. Role
    checks (`Actor.require`) run before this block and record their own refusals."""
    try:
        yield
    except DomainError as exc:
        audit_refused(actor=actor, action=action, target=target, message=exc.message)
        raise
    except ValidationError as exc:
        audit_refused(actor=actor, action=action, target=target, message="; ".join(exc.messages))
        raise


def _person(actor: Actor, doing: str) -> Any:
    """Approvals, attestations and authorship belong to a named person signed in."""
    permissions.enforce(permissions.person_refusal(actor, doing))
    return actor.user


def _open(plan: Plan) -> None:
    permissions.enforce(permissions.closed_refusal(plan))


def _lock(plan: Plan) -> Plan:
    return Plan.objects.select_for_update().select_related(
        "candidate_pool__region", "primary_pool", "created_by", "owner").get(pk=plan.pk)


def _record_prediction(*, actor: Actor, plan: Plan) -> None:
    """Entering stage 3 with no predicted cost: record the candidate's benchmark-derived cost
    per 1M output tokens now, which the soak's measured cost is checked against. A cost that
    no longer holds (its hourly rate or currency changed since: `Pool.cost_stale_reason`) or
    that no benchmark measured is not a prediction: nothing is recorded, and the timeline says
    so, for a lead to set one."""
    if plan.predicted_cost_per_1m is not None:
        return
    from fleetctl.fleet.interruption import effective_rate

    pool = plan.candidate_pool
    cost, stale = pool.cost_per_1m_output_tokens, pool.cost_stale_reason
    tax = effective_rate(pool)  # the soak's measured cost includes it: so does the prediction
    if cost is None or stale or tax.not_measured:
        why = (f"its cost is stale: {stale}" if stale else
               "no benchmark has measured its cost per 1M output tokens" if cost is None
               else f"cost is {tax.not_measured}")
        audit_record(actor=actor, action="plan.update", target=plan,
                     message=f"no predicted cost recorded on entering stage 3: "
                             f"{pool.name}'s {why}; a platform lead can set one "
                             f"(predicted_cost_per_1m and predicted_cost_currency)")
        return
    before = snapshot(plan, PREDICTION_FIELDS)
    plan.predicted_cost_per_1m = cost = tax.apply(cost)
    plan.predicted_cost_currency = pool.cost_currency or pool.currency
    taxed = f", incl. interruption tax +{tax.uplift_pct:.1f} %" if tax.interruptible else ""
    plan.predicted_cost_source = (
        f"the candidate's benchmark cost when the plan entered stage 3 "
        f"({pool.cost_source or pool.name}{taxed})")[:200]
    plan.predicted_cost_at = timezone.now()
    plan.save(update_fields=[*PREDICTION_FIELDS, "predicted_cost_at"])
    audit_record(actor=actor, action="plan.update", target=plan,
                 message=f"predicted cost recorded on entering stage 3: {cost} "
                         f"{plan.predicted_cost_currency} per 1M output tokens "
                         f"({plan.predicted_cost_source})",
                 before=before, after=snapshot(plan, PREDICTION_FIELDS))


def _void_stale_approvals(plan: Plan, *, actor: Actor | None = None) -> list[Approval]:
    """Void the current stage's approvals whose evidence changed or expired. In a transaction
    of its own: a voided approval stays voided even if what follows is refused."""
    voided: list[Approval] = []
    with transaction.atomic():
        locked = _lock(plan)
        active = list(locked.approvals.filter(stage=locked.stage, voided_at__isnull=True,
                                              used_at__isnull=True))
        if not active or not locked.in_stage:
            return voided
        gate = ev.evaluate_gate(locked)
        for standing in permissions.approval_standings(active, gate):
            if standing.counts:
                continue
            _void_approval(standing.approval, plan=locked, at=gate.at,
                           why=standing.why_not or "",
                           actor=actor or Actor.for_system("plan-gate"))
            voided.append(standing.approval)
    return voided


def _void_approval(approval: Approval, *, plan: Plan, at: datetime, why: str,
                   actor: Actor) -> None:
    """Void one approval, saying why, and record it on its plan's audit log."""
    approval.voided_at = at
    approval.void_reason = why
    approval.save(update_fields=["voided_at", "void_reason"])
    audit_record(actor=actor, action="plan.approval.void", target=plan,
                 message=f"approval by {approval.by.get_username()} of stage "
                         f"{approval.stage} voided: {why}", after={"approval": approval.pk})


# Called with (plan, move) in a stage move's transaction, after it is recorded: the batch app
# pauses the candidate's jobs that the plan's new stage no longer allows (fleetctl/batch/
# stage_moves.py). Plans cannot import batch (the layers), hence a hook.
STAGE_MOVE_HOOKS: list[Callable[[Plan, StageMove], object]] = []

# Called with the row once a piece of evidence committed: the economics app judges the
# business case of the plans on that pool again (fleetctl/economics/). One hook's trouble is
# logged and never stops the others, nor the evidence.
EVIDENCE_HOOKS: list[Callable[[Evidence], object]] = []


def _evidence_hooks_run(row: Evidence) -> None:
    import logging

    for hook in list(EVIDENCE_HOOKS):
        try:
            hook(row)
        except Exception:  # the evidence is stored; one hook must not stop others
            logging.getLogger("fleetctl.plans").exception(
                "evidence hook %s failed for evidence %s", hook, row.pk)


def _move(*, actor: Actor, plan: Plan, to_state: str, kind: str, reason: str,
          gate: ev.GateEvaluation | None = None, approvals: list[Approval] | None = None,
          drains: list[Drain] | None = None) -> StageMove:
    from_state, from_stage = plan.state, plan.stage
    now = timezone.now()
    plan.state = to_state
    if to_state.startswith("stage-"):
        plan.stage = int(to_state.removeprefix("stage-"))
    if plan.stage != from_stage:  # a pause and its resume keep the age in stage
        plan.stage_entered_at = now
    if to_state in Plan.CLOSED_STATES:
        plan.closed_at = now
    plan.save(update_fields=["state", "stage", "stage_entered_at", "closed_at"])
    gate_snapshot = gate.snapshot() if gate is not None else {}
    move = StageMove.objects.create(
        plan=plan, kind=kind, from_state=from_state, to_state=to_state, by=actor.label, at=now,
        reason=reason, gate_snapshot=gate_snapshot,
        snapshot_hash=ev.snapshot_hash(gate_snapshot) if gate_snapshot else "")
    if approvals:
        move.approvals.set(approvals)
    if drains:
        move.drains.set(drains)
    audit_record(
        actor=actor, action=f"plan.{kind}", target=plan, message=reason,
        before={"state": from_state},
        after={"state": to_state, "move": move.pk,
               "gate_status": gate.status if gate is not None else None,
               "snapshot_hash": move.snapshot_hash or None,
               "approvals": [a.by.get_username() for a in approvals or []],
               "drains": [d.pk for d in drains or []]})
    if plan.stage == 3 and from_stage != 3:
        _record_prediction(actor=actor, plan=plan)
    for hook in STAGE_MOVE_HOOKS:
        hook(plan, move)
    notify("gate.changed", {
        "plan": plan.name, "kind": kind, "from_state": from_state, "to_state": to_state,
        "stage": plan.stage, "by": actor.label, "reason": reason,
        "gate_status": gate.status if gate is not None else None, "move": move.pk,
        "url": f"/plans/{plan.name}/"},
        text=f"fleetctl plan {plan.name}: {from_state} → {to_state} ({kind}) by "
             f"{actor.label}" + (f": {reason}" if reason else ""))
    return move


def _push_drains(drains: list[Drain]) -> None:
    """The drains' first push, by name, once the transaction that stored them has committed
    (the push engine refuses to run inside one)."""
    from fleetctl.traffic import push

    for drain in drains:
        push.drain_push_now(drain)


# --- evidence ---------------------------------------------------------------------------------

def _measured_by_whom(kind: ev.EvidenceKind) -> str:
    return kind.produced_by or "a fleetctl job (none in this version yet)"


def _evidence_problems(kind: ev.EvidenceKind, *, verdict: str, summary: str, data: Any,
                       ttl_hours: float | None) -> None:
    if verdict not in Evidence.Verdict.values:
        raise ValidationError({"verdict": [f"Verdict is one of "
                                           f"{', '.join(Evidence.Verdict.values)}."]})
    if not summary.strip():
        raise ValidationError({"summary": ["Say what was found, in one line."]})
    if ttl_hours is not None and not (0 < ttl_hours <= 24 * 365):
        raise ValidationError({"ttl_hours": ["Between 0 and 8760 hours."]})
    problems = ev.data_problems(kind, {} if data is None else data)
    if problems:
        raise ValidationError({"data": [f"Does not match the {kind.name} kind's data schema "
                                        f"(GET /api/v1/evidence-kinds/): {p}" for p in problems]})


def _store_evidence(*, actor: Actor, pool: Pool, kind: str, verdict: str, summary: str,
                    data: Any, url: str, route: Route | None, model_id: str,
                    ttl_hours: float | None, source: str, reported_by: str = "",
                    about: str = "") -> Evidence:
    model_ids = [model_id] if model_id else ([route.model_id] if route else
                                             list(pool.models.values_list("model_id", flat=True)))
    if model_id and not pool.models.filter(model_id=model_id).exists():
        raise ValidationError({"model_id": [f"{pool.name} does not serve {model_id}."]})
    now = timezone.now()
    row = Evidence(kind=kind, pool=pool, route=route, model_id=model_id or
                   (route.model_id if route else ""), observed_at=now,
                   expires_at=now + timedelta(hours=ttl_hours) if ttl_hours else None,
                   pool_fingerprint=ev.pool_fingerprint(pool, model_ids), verdict=verdict,
                   summary=summary.strip()[:300], data=data or {}, url=url[:300],
                   source=source[:150], reported_by=reported_by, about=about)
    row.full_clean()
    with transaction.atomic():
        row.save()
        said = f"reported by {reported_by} about {about}" if reported_by else f"{kind}"
        audit_record(actor=actor, action="evidence.record", target=pool,
                     message=f"{said}: {verdict} — {row.summary}",
                     after={"evidence": row.pk, "kind": kind, "verdict": verdict,
                            **({"reported_by": reported_by, "about": about}
                               if reported_by else {})})
        transaction.on_commit(lambda: _evidence_hooks_run(row))
    return row
