"""Upgrades re-verified by themselves: a pool that changed, as its servers report it or as
the registry says.

Two triggers, one path. The health probe reads what each server says of itself (fleet/probe.py:
its version from `GET /version`, each model's max_model_len and weights revision) and, when
that changes, calls the report hooks (fleet/hooks.py REPORT_HOOKS) once the probe's row
committed; a registry edit that changes the pool's fingerprint (runtime version, driver
label, a model's revision, quantisation or weight format) calls the change hooks
(fleet/hooks.py CHANGE_HOOKS). Either way the evidence measured on the old pool no longer
counts, so every open plan whose candidate it is goes "at risk" at its next refresh, and:

1. **Conformance.** A probe of the pool, by `system:reverify`, for each open plan it is the
   candidate of (against the plan's primary), and, for each route where it carries weight
   without being a plan's candidate there, against the route's primary (one active probe
   per pool: the first one started covers the pool; the others are said on the record).
   Meanwhile its running ramps hold (ramps' own report and change hooks).
2. **When the probe finishes** (`after_run`, called by the `conformance.run` task):
   - passing (or warn: only optional cases fail): the hooks of migrations_plan/reverify.py
     for each such plan — evals re-runs the plan's last suite (fleetctl/evals/reverify.py),
     bench the candidate's last benchmark where a route of the plan has `reverify_benchmark`
     on and the gate has a benchmark check (fleetctl/bench/reverify.py);
   - failing: the routes' `reverify_policy` (fleetctl/traffic/reverify.py): on a `drain`
     route with weight the pool is drained through the drain service, by `system:reverify`
     (audited, `drain.automatic` webhook); `hold` routes keep it, ramps paused.
Every step is on the plan's audit trail as `plan.reverify` (or the pool's, without a plan).
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.conformance import services
from fleetctl.conformance.models import ConformanceRun
from fleetctl.core.errors import DomainError
from fleetctl.fleet.models import Pool
from fleetctl.traffic.models import Route
from fleetctl.traffic.reverify import weighted_routes
from migrations_plan.models import Plan
from migrations_plan.reverify import run_reverified_hooks

log = logging.getLogger(__name__)
ACTOR = Actor.for_system("reverify")


# --- starting -----------------------------------------------------------------------------

def reverify_candidate(pool_id: int, changes: list[str]) -> list[ConformanceRun]:
    """The report hook (a change the pool's servers report). Kept under its old name."""
    return reverify_pool(pool_id, changes)


def reverify_registered(pool_id: int, changes: list[str]) -> list[ConformanceRun]:
    """The change hook (a registry edit of the pool's fingerprint): the same
    re-verification (the pool's ramps hold by ramps' own change hook)."""
    return reverify_pool(pool_id, changes)


def reverify_pool(pool_id: int, changes: list[str]) -> list[ConformanceRun]:
    """Queue a conformance probe of the pool for each open plan it is the candidate of, and
    for each route where it carries weight outside such a plan (none while one is already
    queued or running for the pool: it covers the change too)."""
    pool = Pool.objects.filter(pk=pool_id).first()
    if pool is None:
        return []
    started: list[ConformanceRun] = []
    why = "; ".join(changes)
    plans = list(Plan.objects.filter(candidate_pool=pool).exclude(
        state__in=Plan.CLOSED_STATES).select_related("primary_pool").order_by("pk"))
    for plan in plans:
        if ConformanceRun.objects.filter(pool=pool, plan=plan,
                                         status__in=ConformanceRun.ACTIVE).exists():
            continue
        run = _start(pool, why, changes, target=plan, plan=plan,
                     against=plan.primary_pool.name)
        if run is not None:
            started.append(run)
    covered = {route.pk for plan in plans for route in plan.routes.all()}
    for route in weighted_routes(pool):
        if route.pk in covered or route.primary_pool_id == pool.pk:
            continue  # a plan's probe covers it; a route's primary has no reference here
        if ConformanceRun.objects.filter(pool=pool, status__in=ConformanceRun.ACTIVE).exists():
            audit_record(actor=ACTOR, action="pool.reverify", target=pool,
                         message=f"{pool.name} reports {why}; it carries weight on route "
                                 f"{route.name}: the conformance probe already running "
                                 f"covers it"[:2000])
            continue
        run = _start(pool, why, changes, target=pool, route=route,
                     against=route.primary_pool.name)
        if run is not None:
            started.append(run)
    return started


def _start(pool: Pool, why: str, changes: list[str], *, target: Any, against: str,
           plan: Plan | None = None, route: Route | None = None) -> ConformanceRun | None:
    action = "plan.reverify" if plan is not None else "pool.reverify"
    where = f" (weight on route {route.name})" if route is not None else ""
    try:
        if plan is not None:
            run = services.run_create(actor=ACTOR, pool=pool, plan=plan)
        else:
            assert route is not None
            run = services.run_create(actor=ACTOR, pool=pool, primary=route.primary_pool,
                                      model_id=route.model_id)
    except (ValidationError, DomainError) as exc:
        log.warning("re-verification of %s refused: %s", pool.name, exc)
        audit_record(actor=ACTOR, action=action, target=target,
                     message=f"{pool.name} reports {why}{where}; its conformance probe "
                             f"could not be started: {exc}"[:2000])
        return None
    audit_record(actor=ACTOR, action=action, target=target,
                 message=f"{pool.name} reports {why}{where}: conformance run {run.pk} "
                         f"started to re-verify it against {against}"[:2000],
                 after={"conformance_run": run.pk, "changes": changes,
                        "route": route.name if route is not None else None})
    return run


# --- when the probe finished ----------------------------------------------------------------

def after_run(run: ConformanceRun) -> dict[str, Any]:
    """What a finished re-verification probe starts or does (see the module's text): the
    eval and benchmark re-runs it started, or the drains the routes' policy made. Only for a
    completed run by `system:reverify`; anything else: nothing."""
    from fleetctl.audit.models import AuditEvent

    done: dict[str, Any] = {"evals": [], "benchmarks": [], "drains": []}
    if run.created_by != ACTOR.label or run.status != ConformanceRun.Status.COMPLETE:
        return done
    if AuditEvent.objects.filter(actor=ACTOR.label, action="conformance.reverified",
                                 object_id=str(run.pk)).exists():
        return done  # a second look at the same finished run (a re-sent task)
    audit_record(actor=ACTOR, action="conformance.reverified", target=run,
                 message=f"re-verification probe finished: {run.verdict}: {run.summary}"[:2000],
                 after={"verdict": run.verdict})
    pool = run.pool
    if run.verdict == ConformanceRun.Verdict.FAIL:
        done["drains"] = [d.pk for d in _policy(run)]
        return done
    # warn: only optional cases fail; the required ones pass, so re-verification goes on.
    if run.verdict not in (ConformanceRun.Verdict.PASS, ConformanceRun.Verdict.WARN) \
            or run.plan is None:
        return done
    plan = run.plan
    if not plan.is_open:
        return done
    # Evals and bench register what they re-run (migrations_plan/reverify.py).
    done.update(run_reverified_hooks(plan, ACTOR))
    log.info("re-verification of %s for plan %s: %s", pool.name, plan.name, done)
    return done


def _policy(run: ConformanceRun) -> list[Any]:
    """The routes' `reverify_policy` for a failed probe (traffic/reverify.py), on the record."""
    from fleetctl.traffic.reverify import policy_apply

    pool = run.pool
    reason = (f"re-verification of {pool.name} failed: conformance run {run.pk}: "
              f"{run.summary}")[:2000]
    target: Any = run.plan if run.plan is not None else pool
    action = "plan.reverify" if run.plan is not None else "pool.reverify"
    outcome = policy_apply(actor=ACTOR, pool=pool, reason=reason,
                           details={"conformance_run": run.pk})
    if outcome.held:
        audit_record(actor=ACTOR, action=action, target=target,
                     message=f"{reason}; held on {', '.join(outcome.held)} (policy hold: "
                             f"ramps paused, nothing drained)"[:2000])
    if outcome.drain is not None:
        audit_record(actor=ACTOR, action=action, target=target,
                     message=f"{reason}; drained off {', '.join(outcome.drained)} by the "
                             f"routes' re-verification policy (drain {outcome.drain.pk})"[:2000],
                     after={"drain": outcome.drain.pk, "conformance_run": run.pk})
    if outcome.refused:
        audit_record(actor=ACTOR, action=action, target=target,
                     message=f"{reason}; the drain was refused: {outcome.refused}"[:2000])
    return [outcome.drain] if outcome.drain is not None else []
