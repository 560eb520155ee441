"""A stepped drain's later steps (traffic/drain_capacity.py): the converge task calls
`drain_steps_due` every few seconds; each due drain reads the capacity again and moves what
fits now, and at least its step's part of the share its first step freed, so that by step
DRAIN_STEPS_MAX the drained pools carry nothing, whatever the capacity. A drain restored
meanwhile stops stepping. The new revisions' pushes are queued like any split change's."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.traffic import selectors
from fleetctl.traffic.models import Drain, Route, SplitRevision
from fleetctl.traffic.services._shared import _store_revision
from fleetctl.traffic.services.drains import _capacity_checked, _drain_plan

log = logging.getLogger("fleetctl.traffic")

SYSTEM = "drain-steps"


def drain_steps_due(*, now: datetime | None = None) -> int:
    """Take every stepped drain's step that is due. Returns how many were taken."""
    now = now or timezone.now()
    taken = 0
    for pk in (Drain.objects.filter(next_step_at__lte=now).order_by("next_step_at")
               .values_list("pk", flat=True)):
        try:
            taken += drain_step_take(drain_id=pk, now=now) is not None
        except Exception:  # one drain's trouble must not hold the others' steps
            log.exception("drain %s: could not take its next step", pk)
    return taken


def drain_step_take(*, drain_id: int, now: datetime | None = None) -> Drain | None:
    """One step of a stepped drain, if due (None otherwise, or when another process has
    it). One transaction: the drain row, then its routes, then their primaries."""
    now = now or timezone.now()
    actor = Actor.for_system(SYSTEM)
    with transaction.atomic():
        drain = (Drain.objects.select_for_update(skip_locked=True)
                 .filter(pk=drain_id, next_step_at__lte=now).first())
        if drain is None:
            return None
        steps = dict(drain.capacity.get("steps") or {})
        step = int(steps.get("done", 1)) + 1
        routes = list(Route.objects.filter(revisions__drains=drain).distinct())
        plan = _drain_plan(route=drain.route, pool=None if drain.route else drain.pool,
                           only=routes)
        # Looked at under the routes' locks, which a restore takes too: one that committed
        # while this step waited for them is seen here.
        restored = selectors.drain_restored_by(drain=drain)
        if restored is not None:
            steps["stopped"] = f"restored by restore {restored.pk} before step {step}"
            return _save(drain, steps, None)
        first = {note["route"]: note["freed_bp"] for note in drain.capacity.get("routes", [])}
        checked, capacity = (_capacity_checked(plan, force=False, stepping=True, step=step,
                                               first=first) if plan else ({}, {}))
        revisions: list[SplitRevision] = []
        for locked, weights, removed, current in checked or []:
            revisions.append(_store_revision(
                actor=actor, route=locked, base=locked.revision_number, weights=weights,
                kind=SplitRevision.Kind.DRAIN, parent=current,
                reason=f"drain {drain.pk} step {step}: {', '.join(sorted(removed))}"))
        drain.revisions.add(*revisions)
        left = (capacity.get("steps") or {}).get("left_bp", {})
        steps["done"], steps["left_bp"] = step, left
        steps.setdefault("log", []).append({
            "step": step, "at": now.isoformat(), "why": capacity.get("why", "nothing left"),
            "routes": [{k: note.get(k) for k in ("route", "decision", "load_streams",
                                                  "left_bp", "weights")}
                       for note in capacity.get("routes", [])],
            "revisions": [f"{rev.route.name} r{rev.number}" for rev in revisions]})
        more = any(left.values()) and step < int(steps.get("max", settings.DRAIN_STEPS_MAX))
        at = now + timedelta(seconds=int(steps.get("interval_s", 30))) if more else None
        audit_record(actor=actor, action="drain.step", target=drain,
                     message=f"step {step}: {capacity.get('why', 'nothing left to move')}",
                     after={"step": step, "left_bp": left,
                            "revisions": [rev.number for rev in revisions]})
        return _save(drain, steps, at)


def _save(drain: Drain, steps: dict, at: datetime | None) -> Drain:
    drain.capacity = {**drain.capacity, "steps": steps}
    drain.next_step_at = at
    drain.save(update_fields=["capacity", "next_step_at"])
    return drain
