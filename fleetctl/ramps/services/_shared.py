"""What a person's actions and the controller share: the ramp's state and end, its events
(and the webhooks they notify), draining the ramped pool, and reading a ramp's thresholds."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.core.errors import ConflictError
from fleetctl.ramps import guard
from fleetctl.ramps.models import Ramp, RampEvent, Watch
from fleetctl.traffic.models import Drain

log = logging.getLogger("fleetctl.ramps")

MAX_STEPS = 20
THRESHOLD_FIELDS = ("slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_error_rate",
                    "latency_margin_pct", "slo_e2e_p95_ms")
# Thresholds the guard judges only when given (or the plan states them).
OPTIONAL_THRESHOLDS = ("slo_e2e_p95_ms",)
# Without a plan, how much slower than the primary the candidate may be: a plan's default.
DEFAULT_LATENCY_MARGIN_PCT = 10.0
Kind = RampEvent.Kind
# Kinds that tell the people subscribed to "ramp.decision" something happened.
NOTIFIED = {Kind.STEP, Kind.PASS, Kind.WARN, Kind.FAIL, Kind.ROLLBACK, Kind.PAUSE,
            Kind.RESUME, Kind.ABORT, Kind.COMPLETE, Kind.MANUAL_CHANGE}


def _drain(ramp: Ramp, *, actor: Actor, reason: str) -> Drain | None:
    from fleetctl.traffic.services import drain_request

    try:
        with transaction.atomic():
            return drain_request(actor=actor, pool=ramp.pool, routes=[ramp.route],
                                 reason=reason)
    except ConflictError:  # nothing to drain: the pool has no weight on the route
        return None


def thresholds_of(ramp: Ramp | Watch) -> guard.Thresholds:
    """A ramp's SLO, or a standing watch's (copied from its ramp at hand-over)."""
    return guard.Thresholds(slo_ttft_p95_ms=ramp.slo_ttft_p95_ms,
                            slo_tpot_p95_ms=ramp.slo_tpot_p95_ms,
                            slo_error_rate=ramp.slo_error_rate,
                            latency_margin_pct=ramp.latency_margin_pct,
                            slo_e2e_p95_ms=ramp.slo_e2e_p95_ms)


def _bp(percent: float) -> int:
    return round(float(percent) * 100)


def _locked(ramp: Ramp) -> Ramp:
    return (Ramp.objects.select_for_update(of=("self",))
            .select_related("route", "pool", "plan").get(pk=ramp.pk))


def _set_state(ramp: Ramp, state: str, reason: str) -> None:
    ramp.state, ramp.state_reason = state, reason[:5000]
    Ramp.objects.filter(pk=ramp.pk).update(state=state, state_reason=ramp.state_reason)


def _finish(ramp: Ramp, state: str, reason: str, *, drain: Drain | None = None) -> None:
    now = timezone.now()
    ramp.state, ramp.state_reason, ramp.finished_at = state, reason[:5000], now
    ramp.drain = drain if drain is not None else ramp.drain
    Ramp.objects.filter(pk=ramp.pk).update(state=state, state_reason=ramp.state_reason,
                                           finished_at=now, drain=ramp.drain)


def _event(ramp: Ramp, kind: str, *, message: str, actor: Actor | None = None,
           numbers: dict[str, Any] | None = None, revision_number: int | None = None,
           drain: Drain | None = None, evidence_id: int | None = None,
           at: datetime | None = None) -> RampEvent:
    step = ramp.current_step
    event = RampEvent.objects.create(
        ramp=ramp, kind=kind, step_index=ramp.step_index, at=at or timezone.now(),
        percent=float(step["percent"]) if step else None, message=message[:10_000],
        numbers=numbers or {}, actor=(actor or Actor.for_system(f"ramp-{ramp.pk}")).label,
        revision_number=revision_number, drain=drain, evidence_id=evidence_id)
    if kind in NOTIFIED:
        _notify(ramp, event)
    return event


def _notify(ramp: Ramp, event: RampEvent) -> None:
    from fleetctl.webhooks.services import notify

    payload = {"ramp": ramp.pk, "route": ramp.route.name, "pool": ramp.pool.name,
               "kind": event.kind, "state": ramp.state, "step": ramp.step_index + 1,
               "steps_total": len(ramp.steps), "percent": event.percent,
               "message": event.message, "actor": event.actor,
               "drain": event.drain_id, "at": event.at.isoformat(), "url": f"/ramps/{ramp.pk}/"}
    notify("ramp.decision", payload,
           text=f"Ramp {ramp.pk} ({ramp.pool.name} on {ramp.route.name}) {event.kind}: "
                f"{event.message}"[:500])
