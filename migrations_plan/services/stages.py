"""What a person does to move a plan: attest, report evidence, approve, advance, regress,
pause, resume, abandon, and start a rehearsal. Leaving stage 3 or 4 drains the candidate."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError, required_reason
from fleetctl.fleet.models import Pool
from fleetctl.traffic.models import Drain, Route
from migrations_plan import evidence as ev
from migrations_plan import permissions
from migrations_plan.models import (
    STAGE_NAMES,
    Approval,
    Attestation,
    Evidence,
    GateCheck,
    Plan,
    StageMove,
)
from migrations_plan.services._shared import (
    _evidence_problems,
    _lock,
    _measured_by_whom,
    _move,
    _open,
    _push_drains,
    _refusals,
    _store_evidence,
    _void_approval,
    _void_stale_approvals,
)

MIN_JUSTIFICATION = permissions.MIN_JUSTIFICATION
PAST = {"pause": "paused", "regress": "regressed", "abandon": "abandoned", "resume": "resumed"}


# --- attestations -----------------------------------------------------------------------------

def attest(*, actor: Actor, check: GateCheck, note: str) -> Attestation:
    """A person holding the check's role confirms it, in words. Who may, and when, is
    `permissions.attest_refusal`'s answer."""
    plan = check.plan
    with _refusals(actor, "plan.attest", plan):
        permissions.enforce(permissions.attester_refusal(actor, check))
        person, held = actor.user, actor.roles
        if len(note.strip()) < 5:
            raise ValidationError({"note": ["Say what you confirm (a few words at least)."]})
        with transaction.atomic():
            locked = _lock(plan)
            row = GateCheck.objects.select_for_update().get(pk=check.pk)
            existing = (row.attestations.filter(withdrawn_at__isnull=True)
                        .select_related("by").first())
            permissions.enforce(permissions.attest_refusal(locked, row, actor, existing))
            role = check.attest_role if check.attest_role in held else roles.ADMIN
            attestation = Attestation.objects.create(check_item=row, by=person, role=role,
                                                     note=note.strip())
            audit_record(actor=actor, action="plan.attest", target=locked,
                         message=f"stage {row.stage}: {row.title} — {attestation.note}",
                         after={"check": row.key, "role": role})
    return attestation


# --- approvals and stage moves ----------------------------------------------------------------

def approve(*, actor: Actor, plan: Plan, justification: str = "") -> Approval:
    """A platform lead, not the plan's author or owner, signs off the current stage's gate,
    bound to the exact evidence it shows now. Who may, and when, is
    `permissions.approve_refusal`'s answer, asked again on the locked plan."""
    actor.require(roles.APPROVE, action="plan.approve", target=plan)
    with _refusals(actor, "plan.approve", plan):
        permissions.enforce(permissions.decider_refusal(actor, plan, permissions.APPROVE))
        person = actor.user
        justification = justification.strip()
        _void_stale_approvals(plan)
        with transaction.atomic():
            locked = _lock(plan)
            gate = ev.evaluate_gate(locked)
            permissions.enforce(permissions.approve_refusal(
                locked, gate, actor, permissions.stage_approvals(locked, gate),
                justification=justification))
            current_hash = gate.hash()
            approval = Approval.objects.create(
                plan=locked, stage=locked.stage, by=person, gate_status=gate.status,
                justification=justification, snapshot=gate.snapshot(),
                snapshot_hash=current_hash)
            audit_record(actor=actor, action="plan.approve", target=locked,
                         message=justification or f"gate {gate.status}",
                         after={"stage": locked.stage, "gate_status": gate.status,
                                "snapshot_hash": current_hash, "approval": approval.pk})
    return approval


def advance(*, actor: Actor, plan: Plan, reason: str = "") -> Plan:
    """Move to the next stage (from 4: completed), by a platform lead who neither opened nor
    owns the plan. The gate is evaluated again inside the move's transaction; enough
    approvals must hold on exactly that evidence (`permissions.advance_refusal`)."""
    actor.require(roles.APPROVE, action="plan.advance", target=plan)
    with _refusals(actor, "plan.advance", plan):
        permissions.enforce(permissions.decider_refusal(actor, plan, permissions.ADVANCE))
        _void_stale_approvals(plan)
        with transaction.atomic():
            locked = _lock(plan)
            gate = ev.evaluate_gate(locked)
            standings = permissions.stage_approvals(locked, gate)
            permissions.enforce(permissions.advance_refusal(locked, gate, actor, standings))
            approvals = [s.approval for s in standings if s.counts]
            to_state = (Plan.State.COMPLETED if locked.stage == 4
                        else f"stage-{locked.stage + 1}")
            kind = StageMove.Kind.COMPLETE if locked.stage == 4 else StageMove.Kind.ADVANCE
            now = timezone.now()
            for approval in approvals:
                approval.used_at = now
                approval.save(update_fields=["used_at"])
            _move(actor=actor, plan=locked, to_state=to_state, kind=kind, reason=reason,
                  gate=gate, approvals=approvals)
    return locked


