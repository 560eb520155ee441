"""Writes for migration plans: open a plan, edit its gates, attest, approve, move stages.

Every refusal — no role, one's own plan, a failing gate, a stale approval, a closed plan —
is answered with the reason and recorded as a `denied` audit event on the plan, outside the
refused work's transaction so the record stays while nothing else changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import date, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record, audit_refused, snapshot
from fleetctl.core.errors import ConflictError, DomainError
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic.models import Drain, Route
from fleetctl.webhooks.services import notify
from migrations_plan import evidence as ev
from migrations_plan import permissions
from migrations_plan.gates import DEFAULT_GATES
from migrations_plan.models import (
    STAGE_NAMES,
    Approval,
    Attestation,
    Evidence,
    GateCheck,
    Plan,
    StageMove,
)

PLAN_FIELDS = ["name", "candidate_pool", "primary_pool", "slo_ttft_p95_ms", "slo_tpot_p95_ms",
               "slo_error_rate", "latency_margin_pct", "cost_margin_pct", "quality_margin_pct",
               "owner", "target_date", "required_approvals", "notes"]
EDITABLE_FIELDS = ["slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_error_rate", "latency_margin_pct",
                   "cost_margin_pct", "quality_margin_pct", "owner", "target_date",
                   "required_approvals", "notes", "predicted_cost_per_1m",
                   "predicted_cost_currency", "predicted_cost_source"]
# Stage 3's predicted cost per 1M output tokens: an amount and its currency, set together.
PREDICTION_FIELDS = ["predicted_cost_per_1m", "predicted_cost_currency", "predicted_cost_source"]
# Called once a plan's predicted cost has changed: the batch app judges the last
# finished soak's measured cost against the new prediction and records it (fleetctl/batch/
# apps.py), so stage 3's cost check — and any approval bound to its old row — follows the
# prediction in force. Plans cannot import batch (the layers), hence a hook.
PREDICTION_HOOKS: list[Callable[[Plan], object]] = []
CHECK_FIELDS = ["stage", "key", "title", "kind", "rule", "params", "attest_role"]
MIN_JUSTIFICATION = permissions.MIN_JUSTIFICATION
PAST = {"pause": "paused", "regress": "regressed", "abandon": "abandoned", "resume": "resumed"}


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


# --- plans ------------------------------------------------------------------------------------

def plan_create(*, actor: Actor, name: str, candidate_pool: Pool, primary_pool: Pool,
                routes: list[Route], slo_ttft_p95_ms: float, slo_tpot_p95_ms: float,
                slo_error_rate: float, owner: Any = None, target_date: date | None = None,
                required_approvals: int = 1, latency_margin_pct: float = 10,
                cost_margin_pct: float = 0, quality_margin_pct: float = 2,
                notes: str = "") -> Plan:
    """Open a plan at stage 1 with the default gates. One open plan per candidate and route;
    the candidate starts with no live weight on its routes."""
    actor.require(roles.FLEET_MANAGE, action="plan.create", target="migrations_plan.plan")
    with _refusals(actor, "plan.create", f"plan {name}"):
        author = _person(actor, "Opening a plan")
        plan = Plan(name=name, candidate_pool=candidate_pool, primary_pool=primary_pool,
                    slo_ttft_p95_ms=slo_ttft_p95_ms, slo_tpot_p95_ms=slo_tpot_p95_ms,
                    slo_error_rate=slo_error_rate, owner=owner or author, created_by=author,
                    target_date=target_date, required_approvals=required_approvals,
                    latency_margin_pct=latency_margin_pct, cost_margin_pct=cost_margin_pct,
                    quality_margin_pct=quality_margin_pct, notes=notes)
        plan.full_clean()
        if name == "new":
            raise ValidationError({"name": ["'new' is reserved (it is the dashboard's "
                                            "new-plan page); choose another name."]})
        _check_pools(plan, routes)
        with transaction.atomic():
            Pool.objects.select_for_update().filter(pk=candidate_pool.pk).first()
            _check_no_open_plan(plan, routes)
            _check_no_live_weight(candidate_pool, routes)
            plan.save()
            plan.routes.set(routes)
            for stage, templates in DEFAULT_GATES.items():
                for position, template in enumerate(templates):
                    GateCheck.objects.create(
                        plan=plan, stage=stage, key=template.key, title=template.title,
                        kind=GateCheck.Kind.ATTESTED if template.attest_role
                        else GateCheck.Kind.EVIDENCE,
                        rule=template.rule, params=template.params,
                        attest_role=template.attest_role, position=position,
                        added_by="template")
            audit_record(actor=actor, action="plan.create", target=plan,
                         after={**snapshot(plan, PLAN_FIELDS),
                                "routes": [r.name for r in routes], "state": plan.state})
    return plan


def _check_pools(plan: Plan, routes: list[Route]) -> None:
    if not routes:
        raise ValidationError({"routes": ["Name at least one route the candidate will join."]})
    serving = {(pool_id, model) for pool_id, model in PoolModel.objects.filter(
        pool__in=[plan.candidate_pool, plan.primary_pool],
        model_id__in=[r.model_id for r in routes]).values_list("pool_id", "model_id")}
    problems: list[str] = []
    candidate, primary = plan.candidate_pool, plan.primary_pool
    for route in routes:
        if (primary.pk, route.model_id) not in serving:
            problems.append(f"Primary {primary.name} does not serve model {route.model_id} "
                            f"of route {route.name}.")
        if (candidate.pk, route.model_id) not in serving:
            problems.append(f"Candidate {candidate.name} does not serve model {route.model_id} "
                            f"of route {route.name}.")
        if route.residency and candidate.region.jurisdiction != route.residency:
            problems.append(f"Residency: candidate {candidate.name} is in jurisdiction "
                            f"{candidate.region.jurisdiction}, route {route.name} is pinned to "
                            f"{route.residency}; it could never carry that route.")
    if problems:
        raise ValidationError({"routes": problems})


def _check_no_open_plan(plan: Plan, routes: list[Route]) -> None:
    clash = (Plan.objects.filter(candidate_pool=plan.candidate_pool, routes__in=routes)
             .exclude(state__in=Plan.CLOSED_STATES).exclude(pk=plan.pk).distinct().first())
    if clash is not None:
        shared = sorted(set(clash.routes.values_list("name", flat=True))
                        & {r.name for r in routes})
        raise ConflictError(
            f"Plan {clash.name} ({clash.get_state_display()}) already takes "
            f"{plan.candidate_pool.name} onto {', '.join(shared)}: one open plan per candidate "
            f"and route. Abandon or complete it first.")


def _check_no_live_weight(pool: Pool, routes: list[Route]) -> None:
    """A candidate starts with no live weight on any route, not only the plan's: the
    live-weight guard holds a candidate below stage 4 off every interactive route (and below
    stage 3 off every route), so weight it kept elsewhere would escape the plan's stages."""
    from fleetctl.traffic import selectors

    everywhere = list(Route.objects.order_by("name"))
    current = selectors.revisions_current(routes=everywhere)
    held = [(route.name, current[route.pk].weights[pool.name]) for route in everywhere
            if route.pk in current and current[route.pk].weights.get(pool.name, 0)]
    if held:
        carried = ", ".join(f"{share / 100:g} % of route {name}" for name, share in held)
        raise ConflictError(
            f"{pool.name} already carries {carried}; a candidate starts with no live weight "
            f"on any route. Drain it first: fleetctl drain --pool {pool.name} --reason ... (or "
            f"POST /api/v1/drains/).")


