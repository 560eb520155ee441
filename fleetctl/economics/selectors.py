"""Reads of the business case: a plan's inputs (stored, or the defaults when nobody has edited
them yet) and the case judged from them now."""

from __future__ import annotations

from datetime import datetime

from fleetctl.economics.case import Case, judge
from fleetctl.economics.models import BusinessCase
from migrations_plan.models import Plan


def business_case_of(plan: Plan) -> BusinessCase:
    """The plan's stored inputs, or an unsaved row of defaults."""
    found = BusinessCase.objects.filter(plan=plan).first()
    return found if found is not None else BusinessCase(plan=plan)


def case_of(plan: Plan, *, now: datetime | None = None) -> tuple[BusinessCase, Case]:
    """The inputs and the case judged from them at `now` (default: now)."""
    inputs = business_case_of(plan)
    return inputs, judge(plan, inputs, now=now)
