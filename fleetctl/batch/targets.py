"""The stage rules of batch work: which pools batch jobs may target.

Stage 3 of a migration plan (batch) is where the candidate first takes real work — nightly
jobs, backfills, eval sweeps — so a batch job on a plan's candidate needs the plan at stage 3
or later. Below it (stage 1 or 2, or paused there) the candidate is still being proven on
copies and probes, and a job would put real work on it early. A primary, a pool in no open
plan, and the candidate of a completed plan are not restricted here. The matching rule for
traffic (weight on batch-class routes at stage 3, interactive weight at stage 4) is the
live-weight guard, migrations_plan/selectors.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from migrations_plan.models import STAGE_NAMES, Plan

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool


def job_target_refusal(pool: Pool) -> str | None:
    """Why a batch job may not target `pool` now, or None. Every open plan whose candidate
    the pool is must be at stage 3 or later (a plan paused at stage 3 or 4 already proved
    what stage 2 asks; its candidate may keep running batch work while people look). The
    reason names the plan, where it is and what would allow it."""
    plans = (Plan.objects.filter(candidate_pool=pool, stage__lt=3)
             .exclude(state__in=Plan.CLOSED_STATES).order_by("-created_at", "-id"))
    plan = plans.first()
    if plan is None:
        return None
    where = (f"paused at stage {plan.stage} ({STAGE_NAMES[plan.stage]})"
             if plan.state == Plan.State.PAUSED else
             f"at stage {plan.stage} ({STAGE_NAMES[plan.stage]})")
    return (f"{pool.name} is the candidate of plan {plan.name}, which is {where}; batch jobs "
            f"on its candidate need stage 3 (batch). Advance the plan to stage 3 first.")