def plan_update(*, actor: Actor, plan: Plan, **changes: Any) -> Plan:
    """Change a plan's terms (SLO, margins, owner, date, approvers). Terms are part of what an
    approval saw: changing them voids approvals given under the old ones. A lead may also set
    or replace stage 3's predicted cost per 1M output tokens (amount and currency together,
    with where the figure comes from; both empty clears it)."""
    actor.require(roles.APPROVE, action="plan.update", target=plan)
    with _refusals(actor, "plan.update", plan):
        unknown = sorted(set(changes) - set(EDITABLE_FIELDS))
        if unknown:
            raise ValidationError({n: ["This field cannot be changed here."] for n in unknown})
        changes = _prediction_changes(actor, changes)
        with transaction.atomic():
            locked = _lock(plan)
            _open(locked)
            before = snapshot(locked, EDITABLE_FIELDS)
            for field_name, value in changes.items():
                setattr(locked, field_name, value)
            if set(changes) & set(PREDICTION_FIELDS):
                locked.predicted_cost_at = (timezone.now() if locked.predicted_cost_per_1m
                                            is not None else None)
            locked.full_clean()
            locked.save()
            after = snapshot(locked, EDITABLE_FIELDS)
            changed = sorted(k for k in EDITABLE_FIELDS if before[k] != after[k])
            if changed:
                audit_record(actor=actor, action="plan.update", target=locked,
                             before={k: before[k] for k in changed},
                             after={k: after[k] for k in changed})
    if set(changed) & {"predicted_cost_per_1m", "predicted_cost_currency"}:
        for hook in PREDICTION_HOOKS:
            hook(locked)
    return locked


