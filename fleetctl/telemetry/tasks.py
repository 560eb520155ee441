"""Telemetry's beat task (queue `default`, fleetctl/celery.py)."""

from __future__ import annotations

from typing import Any

from fleetctl.celery import app
from fleetctl.telemetry import services


@app.task(name="telemetry.downsample", ignore_result=True)
def downsample() -> dict[str, Any]:
    """Every minute: merge old fine windows into coarse ones, then drop expired ones."""
    done: dict[str, Any] = dict(services.downsample())
    done["pruned"] = services.prune()
    return done
