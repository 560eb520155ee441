"""Upgrades re-verified by themselves: a pool that reports a change nobody registered.

The health probe reads what each server says of itself (fleet/probe.py: its version from
`GET /version`, each model's max_model_len) and, when that changes, calls the report hooks
(fleet.services.REPORT_HOOKS) once the probe's row committed. The evidence measured on the
old server no longer counts (the version is part of the evidence fingerprint), so every
open plan whose candidate the pool is goes "at risk" at its next refresh; this hook starts
the first re-verification at once: a conformance probe of the pool against each such plan's
primary, by `system:reverify`, on the plan's audit trail. Its new evidence clears the risk
when it passes. (Eval and benchmark re-runs are not started here yet.)
"""

from __future__ import annotations

import logging

from django.core.exceptions import ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.conformance import services
from fleetctl.conformance.models import ConformanceRun
from fleetctl.core.errors import DomainError
from fleetctl.fleet.models import Pool
from migrations_plan.models import Plan

log = logging.getLogger(__name__)
ACTOR = Actor.for_system("reverify")


def reverify_candidate(pool_id: int, changes: list[str]) -> list[ConformanceRun]:
    """Queue a conformance probe of the pool for each open plan it is the candidate of
    (none while one is already queued or running for that plan)."""
    pool = Pool.objects.filter(pk=pool_id).first()
    if pool is None:
        return []
    started = []
    why = "; ".join(changes)
    for plan in Plan.objects.filter(candidate_pool=pool).exclude(
            state__in=Plan.CLOSED_STATES).order_by("pk"):
        if ConformanceRun.objects.filter(pool=pool, plan=plan,
                                         status__in=ConformanceRun.ACTIVE).exists():
            continue
        try:
            run = services.run_create(actor=ACTOR, pool=pool, plan=plan)
        except (ValidationError, DomainError) as exc:
            log.warning("re-verification of %s for plan %s refused: %s", pool.name,
                        plan.name, exc)
            audit_record(actor=ACTOR, action="plan.reverify", target=plan,
                         message=f"{pool.name} reports {why}; its conformance probe could "
                                 f"not be started: {exc}"[:2000])
            continue
        audit_record(actor=ACTOR, action="plan.reverify", target=plan,
                     message=f"{pool.name} reports {why}: conformance run {run.pk} started "
                             f"to re-verify it against {plan.primary_pool.name}"[:2000],
                     after={"conformance_run": run.pk, "changes": changes})
        started.append(run)
    return started