def _prediction_changes(actor: Actor, changes: dict[str, Any]) -> dict[str, Any]:
    """The predicted cost's fields checked together: an amount without its currency (or the
    reverse) is refused, as is a currency the fleet does not know; a source alone is refused.
    Without a stated source, the figure is "set by <who>"."""
    from decimal import Decimal, InvalidOperation

    from fleetctl.fleet.models import CURRENCIES

    if not set(changes) & set(PREDICTION_FIELDS):
        return changes
    given_amount, given_currency = ("predicted_cost_per_1m" in changes,
                                    "predicted_cost_currency" in changes)
    if not (given_amount and given_currency):
        missing = "predicted_cost_currency" if given_amount else "predicted_cost_per_1m"
        raise ValidationError({missing: [
            "Give the predicted cost per 1M output tokens and its currency together (both "
            "empty clears the prediction)."]})
    amount, currency = changes["predicted_cost_per_1m"], changes["predicted_cost_currency"]
    currency = (currency or "").strip().upper()
    source = str(changes.get("predicted_cost_source") or "").strip()
    if amount in (None, "") and not currency:
        if source:
            raise ValidationError({"predicted_cost_source": [
                "A source describes a predicted cost; give the amount and currency too."]})
        return {**changes, "predicted_cost_per_1m": None, "predicted_cost_currency": "",
                "predicted_cost_source": ""}
    if amount in (None, "") or not currency:
        missing = "predicted_cost_currency" if not currency else "predicted_cost_per_1m"
        raise ValidationError({missing: [
            "Give the predicted cost per 1M output tokens and its currency together (both "
            "empty clears the prediction)."]})
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        raise ValidationError({"predicted_cost_per_1m": [
            f"{amount!r} is not a number: the cost per 1M output tokens, e.g. 8.40."]}) from None
    if not value.is_finite() or value < 0:
        raise ValidationError({"predicted_cost_per_1m": [
            "A cost per 1M output tokens of 0 or more, e.g. 8.40."]})
    if currency not in CURRENCIES:
        raise ValidationError({"predicted_cost_currency": [
            f"Unknown currency {currency!r}; one of {', '.join(CURRENCIES)}."]})
    if len(source) > 200:
        raise ValidationError({"predicted_cost_source": ["At most 200 characters."]})
    return {**changes, "predicted_cost_per_1m": value, "predicted_cost_currency": currency,
            "predicted_cost_source": source or f"set by {actor.label}"}


def _record_prediction(*, actor: Actor, plan: Plan) -> None:
    """Entering stage 3 with no predicted cost: record the candidate's benchmark-derived cost
    per 1M output tokens now, which the soak's measured cost is checked against. A cost that
    no longer holds (its hourly rate or currency changed since: `Pool.cost_stale_reason`) or
    that no benchmark measured is not a prediction: nothing is recorded, and the timeline says
    so, for a lead to set one."""
    if plan.predicted_cost_per_1m is not None:
        return
    pool = plan.candidate_pool
    cost, stale = pool.cost_per_1m_output_tokens, pool.cost_stale_reason
    if cost is None or stale:
        why = (f"its cost is stale: {stale}" if stale else
               "no benchmark has measured its cost per 1M output tokens")
        audit_record(actor=actor, action="plan.update", target=plan,
                     message=f"no predicted cost recorded on entering stage 3: "
                             f"{pool.name}'s {why}; a platform lead can set one "
                             f"(predicted_cost_per_1m and predicted_cost_currency)")
        return
    before = snapshot(plan, PREDICTION_FIELDS)
    plan.predicted_cost_per_1m = cost
    plan.predicted_cost_currency = pool.cost_currency or pool.currency
    plan.predicted_cost_source = (
        f"the candidate's benchmark cost when the plan entered stage 3 "
        f"({pool.cost_source or pool.name})")[:200]
    plan.predicted_cost_at = timezone.now()
    plan.save(update_fields=[*PREDICTION_FIELDS, "predicted_cost_at"])
    audit_record(actor=actor, action="plan.update", target=plan,
                 message=f"predicted cost recorded on entering stage 3: {cost} "
                         f"{plan.predicted_cost_currency} per 1M output tokens "
                         f"({plan.predicted_cost_source})",
                 before=before, after=snapshot(plan, PREDICTION_FIELDS))


