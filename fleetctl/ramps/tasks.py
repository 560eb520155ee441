"""Ramp tasks, both short (one tick), on the `watch` queue (fleetctl/celery.py). Neither
raises out: a tick's trouble is logged and, when a ramp is known, recorded on its timeline as
an ERROR event (services.ramps_tick does that per ramp); the next beat tries again."""

from __future__ import annotations

import logging

from fleetctl.celery import app
from fleetctl.ramps import services

log = logging.getLogger("fleetctl.ramps")


@app.task(name="ramps.tick", ignore_result=True)
def tick() -> int:
    """Beat, every RAMP_TICK_INTERVAL_S: drive every due running ramp one step."""
    try:
        return services.ramps_tick()
    except Exception:
        log.exception("ramps.tick failed")
        return 0


@app.task(name="ramps.run", ignore_result=True)
def run(ramp_id: int) -> int:
    """One tick of one ramp now (queued when it is created, resumed or skipped), so its first
    step does not wait for the beat."""
    try:
        return services.ramps_tick(only=ramp_id)
    except Exception as exc:
        log.exception("ramps.run(%s) failed", ramp_id)
        services.record_error(ramp_id, exc)
        return 0


@app.task(name="ramps.watch_tick", ignore_result=True)
def watch_tick() -> int:
    """Beat, every WATCH_TICK_INTERVAL_S: judge each standing watch's newest whole window."""
    try:
        return services.watch_tick()
    except Exception:
        log.exception("ramps.watch_tick failed")
        return 0
