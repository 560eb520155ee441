"""The demo's business case of the MI300X plan (called by `demo_seed` after the capacity run):
one short, real benchmark run of the plan's two pools together (the H200 primary and the
MI300X candidate, on the demo trace, at the plan's SLO), queued at seed time and run by the
demo's bench worker, so the plan's cost comparison, and with it the business case, reads
measured costs per 1M output tokens of both; and the plan's expected volume, the one input
the case has no default for.

The volume is a planning figure a lead would type (3 000 M output tokens a month, about 100
requests a second of 400-token answers, round the clock), not a measurement; the burden rows
and the engineer cost keep their defaults (docs/cost.md, "The business case"). Nothing here
is a measured number: the worker measures the simulated pools.

Created once: a run of this name, or a stored business case, is kept."""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import ObjectDoesNotExist, ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.core.errors import DomainError

NAME = "demo business case (short: H200 and MI300X, levels 2, 4, 8)"
PLAN = "mi300x-llama-8b"
# Light, like the capacity run's (its LEVELS and windows): the demo's ramp is judged on the
# pools' own metrics while this runs (fleetctl/demo/capacity_run.py).
EXPECTED_MTOKENS_PER_MONTH = "3000"


def seed_business_case(note: Callable[[str], None] = print) -> list[str]:
    """Queue the benchmark and set the plan's expected volume unless done before: what was
    made (a refusal is passed to `note`)."""
    from django.contrib.auth.models import User

    from fleetctl.demo.capacity_run import queue_short_run
    from fleetctl.economics.models import BusinessCase
    from fleetctl.economics.services import business_case_update
    from migrations_plan.models import Plan

    made: list[str] = []
    plan = Plan.objects.filter(name=PLAN).first()
    route = plan.routes.order_by("name").first() if plan is not None else None
    if plan is None or route is None:
        note(f"business case not seeded: no plan {PLAN} with a route")
        return made
    made += queue_short_run(name=NAME, pools=[plan.primary_pool, plan.candidate_pool],
                            model_id=route.model_id,
                            slo=(plan.slo_ttft_p95_ms, plan.slo_tpot_p95_ms,
                                 plan.slo_error_rate),
                            what="business-case benchmark", note=note)
    if not BusinessCase.objects.filter(plan=plan).exists():
        try:
            business_case_update(actor=Actor(user=User.objects.get(username="lead")),
                                 plan=plan,
                                 expected_mtokens_per_month=EXPECTED_MTOKENS_PER_MONTH)
            made.append(f"business case of {PLAN}")
        except (ValidationError, DomainError, ObjectDoesNotExist) as exc:
            note(f"business case of {PLAN} not set: {exc}")
    return made

