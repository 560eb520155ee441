"""Traffic tasks. Each is short: one attempt, one look. Their queues are set by name in
fleetctl/celery.py (pushes, converge and reconcile on `push`, the drain watcher on `watch`,
sampling on `probe`, pruning on `default`). The watcher (`traffic.drain_watch`) re-queues
itself with a countdown instead of waiting inside a worker thread."""

from __future__ import annotations

import time

from fleetctl.celery import app
from fleetctl.traffic import mirror_auth, push, sampling
from fleetctl.traffic.models import Gateway


@app.task(name="traffic.push_run", ignore_result=True, acks_late=True)
def push_run(push_id: int, attempts: int | None = None) -> str:
    """One attempt to bring a gateway in line; the push engine queues the next one with backoff
    until it works, a permanent error stops it, or a newer push takes over."""
    return push.push_execute(push_id=push_id, attempts=attempts)


@app.task(name="traffic.push_fanout", ignore_result=True, acks_late=True)
def push_fanout(push_ids: list[int]) -> None:
    """First attempt for every gateway of a new revision, in parallel; each failure then
    retries on its own with backoff (push_run). A gateway that verifies may settle pushes of
    open drains (it is sent its whole state), so they are looked at right after."""
    push.push_fanout(push_ids=push_ids)
    push.drains_advance()


# The watcher's pace: fast at first (drains are timed in milliseconds), then once a second.
WATCH_FIRST_PAUSE_S = 0.02
WATCH_MAX_PAUSE_S = 1.0
# After this long the converge task (every TRAFFIC_CONVERGE_INTERVAL_S) follows the drain.
WATCH_FOR_S = 60.0


@app.task(name="traffic.drain_watch", ignore_result=True)
def drain_watch(drain_id: int, pause_s: float = 0.0, until: float | None = None) -> None:
    """A watcher: one look at a drain (every gateway verified? in-flight streams closed?
    given up?); if it is still open, the next look is queued with a countdown. Nothing waits
    inside a worker thread, so however many drains are waiting, the pushes always have
    threads."""
    if push.drain_progress(drain_id=drain_id):
        return
    until = time.time() + WATCH_FOR_S if until is None else until
    pause = min(max(pause_s * 1.5, WATCH_FIRST_PAUSE_S), WATCH_MAX_PAUSE_S)
    if time.time() + pause < until:
        drain_watch.apply_async((drain_id, pause, until), countdown=pause)


@app.task(name="traffic.converge", ignore_result=True)
def converge() -> int:
    """Beat, every TRAFFIC_CONVERGE_INTERVAL_S: from the rows alone, drive again every
    gateway's newest push whose attempt is overdue (lost with a process or a worker), and
    take every stepped drain's step that is due, and advance every open drain — whatever
    died since they were made. Returns how many pushes
    it drove."""
    from fleetctl.traffic.services import drain_steps_due

    driven = push.pushes_converge()
    drain_steps_due()  # a stepped drain's next step, when due
    push.drains_advance()
    return driven


@app.task(name="traffic.reconcile", ignore_result=True)
def reconcile() -> int:
    """Beat: compare every gateway with its desired state; re-push where it drifted. And
    publish the gateways' mirror tokens again: a Redis that restarted empty has none."""
    mirror_auth.publish_quietly()
    return sum(push.gateway_reconcile(gateway=gateway)
               for gateway in Gateway.objects.prefetch_related("routes"))


@app.task(name="traffic.sample", ignore_result=True)
def sample() -> int:
    """Beat: read every gateway's per-pool counters (rates are computed from these rows)."""
    return sum(sampling.traffic_sample(gateway=gateway) for gateway in Gateway.objects.all())


@app.task(name="traffic.samples_prune", ignore_result=True)
def samples_prune() -> int:
    return sampling.traffic_samples_prune()


@app.task(name="traffic.health_policy", ignore_result=True)
def health_policy(transition_id: int) -> int:
    """A pool's health flipped (fleet's HEALTH_HOOKS queue this after the commit): drain it
    off the routes whose policy says so, or restore it; then push, as a person's drain is
    pushed. Returns how many drains or restores it made."""
    from fleetctl.traffic import health

    made = health.policy_apply(transition_id=transition_id)
    for drain in made:
        push.drain_push_now(drain)
    return len(made)
