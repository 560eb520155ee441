"""The stage rules of batch work: which pools batch jobs may target.

Stage 3 of a migration plan (batch) is where the candidate first takes real work — nightly
jobs, backfills, eval sweeps — so a batch job on a plan's candidate needs the plan at stage 3
or later. Below it (stage 1 or 2, or paused there) the candidate is still being proven on
copies and probes, and a job would put real work on it early. A primary, a pool in no open
plan, and the candidate of a completed plan are not restricted here. The matching rule for
traffic (weight on batch-class routes at stage 3, interactive weight at stage 4) is the
live-weight guard, migrations_plan/selectors.py.

A batch submitted through the OpenAI Batch API names no pool: it goes through a batch-class
route (`batch_placement`), and runs on a pool that route's split gives weight, so it meets
both rules: the pool may carry the route's weight, and may take batch jobs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from migrations_plan.models import STAGE_NAMES, Plan

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Route


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


# --- the OpenAI Batch API: a batch goes through a batch-class route ---------------------------

BATCH_CLASS = "batch"


@dataclass(frozen=True)
class Placement:
    """Where an OpenAI-API batch runs: the route it names (or its model's one batch-class
    route) and the pool of that route's split it was given, with why."""

    route: Route
    pool: Pool
    reason: str


class PlacementError(Exception):
    """A batch that cannot be placed: `param` is the request field at fault (OpenAI's)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _route_for(models: list[str], named: str | None) -> Route:
    from fleetctl.traffic.selectors import route_get, route_list

    if named is not None:
        route = route_get(name=named)
        if route is None:
            raise PlacementError(f"No route named {named!r} (metadata.route).", "metadata")
        if route.latency_class != BATCH_CLASS:
            raise PlacementError(
                f"Route {route.name} is of latency class "
                f"{route.latency_class or 'any (none set)'}; batches run only on batch-class "
                f"routes (latency_class 'batch'), where the stage rules allow a plan's "
                f"candidate batch work from stage 3.", "metadata")
        wrong = [m for m in models if m != route.model_id]
        if wrong:
            raise PlacementError(f"Route {route.name} serves {route.model_id}, not "
                                 f"{wrong[0]} (the input file's model).", "input_file_id")
        return route
    if len(models) != 1:
        raise PlacementError(
            f"The input file asks for {len(models)} models ({', '.join(sorted(models))}); a "
            f"batch without metadata.route runs on its model's batch-class route, so it must "
            f"name one model.", "input_file_id")
    routes = list(route_list().filter(model_id=models[0], latency_class=BATCH_CLASS)
                  .order_by("name"))
    if not routes:
        raise PlacementError(
            f"No batch-class route serves {models[0]}: create a route of latency class "
            f"'batch' for it (batches run only on batch-class routes).", "input_file_id")
    if len(routes) > 1:
        raise PlacementError(
            f"{len(routes)} batch-class routes serve {models[0]} "
            f"({', '.join(r.name for r in routes)}); name one with metadata.route.",
            "metadata")
    return routes[0]


def batch_placement(*, models: list[str], route_name: str | None = None,
                    pool_name: str | None = None, rng: random.Random | None = None
                    ) -> Placement:
    """The route and pool of an OpenAI-API batch. The route is `route_name` (metadata.route)
    or the one batch-class route of the file's model; it must be batch-class. The whole
    batch runs on one pool of the route's current split: `pool_name` (metadata.pool) when
    given, which must be allowed batch work (the stage rules) and carry weight on the route;
    otherwise one drawn in proportion to the split's weights, as a request's pool would be.
    The job's own creation applies the stage rule again (job_target_refusal)."""
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.selectors import revision_current

    route = _route_for(models, route_name)
    revision = revision_current(route=route)
    split = {name: int(weight) for name, weight in (revision.weights if revision else {}).items()
             if int(weight) > 0}
    ids = revision.pool_ids if revision else {}
    pools = {p.name: p for p in Pool.objects.filter(name__in=list(split))}
    live = {name: w for name, w in split.items()
            if name in pools and ids.get(name) == pools[name].pk}
    said = ", ".join(f"{n} {w / 100:g} %" for n, w in sorted(live.items())) or "no pool"
    if pool_name is not None:
        pool = Pool.objects.filter(name=pool_name).first()
        if pool is None:
            raise PlacementError(f"No pool named {pool_name!r} (metadata.pool).", "metadata")
        refusal = job_target_refusal(pool)
        if refusal:
            raise PlacementError(refusal, "metadata")
        if pool_name not in live:
            raise PlacementError(
                f"{pool_name} carries no weight on route {route.name} ({said}); a batch "
                f"runs on a pool of its route's split.", "metadata")
        return Placement(route, pools[pool_name],
                         f"metadata.pool {pool_name} on route {route.name} ({said})")
    if not live:
        raise PlacementError(f"Route {route.name} gives no pool weight now (drained?); "
                             f"nothing can run its batches.", "input_file_id")
    names = sorted(live)
    chosen = (rng or random.Random()).choices(names, weights=[live[n] for n in names])[0]
    return Placement(route, pools[chosen],
                     f"drawn by route {route.name}'s weights ({said})")
