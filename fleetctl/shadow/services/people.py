"""What a person (or an API client) does to a shadow run: start, adjust and stop it. Each
checks the permission and is audited; stopping is the kill switch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError, required_reason
from fleetctl.fleet.models import Pool
from fleetctl.shadow import live
from fleetctl.shadow.models import ShadowRun
from fleetctl.shadow.services._shared import _end, _fingerprints, _owner, _publish
from migrations_plan import jobs

if TYPE_CHECKING:
    from fleetctl.bench.models import Trace
    from fleetctl.traffic.models import Route
    from migrations_plan.models import Plan

ADJUSTABLE = ("sample_percent", "max_rps", "max_tokens_per_day", "content", "retention_hours",
              "min_pairs")


# --- start ------------------------------------------------------------------------------------

def _choose_route(plan: Plan, route: Route | None) -> Route:
    routes = list(plan.routes.order_by("name"))
    if route is None:
        if len(routes) == 1:
            return routes[0]
        raise ValidationError({"route": [
            f"Plan {plan.name} has routes {', '.join(r.name for r in routes)}: name the one "
            f"to shadow." if routes else f"Plan {plan.name} has no route to shadow; add one "
                                         f"to the plan first."]})
    if route.pk not in {r.pk for r in routes}:
        raise ValidationError({"route": [
            f"Route {route.name} is not one of plan {plan.name}'s routes "
            f"({', '.join(r.name for r in routes) or 'none'})."]})
    return route


def _outside_pin(route: Route, pools: list[Pool]) -> list[str]:
    """Residency: each pool the route's pin does not allow its requests to go to."""
    return [f"Residency: pool {pool.name} is in jurisdiction {pool.region.jurisdiction}, but "
            f"route {route.name} is pinned to {route.residency}; its requests may not be sent "
            f"there." for pool in pools
            if route.residency and pool.region.jurisdiction != route.residency]


def _without_mirror(route: Route, mode: str) -> list[str]:
    """Names of the route's gateways that cannot mirror; refuses a mirror run when none can."""
    gateways = list(route.gateways.order_by("name"))
    unable = [g for g in gateways if not g.supports_mirror]
    without = [g.name for g in unable]
    if mode != ShadowRun.Mode.MIRROR:
        return without
    if not gateways:
        raise ValidationError({"route": [
            f"Route {route.name} is carried by no gateway, so no gateway can mirror it: add it "
            f"to a gateway, or start a replay run instead."]})
    if len(without) == len(gateways):
        labels = sorted({g.get_kind_display() for g in unable})
        raise ValidationError({"mode": [
            f"{' and '.join(labels)} cannot mirror; start a replay run instead (route "
            f"{route.name} is carried only by {', '.join(without)})."]})
    return without


def _check_trace(mode: str, trace: Trace | None) -> None:
    if mode == ShadowRun.Mode.MIRROR:
        if trace is not None:
            raise ValidationError({"trace": ["A mirror run copies live requests; leave the trace "
                                             "out, or start a replay run to replay it."]})
        return
    if trace is None:
        raise ValidationError({"trace": ["A replay run needs a stored trace whose requests "
                                         "carry prompt texts; name one."]})
    if not (trace.summary or {}).get("with_text_share"):
        raise ValidationError({"trace": [
            f"Trace {trace.name} carries no prompt texts (token counts only), so there is "
            f"nothing to compare answers on: replay a trace whose requests have a prompt or "
            f"messages."]})


def run_create(*, actor: Actor, plan: Plan, mode: str = "mirror", route: Route | None = None,
               trace: Trace | None = None, sample_percent: float = 10.0, max_rps: float = 2.0,
               max_tokens_per_day: int = 2_000_000, content: str = "redacted",
               retention_hours: int = 168, min_pairs: int = 200,
               confidence: float = 0.95) -> ShadowRun:
    """Start a shadow run of the plan's candidate against its primary, on the route's model
    (jobs.resolve_plan_targets, each pool inside the route's residency pin). Nothing is
    stored, mirrored or published when anything is refused."""
    actor.require(roles.JOBS, action="shadow.run.create", target=plan)
    jobs.require_open(plan, "shadow runs", optional=False)
    if mode not in ShadowRun.Mode.values:
        raise ValidationError({"mode": [f"Mode is mirror (copy live requests) or replay "
                                        f"(replay a stored trace), not {mode!r}."]})
    _check_trace(mode, trace)
    route = _choose_route(plan, route)
    candidate = Pool.objects.select_related("region").get(pk=plan.candidate_pool_id)
    primary = Pool.objects.select_related("region").get(pk=plan.primary_pool_id)
    outside = _outside_pin(route, [candidate, primary])
    if outside:
        raise ValidationError({"route": outside})
    jobs.resolve_plan_targets(plan, noun="shadow runs", candidate=candidate, primary=primary,
                              model_id=route.model_id,
                              fields={"candidate": "plan", "primary": "plan"})
    without = _without_mirror(route, mode)
    now = timezone.now()
    run = ShadowRun(plan=plan, plan_stage=plan.stage, route=route, candidate=candidate,
                    primary=primary, model_id=route.model_id, mode=mode, trace=trace,
                    sample_percent=sample_percent, max_rps=max_rps,
                    max_tokens_per_day=max_tokens_per_day, content=content,
                    retention_hours=retention_hours, min_pairs=min_pairs,
                    confidence=confidence, margin=plan.quality_margin_pct / 100,
                    gateways_without_mirror=without, created_by=actor.label,
                    started_at=now, heartbeat_at=now)
    # What its judgement is about: a pool that changes from this restarts it (judging.py).
    run.judged_fingerprints = _fingerprints(run)
    run.full_clean(validate_constraints=False)  # one running run per plan: checked below
    try:
        with transaction.atomic():
            _refuse_busy(plan, route, mode)
            run.save()
            if mode == ShadowRun.Mode.MIRROR:
                from fleetctl.traffic.services import route_mirror_set

                route_mirror_set(actor=actor, route=route, percent=float(sample_percent),
                                 pools=[candidate, primary], owner=_owner(run))
            audit_record(actor=actor, action="shadow.run.create", target=run,
                         after=_settings_of(run) | {
                             "plan": plan.name, "route": route.name, "mode": mode,
                             "trace": trace.name if trace else None,
                             "candidate": candidate.name, "primary": primary.name,
                             "margin": run.margin, "gateways_without_mirror": without})
            transaction.on_commit(lambda: _start(run))
    except IntegrityError:
        raise ConflictError(f"Plan {plan.name} already has a running shadow run; stop it "
                            f"first.") from None
    return run