def _void_open_approvals(plan: Plan, *, why: str, actor: Actor,
                         stages: set[int] | None = None) -> None:
    rows = plan.approvals.filter(voided_at__isnull=True, used_at__isnull=True)
    if stages is not None:
        rows = rows.filter(stage__in=stages)
    for approval in rows.select_related("by"):
        _void_approval(approval, plan=plan, at=timezone.now(), why=why, actor=actor)


def _drain_candidate(*, actor: Actor, plan: Plan, to_state: str, reason: str) -> list[Drain]:
    """Leaving stage 3 or 4: take the candidate's weight off where the live-weight guard
    (selectors.live_weight_guard) will no longer let it be. Stage 4 → 3: off every route but
    the batch-class routes of its stage-3/4 plans (those it may keep). To stages 1–2, or a
    pause: off every route. Abandoned: off the plan's routes (the pool is no longer this
    plan's candidate; the abandoned plan keeps it off those). Stores the drain in the caller's
    transaction; the caller pushes it after its commit (`_push_drains`)."""
    from fleetctl.traffic import services as traffic
    from migrations_plan.selectors import plan_batch_routes

    only: list[Route] | None
    if to_state == Plan.State.ABANDONED:
        only = list(plan.routes.all())
    elif to_state == Plan.State.STAGE_3:
        keep = {r.pk for r in plan_batch_routes(plan)} | {
            r.pk for other in Plan.objects.filter(
                candidate_pool=plan.candidate_pool,
                state__in=[Plan.State.STAGE_3, Plan.State.STAGE_4]).exclude(pk=plan.pk)
            for r in plan_batch_routes(other)}
        only = list(Route.objects.exclude(pk__in=keep))
    else:
        only = None  # every route
    try:
        drain = traffic.drain_request(
            actor=actor, pool=plan.candidate_pool, routes=only,
            reason=f"plan {plan.name} leaves stage {plan.stage} for {to_state}: {reason}")
    except ConflictError:
        return []  # nothing to drain: the candidate carries no weight there
    return [drain]


def _leave(*, actor: Actor, plan: Plan, to_state: str, kind: str, reason: str,
           permission: str) -> Plan:
    actor.require(permission, action=f"plan.{kind}", target=plan)
    with _refusals(actor, f"plan.{kind}", plan):
        required_reason(reason, "Say why (it goes in the plan's timeline).")
        with transaction.atomic():
            locked = _lock(plan)
            _open(locked)
            if kind == StageMove.Kind.PAUSE and not locked.in_stage:
                raise ConflictError(f"Plan {locked.name} is {locked.state}; only a plan at a "
                                    f"stage can be paused.")
            if kind == StageMove.Kind.RESUME and locked.state != Plan.State.PAUSED:
                raise ConflictError(f"Plan {locked.name} is not paused.")
            if kind == StageMove.Kind.REGRESS:
                target = int(to_state.removeprefix("stage-"))
                if target >= locked.stage:
                    raise ValidationError({"stage": [
                        f"Regress goes back: plan {locked.name} is at stage {locked.stage}; "
                        f"choose a stage before it."]})
            drains: list[Drain] = []
            if locked.state in (Plan.State.STAGE_3, Plan.State.STAGE_4) and \
                    kind != StageMove.Kind.RESUME:
                drains = _drain_candidate(actor=actor, plan=locked, to_state=to_state,
                                          reason=reason)
            if kind == StageMove.Kind.RESUME:
                to_state = f"stage-{locked.stage}"
            stages = None if kind != StageMove.Kind.REGRESS else set(
                range(int(to_state.removeprefix("stage-")), 5))
            if kind != StageMove.Kind.RESUME:
                _void_open_approvals(locked, why=f"plan {PAST[kind]}: {reason.strip()}",
                                     actor=actor, stages=stages)
            _move(actor=actor, plan=locked, to_state=to_state, kind=kind, reason=reason.strip(),
                  drains=drains)
    _push_drains(drains)
    return locked


def regress(*, actor: Actor, plan: Plan, to_stage: int, reason: str) -> Plan:
    """Go back to an earlier stage. From stage 3 or 4 the candidate is drained first (4 → 3
    keeps its plan's batch-class routes; see `_drain_candidate`)."""
    if to_stage not in STAGE_NAMES:
        raise ValidationError({"stage": [f"Stages are 1–4, not {to_stage}."]})
    return _leave(actor=actor, plan=plan, to_state=f"stage-{to_stage}",
                  kind=StageMove.Kind.REGRESS, reason=reason, permission=roles.APPROVE)


def pause(*, actor: Actor, plan: Plan, reason: str) -> Plan:
    """Stop the plan where it is (on-call may, in an incident). From stage 3 or 4 the
    candidate is drained first, off every route. Open approvals are voided."""
    return _leave(actor=actor, plan=plan, to_state=Plan.State.PAUSED,
                  kind=StageMove.Kind.PAUSE, reason=reason, permission=roles.DRAIN)


