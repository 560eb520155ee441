"""What a person's actions and the workers share: who a run is (its owner, its system
actor, what its pools are), publishing it to the collectors, and ending it (the mirror
cleared, the end recorded and audited)."""

from __future__ import annotations

import logging

from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.shadow import live, selectors
from fleetctl.shadow.models import ShadowRun
from fleetctl.traffic import mirror_auth

log = logging.getLogger("fleetctl.shadow")
PRODUCER = "shadow"


def _owner(run: ShadowRun) -> str:
    return f"shadow run {run.pk}"


def _system() -> Actor:
    return Actor.for_system(PRODUCER)


def _fingerprints(run: ShadowRun) -> dict[str, dict[str, str]]:
    """What the run's primary and candidate are now, as evidence is bound to it."""
    from migrations_plan.evidence import pool_fingerprint

    return {"primary": pool_fingerprint(run.primary, [run.model_id]),
            "candidate": pool_fingerprint(run.candidate, [run.model_id])}


def _publish(run: ShadowRun) -> None:
    """The run for its route, and which gateways may mirror the route (their tokens: the
    collector refuses other copies). The tokens first: a Redis that lost them would have
    the run's genuine copies refused."""
    assert run.route is not None
    mirror_auth.publish_quietly()
    live.publish_run(run.pk, run.route.name, max_rps=run.max_rps,
                     max_tokens_per_day=run.max_tokens_per_day)


def _clear_mirror(locked: ShadowRun, *, reason: str, actor: Actor) -> None:
    """The route's mirror, when this run holds it (pushed to the gateways after the
    commit)."""
    if locked.mode == ShadowRun.Mode.MIRROR and locked.route is not None \
            and getattr(locked.route, "mirror_owner", "") == _owner(locked):
        from fleetctl.traffic.services import route_mirror_clear

        route_mirror_clear(actor=actor, route=locked.route, reason=f"{_owner(locked)}: {reason}")


def _end(locked: ShadowRun, *, status: str, reason: str, actor: Actor) -> None:
    """Inside a transaction holding the run's lock: clear the mirror this run owns, record
    the end (stopped: who stopped it; failed: the reason is its error too)."""
    _clear_mirror(locked, reason=reason, actor=actor)
    locked.status = status
    locked.stop_reason = reason[:2000]
    locked.finished_at = timezone.now()
    locked.counters = selectors.live_counters(locked)
    fields = ["status", "stop_reason", "finished_at", "counters"]
    if status == ShadowRun.Status.STOPPED:
        locked.cancelled_by = actor.label
        fields.append("cancelled_by")
    if status == ShadowRun.Status.FAILED:
        locked.error = reason[:2000]
        fields.append("error")
    locked.save(update_fields=fields)
    audit_record(actor=actor, action=f"shadow.run.{'stop' if status == 'stopped' else 'finish'}",
                 target=locked, message=reason[:2000],
                 after={"status": status, "counters": locked.counters})
