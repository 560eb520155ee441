"""What a person (or an API client) does to a plan and its gates: open a plan, edit it
(its predicted cost too), add, change and remove gate checks."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record, snapshot
from fleetctl.core.errors import ConflictError, required_reason
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic.models import Route
from migrations_plan import evidence as ev
from migrations_plan import permissions
from migrations_plan.gates import DEFAULT_GATES
from migrations_plan.models import STAGE_NAMES, CostUnit, GateCheck, Plan
from migrations_plan.services._shared import PREDICTION_FIELDS, _lock, _open, _person, _refusals

PLAN_FIELDS = ["name", "candidate_pool", "primary_pool", "slo_ttft_p95_ms", "slo_tpot_p95_ms",
               "slo_error_rate", "slo_e2e_p95_ms", "latency_margin_pct", "cost_margin_pct",
               "cost_unit", "quality_margin_pct", "owner", "target_date", "required_approvals",
               "notes"]
EDITABLE_FIELDS = ["slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_error_rate", "slo_e2e_p95_ms",
                   "latency_margin_pct",
                   "cost_margin_pct", "cost_unit", "quality_margin_pct", "owner", "target_date",
                   "required_approvals", "notes", "predicted_cost_per_1m",
                   "predicted_cost_currency", "predicted_cost_source"]
# Called once a plan's predicted cost or its cost unit has changed, with why: the batch app
# judges the last finished soak's measured cost against the prediction in the unit now in
# force and records it (fleetctl/batch/apps.py), so stage 3's cost check — and any approval
# bound to its old row — follows them. Plans cannot import batch (the layers), hence a hook.
PREDICTION_HOOKS: list[Callable[[Plan, str], object]] = []
CHECK_FIELDS = ["stage", "key", "title", "kind", "rule", "params", "attest_role"]


# --- plans ------------------------------------------------------------------------------------

def plan_create(*, actor: Actor, name: str, candidate_pool: Pool, primary_pool: Pool,
                routes: list[Route], slo_ttft_p95_ms: float, slo_tpot_p95_ms: float,
                slo_error_rate: float, owner: Any = None, target_date: date | None = None,
                required_approvals: int = 1, latency_margin_pct: float = 10,
                cost_margin_pct: float = 0, quality_margin_pct: float = 2,
                slo_e2e_p95_ms: float | None = None, notes: str = "",
                cost_unit: str = CostUnit.PER_1M_OUTPUT_TOKENS) -> Plan:
    """Open a plan at stage 1 with the default gates. One open plan per candidate and route;
    the candidate starts with no live weight on its routes."""
    actor.require(roles.FLEET_MANAGE, action="plan.create", target="migrations_plan.plan")
    with _refusals(actor, "plan.create", f"plan {name}"):
        author = _person(actor, "Opening a plan")
        _check_cost_unit(cost_unit)
        plan = Plan(name=name, candidate_pool=candidate_pool, primary_pool=primary_pool,
                    cost_unit=cost_unit, slo_ttft_p95_ms=slo_ttft_p95_ms,
                    slo_tpot_p95_ms=slo_tpot_p95_ms,
                    slo_error_rate=slo_error_rate, owner=owner or author, created_by=author,
                    target_date=target_date, required_approvals=required_approvals,
                    latency_margin_pct=latency_margin_pct, cost_margin_pct=cost_margin_pct,
                    quality_margin_pct=quality_margin_pct, slo_e2e_p95_ms=slo_e2e_p95_ms,
                    notes=notes)
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
        if "cost_unit" in changes:
            _check_cost_unit(changes["cost_unit"])
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
    why = ("the plan's predicted cost changed"
           if set(changed) & {"predicted_cost_per_1m", "predicted_cost_currency"} else
           f"the plan's cost unit changed to {locked.get_cost_unit_display()}"
           if "cost_unit" in changed else "")
    if why:
        for hook in PREDICTION_HOOKS:
            hook(locked, why)
    return locked


def _check_cost_unit(unit: object) -> None:
    """A unit stage 3's cost arbitrage knows, or a 400 naming them (before anything is
    written)."""
    if unit not in CostUnit.values:
        raise ValidationError({"cost_unit": [
            f"Unknown cost unit {unit!r}; one of {', '.join(CostUnit.values)} (per 1M "
            f"output tokens, or per successful task: a soak's spend ÷ the custom_ids that "
            f"succeeded)."]})


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


def _check_to_change(check: GateCheck, if_removed: str) -> tuple[Plan, GateCheck]:
    """In a transaction: the check's plan (locked, and open) and the check itself (locked);
    refused when the check was removed ("Check 'title' `if_removed`") or its stage can no
    longer change."""
    locked = _lock(check.plan)
    _open(locked)
    row = GateCheck.objects.select_for_update().get(pk=check.pk)
    if row.removed_at is not None:
        raise ConflictError(f"Check {row.title!r} {if_removed}")
    _editable_stage(locked, row.stage)
    return locked, row


def check_update(*, actor: Actor, check: GateCheck, title: str | None = None,
                 params: Any = None) -> GateCheck:
    """Change a check's thresholds (or title). Approvals that saw the old ones are voided."""
    actor.require(roles.APPROVE, action="plan.check.update", target=check.plan)
    with _refusals(actor, "plan.check.update", check.plan), transaction.atomic():
        locked, row = _check_to_change(check, "was removed; add a new one instead.")
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
        required_reason(reason, "Say why the check no longer applies.")
        with transaction.atomic():
            locked, row = _check_to_change(check, "was already removed.")
            row.removed_at = timezone.now()
            row.removed_by = actor.label
            row.removed_reason = reason.strip()
            row.save(update_fields=["removed_at", "removed_by", "removed_reason"])
            audit_record(actor=actor, action="plan.check.remove", target=locked,
                         message=f"stage {row.stage}: {row.title} — {row.removed_reason}",
                         before=snapshot(row, CHECK_FIELDS))
    return row