def resume(*, actor: Actor, plan: Plan, reason: str) -> Plan:
    return _leave(actor=actor, plan=plan, to_state="", kind=StageMove.Kind.RESUME,
                  reason=reason, permission=roles.APPROVE)


def abandon(*, actor: Actor, plan: Plan, reason: str) -> Plan:
    """Close the plan for good. From stage 3 or 4 the candidate is drained off the plan's
    routes first."""
    return _leave(actor=actor, plan=plan, to_state=Plan.State.ABANDONED,
                  kind=StageMove.Kind.ABANDON, reason=reason, permission=roles.APPROVE)


# --- evidence a person reports ----------------------------------------------------------------

def evidence_report(*, actor: Actor, pool: Pool, kind: str = ev.EXTERNAL, reported_by: str,
                    about: str, verdict: str, summary: str, data: Any = None, url: str = "",
                    route: Route | None = None, model_id: str = "",
                    ttl_hours: float | None = None) -> Evidence:
    """Record what another system reports about a pool (kind `external`): the system named
    (`reported_by`), what it speaks to (`about`: a kind or an organisation's own check) and
    its verdict. Shown as "reported by <system>" everywhere; it never satisfies a check over a
    kind fleetctl measures. A measured kind sent here is refused with what to send instead."""
    actor.require(roles.JOBS, action="evidence.record", target=pool)
    with _refusals(actor, "evidence.record", pool):
        known = ev.KINDS.get(kind)
        if known is None:
            raise ValidationError({"kind": [
                f"Unknown evidence kind {kind!r}. Other systems post kind {ev.EXTERNAL!r} "
                f"(with reported_by and about); see GET /api/v1/evidence-kinds/."]})
        if known.measured:
            raise ValidationError({"kind": [
                f"{kind} is measured by fleetctl, not posted: it comes from "
                f"{_measured_by_whom(known)}. To record what another system found about it, "
                f"post kind {ev.EXTERNAL!r} with about={kind!r} and reported_by naming that "
                f"system; it is shown as reported by it and does not satisfy the {kind} "
                f"check."]})
        reported_by, about = reported_by.strip(), about.strip()
        if not reported_by:
            raise ValidationError({"reported_by": [
                "Name the system that reports it, e.g. grafana-slo-bot."]})
        if not about:
            raise ValidationError({"about": [
                "Say what the report speaks to: an evidence kind (e.g. shadow) or your own "
                "check's name (e.g. slo-burn)."]})
        if data is not None and not isinstance(data, dict):
            raise ValidationError({"data": ["An object of numbers and labels."]})
        _evidence_problems(known, verdict=verdict, summary=summary, data=data,
                           ttl_hours=ttl_hours)
        return _store_evidence(actor=actor, pool=pool, kind=kind, verdict=verdict,
                               summary=summary, data=data, url=url, route=route,
                               model_id=model_id, ttl_hours=ttl_hours, source=actor.label,
                               reported_by=reported_by[:100], about=about[:63])


# --- evidence jobs ----------------------------------------------------------------------------

def rehearsal_start(*, actor: Actor, plan: Plan) -> Drain:
    """Start a drain rehearsal: drain the candidate off the plan's routes for real, time it,
    and once every gateway verified and its streams closed, restore the split (a task). The
    drain record is the evidence `drain.rehearsed` reads. Only in stage 4: before that the
    candidate carries no live traffic to drain. The drain's first push is made after the
    commit, then a watcher task (`plans.rehearsal_finish`) follows it."""
    from fleetctl.traffic import services as traffic

    actor.require(roles.JOBS, action="plan.rehearse", target=plan)
    with _refusals(actor, "plan.rehearse", plan), transaction.atomic():
        locked = _lock(plan)
        if locked.state != Plan.State.STAGE_4:
            raise ConflictError(f"Plan {locked.name} is {locked.get_state_display()}: a drain "
                                f"rehearsal moves live traffic, which the candidate carries "
                                f"only in stage 4.")
        platform = Actor.for_system("drain-rehearsal")
        try:
            drain = traffic.drain_request(
                actor=platform, pool=locked.candidate_pool, routes=list(locked.routes.all()),
                reason=f"rehearsal for plan {locked.name}, requested by {actor.label}")
        except ConflictError as exc:
            raise ConflictError(f"Nothing to rehearse: {locked.candidate_pool.name} carries no "
                                f"live weight on the plan's routes.") from exc
        audit_record(actor=actor, action="plan.rehearse", target=locked,
                     message=f"drain rehearsal started (drain #{drain.pk})",
                     after={"drain": drain.pk})
    _push_drains([drain])
    from migrations_plan.tasks import rehearsal_finish

    rehearsal_finish.delay(drain.pk)
    return drain
