from __future__ import annotations

import time

from fleetctl.celery import app
from fleetctl.traffic import services
from fleetctl.traffic.models import Gateway


@app.task(name="traffic.push_run", bind=True, ignore_result=True, max_retries=None,
          acks_late=True)
def push_run(self, push_id: int) -> str:  # type: ignore[no-untyped-def]
    """One attempt to bring a gateway in line; retries with backoff until it works, a
    permanent error stops it, or a newer state supersedes it."""
    status, retry_in = services.push_execute(push_id=push_id)
    if retry_in is not None:
        raise self.retry(countdown=retry_in)
    return status


@app.task(name="traffic.push_fanout", ignore_result=True, acks_late=True)
def push_fanout(push_ids: list[int]) -> None:
    """First attempt for every gateway of a new revision, in parallel; each failure then
    retries on its own with backoff (push_run)."""
    services.push_fanout(push_ids=push_ids)


@app.task(name="traffic.drain_watch", ignore_result=True, soft_time_limit=960,
          time_limit=990)
def drain_watch(drain_id: int) -> None:
    """Follow a drain until every gateway verified and its in-flight streams closed. Polls
    fast at first (drains are timed in milliseconds), then backs off. The first look waits
    for the pushes to have had a chance: they run in this worker too, and every look before
    they finish only takes CPU from them (the verified time is the pushes' own, not the
    moment the watcher notices)."""
    deadline = time.monotonic() + services.drain_watch_timeout_s()
    pause = 0.02
    while time.monotonic() < deadline:
        time.sleep(pause)
        if services.drain_progress(drain_id=drain_id):
            return
        pause = min(pause * 1.5, 1.0)
    services.drain_give_up(drain_id=drain_id, why="gave up watching after the timeout")


@app.task(name="traffic.reconcile", ignore_result=True)
def reconcile() -> int:
    """Beat: compare every gateway with its desired state; re-push where it drifted."""
    return sum(services.gateway_reconcile(gateway=gateway)
               for gateway in Gateway.objects.prefetch_related("routes"))


@app.task(name="traffic.sample", ignore_result=True)
def sample() -> int:
    """Beat: read every gateway's per-pool counters (rates are computed from these rows)."""
    return sum(services.traffic_sample(gateway=gateway) for gateway in Gateway.objects.all())


@app.task(name="traffic.samples_prune", ignore_result=True)
def samples_prune() -> int:
    return services.traffic_samples_prune()
