"""Webhook tasks, on the `default` queue (fleetctl/celery.py)."""

from __future__ import annotations

from fleetctl.celery import app
from fleetctl.webhooks import services


@app.task(name="webhooks.deliver", ignore_result=True)
def deliver(delivery_id: int) -> str:
    """One attempt; a retry is queued by the attempt itself (apply_async with a countdown)
    once its row is committed, so a lost task loses at most one attempt's timing, not the
    record."""
    return services.delivery_attempt(delivery_id=delivery_id)


@app.task(name="webhooks.prune", ignore_result=True)
def prune() -> int:
    """Beat, hourly: deliveries (and their attempts) older than 30 days."""
    return services.deliveries_prune(older_than_days=30)
