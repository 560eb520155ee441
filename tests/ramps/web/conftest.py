"""Fixtures for the ramp pages: the traffic pages' people, pools and route (route `llama`,
95 % h200-us / 5 % mi300x-us), ramps written as rows (any state, any timeline), and
telemetry windows written directly, as the ingester would."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from fleetctl.fleet.models import Pool
from fleetctl.ramps.models import Ramp, RampEvent
from fleetctl.telemetry import histogram
from fleetctl.telemetry.models import Window
from fleetctl.traffic.models import Route
from tests.traffic.web.conftest import (  # noqa: F401 - fixtures
    login_as,
    oncall,
    pools,
    route,
    viewer,
)

STEPS = [{"percent": 1, "hold_s": 60}, {"percent": 5, "hold_s": 60},
         {"percent": 10, "hold_s": 120}]


def make_ramp(on: Route, *, pool: str = "mi300x-us", state: str = "running",
              step_index: int = 1, reason: str = "", events: list[dict[str, Any]] | None = None,
              started: datetime | None = None, **extra: Any) -> Ramp:
    """A ramp row as the controller would have left it, with START and STEP events up to
    `step_index` (one minute apart) unless `events` are given."""
    started = started or timezone.now() - timedelta(minutes=5)
    ramp = Ramp.objects.create(
        route=on, pool=Pool.objects.get(name=pool), steps=STEPS, min_samples=50,
        window_s=30, failure_threshold=2, slo_ttft_p95_ms=800, slo_tpot_p95_ms=60,
        slo_error_rate=0.01, latency_margin_pct=10,
        base_weights={"h200-us": 95, "mi300x-us": 5}, state=state, state_reason=reason,
        step_index=step_index, revision_number=on.revision_number,
        step_started_at=started + timedelta(minutes=step_index + 1) if step_index >= 0 else None,
        created_by="olga", created_at=started,
        finished_at=None if state in ("running", "paused") else timezone.now(), **extra)
    if events is None:
        events = [{"kind": "start", "step_index": -1, "message": "started", "at": started}]
        for index in range(step_index + 1):
            events.append({"kind": "step", "step_index": index,
                           "percent": STEPS[index]["percent"],
                           "message": f"step {index + 1}/3 → {STEPS[index]['percent']} %",
                           "at": started + timedelta(minutes=index + 1)})
    for event in events:
        RampEvent.objects.create(ramp=ramp, actor=event.pop("actor", f"ramp-{ramp.pk}"),
                                 **event)
    return ramp


def add_window(*, pool: str, route_name: str = "llama", source: str = "gateway",
               source_name: str = "envoy-a", ago_s: float = 20, requests: int = 100,
               errors: int = 0, ttft_ms: float | None = 200.0, tpot_ms: float | None = None
               ) -> Window:
    """One 10 s window `ago_s` ago: `requests` answers, all streamed, each with the same
    TTFT (gateway) or TPOT (pool /metrics)."""
    now = timezone.now()
    start = now - timedelta(seconds=ago_s)
    start = start.replace(second=start.second - start.second % 10, microsecond=0)
    ttft: dict[str, int] = {}
    tpot: dict[str, int] = {}
    if ttft_ms is not None:
        histogram.add(ttft, ttft_ms, requests)
    if tpot_ms is not None:
        histogram.add(tpot, tpot_ms, requests)
    return Window.objects.create(
        source=source, source_name=source_name if source == "gateway" else pool,
        route=route_name if source == "gateway" else "", pool=pool, resolution_s=10,
        start=start, requests=requests if source == "gateway" else 0,
        errors=errors, streamed=requests if source == "gateway" else 0,
        ttft=ttft, tpot=tpot, updated_at=now)


def ms_text(ms: float) -> str:
    """How the pages print a latency (fleetctl/ramps/templatetags/ramps.py)."""
    return f"{ms:,.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