def _refuse_busy(plan: Plan, route: Route, mode: str) -> None:
    """One running run per plan; and one mirror per route (the route holds one mirror share
    and the collectors one run per route). A replay uses no mirror."""
    clash = Q(plan=plan)
    if mode == ShadowRun.Mode.MIRROR:
        clash |= Q(route=route, mode=ShadowRun.Mode.MIRROR)
    busy = (ShadowRun.objects.select_for_update()
            .filter(clash, status=ShadowRun.Status.RUNNING).first())
    if busy is not None:
        raise ConflictError(
            f"Shadow run {busy.pk} ({busy.mode} of route "
            f"{busy.route.name if busy.route else '-'}, plan {busy.plan.name}) is still "
            f"running; stop it first.")


def _settings_of(run: ShadowRun) -> dict[str, Any]:
    return {name: getattr(run, name) for name in (*ADJUSTABLE, "confidence")}


def _start(run: ShadowRun) -> None:
    if run.mode == ShadowRun.Mode.MIRROR:
        _publish(run)
    else:
        from fleetctl.shadow.tasks import replay

        replay.delay(run.pk)


# --- adjust and stop --------------------------------------------------------------------------

def run_adjust(*, actor: Actor, run: ShadowRun, **changes: Any) -> ShadowRun:
    """Change a running run's share, caps, content policy, retention or min_pairs. The
    collectors see new caps within a second; a new share is pushed to the gateways."""
    actor.require(roles.JOBS, action="shadow.run.adjust", target=run)
    unknown = sorted(set(changes) - set(ADJUSTABLE))
    if unknown:
        raise ValidationError({name: [f"Cannot be changed on a running run; what can: "
                                      f"{', '.join(ADJUSTABLE)}."] for name in unknown})
    if not changes:
        raise ValidationError({"changes": [f"Nothing to change; give one of "
                                           f"{', '.join(ADJUSTABLE)}."]})
    with transaction.atomic():
        locked = (ShadowRun.objects.select_for_update(of=("self",))
                  .select_related("route").get(pk=run.pk))
        if not locked.running:
            raise ConflictError(f"Shadow run {locked.pk} is {locked.status}; only a running "
                                f"run can be adjusted.")
        before = _settings_of(locked)
        for name, value in changes.items():
            setattr(locked, name, value)
        locked.full_clean()
        locked.save(update_fields=list(changes))
        if ("sample_percent" in changes and locked.mode == ShadowRun.Mode.MIRROR
                and locked.route is not None):
            from fleetctl.traffic.services import route_mirror_set

            route_mirror_set(actor=actor, route=locked.route,
                             percent=float(locked.sample_percent),
                             pools=[locked.candidate, locked.primary], owner=_owner(locked))
        audit_record(actor=actor, action="shadow.run.adjust", target=locked, before=before,
                     after=_settings_of(locked))
        if locked.mode == ShadowRun.Mode.MIRROR and locked.route is not None:
            transaction.on_commit(lambda: _publish(locked))
    return locked


def run_stop(*, actor: Actor, run: ShadowRun, reason: str) -> ShadowRun:
    """The kill switch, one action: unpublished (collectors stop within a second), the
    route's mirror cleared, the run stopped with the reason."""
    actor.require(roles.JOBS, action="shadow.run.stop", target=run)
    reason = required_reason(reason, "Say why the run stops (it goes in the record).")
    current = ShadowRun.objects.select_related("route").get(pk=run.pk)
    if not current.running:
        raise ConflictError(f"Shadow run {current.pk} is {current.status} already"
                            f"{': ' + current.stop_reason if current.stop_reason else ''}.")
    _unpublish(current)
    with transaction.atomic():
        locked = (ShadowRun.objects.select_for_update(of=("self",))
                  .select_related("route").get(pk=run.pk))
        if not locked.running:
            raise ConflictError(f"Shadow run {locked.pk} is {locked.status} already.")
        _end(locked, status=ShadowRun.Status.STOPPED, reason=reason, actor=actor)
    return locked


def _unpublish(run: ShadowRun) -> None:
    """Remove the route's entry when it is this run's (another run's is left alone)."""
    if run.route is None:
        return
    config = live.published().get(run.route.name)
    if config is not None and config.run == run.pk:
        live.unpublish_run(run.route.name)
