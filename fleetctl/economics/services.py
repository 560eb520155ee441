"""Writes of the business case: editing a plan's inputs (the burden table, the engineer cost,
the expected volume, the override) and recording the verdict when it changes.

Edits need `fleet.manage` (platform leads, admins). Every value is checked with a message
that names the field; a refused edit changes nothing. An edit is audited on the plan (its
timeline shows it, before and after), and the case is judged again at once; a currency-rate
edit re-judges every stored case, and new benchmark evidence the cases of the plans on its
pool (apps.py registers `rates_changed` and `evidence_recorded` as hooks).
A verdict or headline that changed is recorded on the plan's timeline, with what caused it."""

from __future__ import annotations

import logging
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record, snapshot
from fleetctl.bench.evidence import KIND as BENCHMARK
from fleetctl.economics.case import Case, judge
from fleetctl.economics.models import (
    BURDEN_FIELDS,
    BURDEN_ROWS,
    MAX_ENGINEER_COST,
    MAX_PEAK_DAYS,
    MAX_VOLUME_M,
    MAX_WEEKS,
    MIN_VOLUME_M,
    BusinessCase,
)
from fleetctl.fleet.models import CURRENCIES
from migrations_plan.models import Evidence, Plan

log = logging.getLogger("fleetctl.economics")

EDITABLE = [*BURDEN_FIELDS, "engineer_cost_per_year", "engineer_cost_currency",
            "expected_mtokens_per_month", "override", "override_reason", "peak_days"]
JUDGE_ACTOR = "business-case"
_TITLES = {name: title for name, title, *_ in BURDEN_ROWS}


def _decimal(name: str, value: Any, what: str) -> Decimal:
    try:
        number = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise ValidationError({name: [f"{what} must be a number, e.g. 4 or 2.5; got "
                                      f"{str(value)[:40]!r}."]}) from None
    if not number.is_finite():
        raise ValidationError({name: [f"{what} must be a finite number."]})
    return number


def _checked(changes: dict[str, Any]) -> dict[str, Any]:
    """Each given value in its type, or a ValidationError naming the field and the range."""
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise ValidationError({n: ["This field cannot be changed here."] for n in unknown})
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name in BURDEN_FIELDS:
            weeks = _decimal(name, value, f"{_TITLES[name]} (engineer-weeks a year)")
            if weeks < 0 or weeks > MAX_WEEKS or weeks != weeks.quantize(Decimal("0.1")):
                raise ValidationError({name: [
                    f"{_TITLES[name]}: give 0 to {MAX_WEEKS} engineer-weeks a year, to one "
                    f"decimal (one row is at most a person-year); got {value}."]})
            out[name] = weeks
        elif name == "engineer_cost_per_year":
            cost = _decimal(name, value, "The engineer cost per year")
            if cost <= 0 or cost > MAX_ENGINEER_COST:
                raise ValidationError({name: [
                    f"Give what one engineer-year costs, above 0 and at most "
                    f"{MAX_ENGINEER_COST:,}; got {value}."]})
            out[name] = cost.quantize(Decimal("0.01"))
        elif name == "engineer_cost_currency":
            code = str(value or "").strip().upper()
            if code not in CURRENCIES:
                raise ValidationError({name: [
                    f"Unknown currency {str(value)[:10]!r}: use one of "
                    f"{', '.join(CURRENCIES)}."]})
            out[name] = code
        elif name == "expected_mtokens_per_month":
            if value in (None, ""):
                out[name] = None
                continue
            volume = _decimal(name, value, "The expected volume (M output tokens a month)")
            if volume < MIN_VOLUME_M or volume > MAX_VOLUME_M:
                raise ValidationError({name: [
                    f"Give the output tokens a month in millions, from {MIN_VOLUME_M} (a "
                    f"thousand tokens) to {MAX_VOLUME_M:,} (10 trillion); got {value}."]})
            out[name] = volume.quantize(Decimal("0.001"))
        elif name == "peak_days":
            try:
                days = int(str(value))
            except ValueError:
                days = 0
            if not 1 <= days <= MAX_PEAK_DAYS:
                raise ValidationError({name: [
                    f"Give 1 to {MAX_PEAK_DAYS} days (the telemetry keeps {MAX_PEAK_DAYS}); "
                    f"got {value}."]})
            out[name] = days
        elif name == "override":
            kind = str(value or "")
            if kind not in BusinessCase.Override.values:
                raise ValidationError({name: ["Choose capacity, residency or none."]})
            out[name] = kind
        else:
            out[name] = str(value or "").strip()
    return out