# --- gate edits -------------------------------------------------------------------------------

def _editable_stage(plan: Plan, stage: int) -> None:
    if stage not in STAGE_NAMES:
        raise ValidationError({"stage": [f"Stages are 1–4, not {stage}."]})
    permissions.enforce(permissions.behind_refusal(plan, stage))


def check_add(*, actor: Actor, plan: Plan, stage: int, title: str, rule: str = "",
              params: Any = None, attest_role: str = "", key: str = "") -> GateCheck:
    """Add a check to one stage's gate: evidence-backed (a registered rule and its
    parameters) or attested (the role whose holder confirms it)."""
    actor.require(roles.APPROVE, action="plan.check.add", target=plan)
    with _refusals(actor, "plan.check.add", plan):
        if bool(rule) == bool(attest_role):
            raise ValidationError({"rule": [
                "A check is either evidence-backed (give a rule) or attested (give the role "
                "that attests it), not both or neither."]})
        kind = GateCheck.Kind.ATTESTED if attest_role else GateCheck.Kind.EVIDENCE
        clean: dict[str, Any] = {}
        if rule:
            if rule not in ev.RULES:
                raise ValidationError({"rule": [
                    f"Unknown rule {rule!r}; rules: {', '.join(sorted(ev.RULES))}."]})
            clean = ev.RULES[rule].clean_params(params)
            title = title.strip() or ev.RULES[rule].title(clean)
        elif attest_role not in roles.ROLES:
            raise ValidationError({"attest_role": [
                f"Unknown role {attest_role!r}; roles: {', '.join(roles.ROLES)}."]})
        if not title.strip():
            raise ValidationError({"title": ["Say what the check confirms."]})
        with transaction.atomic():
            locked = _lock(plan)
            _open(locked)
            _editable_stage(locked, stage)
            live = set(locked.checks.filter(stage=stage, removed_at__isnull=True)
                       .values_list("key", flat=True))
            key = _unique_key(slugify(key or title)[:55] or "check", live)
            position = locked.checks.filter(stage=stage).count()
            check = GateCheck.objects.create(
                plan=locked, stage=stage, key=key, title=title.strip()[:200], kind=kind,
                rule=rule, params=clean, attest_role=attest_role, position=position,
                added_by=actor.label)
            audit_record(actor=actor, action="plan.check.add", target=locked,
                         message=f"stage {stage}: {check.title}",
                         after=snapshot(check, CHECK_FIELDS))
    return check


def _unique_key(base: str, taken: set[str]) -> str:
    key, n = base, 2
    while key in taken:
        key, n = f"{base}-{n}", n + 1
    return key


def check_update(*, actor: Actor, check: GateCheck, title: str | None = None,
                 params: Any = None) -> GateCheck:
    """Change a check's thresholds (or title). Approvals that saw the old ones are voided."""
    actor.require(roles.APPROVE, action="plan.check.update", target=check.plan)
    with _refusals(actor, "plan.check.update", check.plan), transaction.atomic():
        locked = _lock(check.plan)
        _open(locked)
        row = GateCheck.objects.select_for_update().get(pk=check.pk)
        if row.removed_at is not None:
            raise ConflictError(f"Check {row.title!r} was removed; add a new one instead.")
        _editable_stage(locked, row.stage)
        before = snapshot(row, ["title", "params"])
        if params is not None:
            if row.kind != GateCheck.Kind.EVIDENCE:
                raise ValidationError({"params": ["An attested check has no thresholds."]})
            row.params = ev.RULES[row.rule].clean_params(params) if row.rule in ev.RULES \
                    else params
        if title is not None:
            if not title.strip():
                raise ValidationError({"title": ["Say what the check confirms."]})
            row.title = title.strip()[:200]
        row.save(update_fields=["params", "title"])
        after = snapshot(row, ["title", "params"])
        if before != after:
            audit_record(actor=actor, action="plan.check.update", target=locked,
                         message=f"stage {row.stage}: {row.title}", before=before,
                         after=after)
    return row