def business_case_update(*, actor: Actor, plan: Plan, **changes: Any) -> Case:
    """Change the plan's business case inputs; the case judged after the change."""
    actor.require(roles.FLEET_MANAGE, action="plan.business_case.update", target=plan)
    values = _checked(changes)
    with transaction.atomic():
        Plan.objects.select_for_update().get(pk=plan.pk)
        row = BusinessCase.objects.filter(plan=plan).first() or BusinessCase(plan=plan)
        before = snapshot(row, EDITABLE)
        for name, value in values.items():
            setattr(row, name, value)
        if row.override and not row.override_reason:
            raise ValidationError({"override_reason": [
                f"Say why {row.override} decides regardless of cost (e.g. the region, the "
                f"contract); it is shown with the verdict."]})
        if row.override_reason and not row.override:
            raise ValidationError({"override": [
                "A reason was given without an override: choose capacity or residency, or "
                "clear the reason."]})
        row.updated_by, row.updated_at = actor.label, timezone.now()
        row.full_clean()
        created = row.pk is None
        row.save()
        after = snapshot(row, EDITABLE)
        changed = sorted(k for k in EDITABLE if before[k] != after[k])
        if changed or created:
            audit_record(actor=actor, action="plan.business_case.update", target=plan,
                         before={k: before[k] for k in changed},
                         after={k: after[k] for k in changed})
        case = business_case_judge(plan=plan, row=row, cause=f"edited by {actor.label}"
                                   + (f" ({', '.join(changed)})" if changed else ""))
    return case


def business_case_judge(*, plan: Plan, row: BusinessCase | None = None, cause: str) -> Case:
    """Judge the stored case now; when its verdict or headline differs from the one recorded,
    record the new one (on the row, and on the plan's timeline with `cause`)."""
    with transaction.atomic():
        locked = BusinessCase.objects.select_for_update().get(plan=plan) if row is None \
            else row
        case = judge(plan, locked)
        if case.verdict == locked.verdict and case.headline == locked.verdict_text:
            return case
        before = {"verdict": locked.verdict, "headline": locked.verdict_text}
        locked.verdict, locked.verdict_text = case.verdict, case.headline
        locked.judged_at = timezone.now()
        locked.save(update_fields=["verdict", "verdict_text", "judged_at"])
        audit_record(actor=Actor.for_system(JUDGE_ACTOR), action="plan.business_case.judged",
                     target=plan, message=f"judged again: {cause}", before=before,
                     after={"verdict": case.verdict, "headline": case.headline,
                            "numbers": {k: v for k, v in case.numbers.items()
                                        if k != "comparison"}})
    return case


def evidence_recorded(row: Evidence) -> None:
    """New benchmark evidence of a pool: judge the stored cases of the plans on it again
    (migrations_plan.services.EVIDENCE_HOOKS)."""
    if row.kind != BENCHMARK:
        return
    rows = BusinessCase.objects.filter(
        Q(plan__candidate_pool=row.pool_id) | Q(plan__primary_pool=row.pool_id))
    _judge_all(rows, f"benchmark evidence of {row.pool.name} recorded ({row.source})")


def rates_changed(what: str) -> None:
    """A currency rate changed: judge every stored case again (fleet.hooks.RATE_HOOKS)."""
    _judge_all(BusinessCase.objects.all(), f"currency rate {what}")


def tax_changed(pool_id: int, what: str) -> None:
    """A pool's interruption tax changed: judge the stored cases of the plans on it again
    (fleet.hooks.TAX_HOOKS)."""
    rows = BusinessCase.objects.filter(
        Q(plan__candidate_pool=pool_id) | Q(plan__primary_pool=pool_id))
    _judge_all(rows, what)


def _judge_all(rows: QuerySet[BusinessCase], cause: str) -> None:
    for row in rows.select_related("plan").order_by("id"):
        try:
            business_case_judge(plan=row.plan, cause=cause)
        except Exception:  # one plan's trouble must not stop the others
            log.exception("business case of %s not judged again", row.plan.name)