def check_remove(*, actor: Actor, check: GateCheck, reason: str) -> GateCheck:
    """Take a check off a gate, with the reason; the row stays for the record."""
    actor.require(roles.APPROVE, action="plan.check.remove", target=check.plan)
    with _refusals(actor, "plan.check.remove", check.plan):
        if not reason.strip():
            raise ValidationError({"reason": ["Say why the check no longer applies."]})
        with transaction.atomic():
            locked = _lock(check.plan)
            _open(locked)
            row = GateCheck.objects.select_for_update().get(pk=check.pk)
            if row.removed_at is not None:
                raise ConflictError(f"Check {row.title!r} was already removed.")
            _editable_stage(locked, row.stage)
            row.removed_at = timezone.now()
            row.removed_by = actor.label
            row.removed_reason = reason.strip()
            row.save(update_fields=["removed_at", "removed_by", "removed_reason"])
            audit_record(actor=actor, action="plan.check.remove", target=locked,
                         message=f"stage {row.stage}: {row.title} — {row.removed_reason}",
                         before=snapshot(row, CHECK_FIELDS))
    return row


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
            approval = standing.approval
            approval.voided_at = gate.at
            approval.void_reason = standing.why_not or ""
            approval.save(update_fields=["voided_at", "void_reason"])
            audit_record(actor=actor or Actor.for_system("plan-gate"),
                         action="plan.approval.void", target=locked,
                         message=f"approval by {approval.by.get_username()} of stage "
                                 f"{approval.stage} voided: {approval.void_reason}",
                         after={"approval": approval.pk})
            voided.append(approval)
    return voided


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
    notify("gate.changed", {
        "plan": plan.name, "kind": kind, "from_state": from_state, "to_state": to_state,
        "stage": plan.stage, "by": actor.label, "reason": reason,
        "gate_status": gate.status if gate is not None else None, "move": move.pk,
        "url": f"/plans/{plan.name}/"},
        text=f"fleetctl plan {plan.name}: {from_state} → {to_state} ({kind}) by "
             f"{actor.label}" + (f": {reason}" if reason else ""))
    return move


def _void_open_approvals(plan: Plan, *, why: str, actor: Actor,
                         stages: set[int] | None = None) -> None:
    rows = plan.approvals.filter(voided_at__isnull=True, used_at__isnull=True)
    if stages is not None:
        rows = rows.filter(stage__in=stages)
    for approval in rows.select_related("by"):
        approval.voided_at = timezone.now()
        approval.void_reason = why
        approval.save(update_fields=["voided_at", "void_reason"])
        audit_record(actor=actor, action="plan.approval.void", target=plan,
                     message=f"approval by {approval.by.get_username()} of stage "
                             f"{approval.stage} voided: {why}", after={"approval": approval.pk})


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


def _push_drains(drains: list[Drain]) -> None:
    """The drains' first push, by name, once the transaction that stored them has committed
    (the push engine refuses to run inside one)."""
    from fleetctl.traffic import push

    for drain in drains:
        push.drain_push_now(drain)


def _leave(*, actor: Actor, plan: Plan, to_state: str, kind: str, reason: str,
           permission: str) -> Plan:
    actor.require(permission, action=f"plan.{kind}", target=plan)
    with _refusals(actor, f"plan.{kind}", plan):
        if not reason.strip():
            raise ValidationError({"reason": ["Say why (it goes in the plan's timeline)."]})
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


# --- evidence and the refresh task ------------------------------------------------------------

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
    return row


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


def plan_refresh(*, plan: Plan) -> list[str]:
    """Re-evaluate the current gate: void approvals whose evidence moved, and put every
    check whose status changed on the plan's timeline. Run by beat for every open plan."""
    if not plan.in_stage:
        return []
    _void_stale_approvals(plan)
    system = Actor.for_system("plan-gate")
    changes: list[str] = []
    with transaction.atomic():
        locked = _lock(plan)
        if not locked.in_stage:
            return []
        gate = ev.evaluate_gate(locked)
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
        if changes:
            notify("gate.changed", {
                "plan": locked.name, "kind": "check-status", "stage": locked.stage,
                "state": locked.state, "gate_status": gate.status, "changes": changes,
                "url": f"/plans/{locked.name}/"},
                text=f"fleetctl plan {locked.name} stage {locked.stage} gate "
                     f"{ev.status_label(gate.status)}: " + "; ".join(changes))
    return changes


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
