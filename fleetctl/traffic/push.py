"""The push engine: everything that talks to gateways, and the rows it writes about it.

A push is one gateway to bring in line with its whole desired state (every route it carries,
at its current revision). `services` stores pushes inside its transactions and never talks to
a gateway; this module does the talking, after those transactions commit:

* fan-out: the first attempt of several pushes at once, one thread per gateway (the work is
  waiting on gateways), every outcome recorded together in a few queries;
* attempts and retries: each attempt is a row; a failure retries on the `push` queue with
  backoff (push_run), a permanent error stops it;
* settling: a verified attempt settles the gateway's other open pushes — only those that were
  open when it read its desired state (`_open_pushes_now`);
* converge and reconcile (beat): drive pushes whose attempt was lost, re-push a gateway that
  drifted;
* drains: a drain's first push is made by the caller right after its transaction commits
  (`drain_push_now`, named at every call site), then the drain is followed from the rows
  (`drain_progress`): verified, in-flight streams closed, or failed.

One attempt's I/O and the rows it writes are in push_attempts.py, the following of drains in
push_drains.py; this module makes the attempts and is the one callers import.

Every entry point that may run in a request refuses to run inside a transaction
(`refuse_in_transaction`): gateway I/O must never sit inside someone's open transaction, nor
move silently to its commit.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Max
from django.utils import timezone

from fleetctl.traffic import mirror_auth, selectors
from fleetctl.traffic.gateways.base import AdapterError, DesiredState, adapter_for
from fleetctl.traffic.models import Drain, Gateway, GatewayPush
from fleetctl.traffic.push_attempts import OPEN, RETRY_DELAYS_S, _push_io, _push_record, _PushIO
from fleetctl.traffic.push_drains import DRAINS_OPEN as DRAINS_OPEN  # where callers look
from fleetctl.traffic.push_drains import drain_progress, drains_advance

log = logging.getLogger("fleetctl.traffic")


class InTransactionError(RuntimeError):
    """Gateway I/O was asked for inside an open transaction."""


def refuse_in_transaction(what: str) -> None:
    """Fail loudly when called inside an atomic block: the rows this pushes were written by
    the caller's transaction, which must have committed (other processes retry from them),
    and gateway I/O must not hold a transaction open. The atomic blocks a test case wraps
    every test in do not count (Django's durable atomic blocks make the same exception)."""
    if any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks):
        raise InTransactionError(
            f"{what} talks to gateways: call it after the transaction that stored the pushes "
            f"has committed, not inside it.")


# --- pushing ---------------------------------------------------------------------------------

# A push stored but not attempted this long after its commit lost the process that was to
# make its first attempt (a web process killed right after a drain committed): the converge
# task attempts it. An inline first attempt still in flight this late (a hung gateway) may be
# doubled by that — harmless: a push is idempotent, it sets the gateway's whole state.
ORPHAN_PUSH_AFTER_S = 3.0
# A retrying push whose retry is this late was lost (countdown messages can die with their
# worker): the converge task drives it again.
RETRY_LOST_AFTER_S = 3.0


@dataclass
class Settled:
    """What the attempts recorded by one call settled: push id → (status, verified at), and
    the pushes read (their statuses as those attempts left them)."""

    statuses: dict[int, tuple[str, Any]]
    pushes: list[GatewayPush]


def push_fanout(*, push_ids: list[int], budget_s: float | None = None) -> Settled:
    """First attempt of several pushes at once: one thread per gateway does the talking (the
    work is waiting on gateways), then every outcome is recorded together in a few queries
    and each failure is queued to retry on its own with backoff (push_run). Gateways
    carrying the same routes share one desired state.

    With `budget_s`, only the attempts that finish within it are recorded here; a slower
    gateway's attempt records itself from its thread when it ends and queues its own retry,
    so a caller waiting on this is never held by one slow gateway for longer than the
    budget. Returns what the attempts recorded here settled."""
    # Every open push of these gateways in one read, made before the desired states (see
    # _open_pushes_now): the ones to attempt, and what a verified attempt may settle.
    open_now = list(GatewayPush.objects.select_related("gateway", "revision__route")
                    .prefetch_related("gateway__routes").filter(
                        status__in=OPEN, gateway_id__in=GatewayPush.objects.filter(
                            pk__in=push_ids).values("gateway_id")))
    known: dict[int, frozenset[int]] = {}
    for each in open_now:
        known[each.live_gateway_id] = known.get(each.live_gateway_id, frozenset()) | {each.pk}
    # One attempt per gateway (it sends the whole state; its verification settles the
    # gateway's other open pushes): two at once would race on the gateway's configuration.
    wanted = set(push_ids)
    first: dict[int, GatewayPush] = {}
    for push in sorted(open_now, key=lambda p: p.pk):
        if push.pk in wanted:
            first.setdefault(push.live_gateway_id, push)
    pushes = list(first.values())
    states: dict[tuple[int, ...], DesiredState] = {}
    work = []
    for push in pushes:
        routes = tuple(sorted(route.pk for route in push.live_gateway.routes.all()))
        if routes not in states:
            states[routes] = selectors.gateway_desired_state(gateway=push.live_gateway)
        # The routes' state is shared; the collector and the mirror header are the gateway's.
        desired = selectors.desired_for_gateway(states[routes], gateway=push.live_gateway)
        work.append((push, desired, known.get(push.live_gateway_id, frozenset())))
    futures = [_push_threads().submit(_push_io, *item) for item in work]
    finished, late = wait_futures(futures, timeout=budget_s)
    caller = threading.get_ident()
    for future in late:
        # Runs in the push thread when the attempt ends — or here at once if it ended in
        # the meantime, and then this thread's connection must be left alone.
        future.add_done_callback(
            lambda done: _record_late(done, own_thread=threading.get_ident() != caller))
    outcomes = [future.result() for future in futures if future in finished]
    settled: dict[int, tuple[str, Any]] = {}
    for io, (status, retry_in) in zip(outcomes, _push_record(outcomes, settled=settled),
                                      strict=True):
        if retry_in is not None:
            _retry_later(io.push.pk, retry_in, attempts=io.push.attempts + 1)
        if io.push.pk not in settled:  # failed: retrying, or failed for good
            settled[io.push.pk] = (status, None)
    _as_left(open_now, outcomes, settled)
    return Settled(statuses=settled, pushes=open_now)


def _as_left(pushes: list[GatewayPush], outcomes: list[_PushIO],
             settled: dict[int, tuple[str, Any]]) -> None:
    """Set `pushes` (read before the attempts) to the rows as these attempts left them, for
    the caller's answer, without reading them again."""
    by_gateway = {io.push.live_gateway_id: io for io in outcomes}
    for push in pushes:
        attempt = by_gateway.get(push.live_gateway_id)
        if attempt is not None and attempt.push.pk == push.pk:
            push.attempts, push.last_error = push.attempts + 1, attempt.error
        if push.pk in settled:
            push.status, verified_at = settled[push.pk]
            if push.status == GatewayPush.Status.VERIFIED and attempt is not None:
                push.applied_at, push.verified_at = attempt.answered, verified_at
                push.last_error = ""


def _open_pushes_now(gateway_ids: Any) -> dict[int, frozenset[int]]:
    """Per gateway, its open pushes as committed right now. Read *before* the desired state:
    whatever these pushes stand for (a revision, a registry edit) committed with them, so
    the desired state read next includes it, and a verified attempt may settle exactly these.
    A push committed later may stand for a change the attempt never saw: it keeps its own."""
    known: dict[int, set[int]] = {}
    for pk, gateway_id in GatewayPush.objects.filter(
            gateway_id__in=gateway_ids, status__in=OPEN).values_list("pk", "gateway_id"):
        known.setdefault(gateway_id, set()).add(pk)
    return {gateway_id: frozenset(pks) for gateway_id, pks in known.items()}


def push_inline(*, push_ids: list[int]) -> Settled | None:
    """First attempt of pushes just committed, made by the calling process (a drain: no queue
    hop), waiting at most TRAFFIC_INLINE_PUSH_BUDGET_S; failures retry on the `push` queue.
    Refuses to run inside a transaction. Returns what the attempts settled (None when
    something went wrong: the rows then say what happened)."""
    refuse_in_transaction("push_inline")
    if not push_ids:
        return Settled(statuses={}, pushes=[])
    try:
        return push_fanout(push_ids=push_ids, budget_s=settings.TRAFFIC_INLINE_PUSH_BUDGET_S)
    except Exception:  # the pushes are stored: converge attempts those nobody attempted
        log.exception("inline push of %s failed; the converge task will retry", push_ids)
        return None


def drain_push_now(drain: Drain) -> Drain:
    """The first push of a drain or restore that `services` just stored and committed, made
    here and now (it is what the drain's figures time), then the record notes whether every
    gateway verified, so the caller's answer says so, and the watcher takes over (in-flight
    streams to the drained pools). Should this process die before any of it, nothing is
    lost: the converge task attempts the pushes and advances the drain from the rows.
    Refuses to run inside a transaction.

    Returns the drain as those attempts left it, with its pushes (`first_pushes`) as they
    were recorded, so an answer needs no second read."""
    refuse_in_transaction("drain_push_now")
    from fleetctl.traffic.tasks import drain_watch

    push_ids = drain.push_ids
    if push_ids is None:
        push_ids = list(GatewayPush.objects.filter(revision__drains=drain, status__in=OPEN)
                        .values_list("pk", flat=True))
    try:
        settled = push_inline(push_ids=push_ids)
        if settled is None or not _verified_now(drain, push_ids, settled):
            drain_progress(drain_id=drain.pk, look_in_flight=False)
            drain.refresh_from_db(fields=["status", "verified_at", "last_error",
                                          "failure_reason"])
        mine = [p for p in (settled.pushes if settled else []) if p.pk in set(push_ids)]
        if len(mine) == len(push_ids):  # else one was settled elsewhere: the answer reads rows
            drain.first_pushes = sorted(
                mine, key=lambda p: (p.gateway_label, p.revision.route.name, p.pk))
    finally:
        # Queued from a push thread, so the answer does not wait for the broker (~3 ms);
        # should this process die first, the converge task advances the drain from its rows.
        _push_threads().submit(drain_watch.delay, drain.pk)
    return drain


def _verified_now(drain: Drain, push_ids: list[int], settled: Settled) -> bool:
    """When the attempts just made settled every push of the drain, note its verified time
    (the last gateway's read-back) from what is in hand: one write, no read. False when
    some push is still open or failed: drain_progress reads the rows then."""
    done = (GatewayPush.Status.VERIFIED, GatewayPush.Status.SUPERSEDED)
    outcome = [settled.statuses.get(pk) for pk in push_ids]
    if not all(o is not None and o[0] in done for o in outcome):
        return False
    times = [o[1] for o in outcome if o is not None and o[1] is not None]
    verified_at = max(times) if times else timezone.now()
    if Drain.objects.filter(pk=drain.pk, verified_at__isnull=True,
                            status__in=(Drain.Status.PUSHING, Drain.Status.PARTIAL)).update(
            verified_at=verified_at, status=Drain.Status.VERIFIED, last_error=""):
        drain.verified_at, drain.status, drain.last_error = (
            verified_at, Drain.Status.VERIFIED, "")
        return True
    return False  # someone looked first (the watcher, converge): read what they wrote


def _retry_later(push_id: int, retry_in: float, *, attempts: int) -> None:
    """Queue the next attempt. `attempts`: how many the push has had by then; if another
    attempt is made meanwhile (converge drove it again), this retry stands down."""
    from fleetctl.traffic.tasks import push_run

    push_run.apply_async((push_id, attempts), countdown=retry_in)


def _record_late(future: Future[_PushIO], *, own_thread: bool) -> None:
    """Done-callback of an attempt that outlived its caller's budget. In a push thread
    (`own_thread`) it records with that thread's own connection and closes it after."""
    from django.db import connections

    try:
        io = future.result()
        _status, retry_in = _push_record([io])[0]
        if retry_in is not None:
            _retry_later(io.push.pk, retry_in, attempts=io.push.attempts + 1)
    except Exception:
        log.exception("recording a late push attempt failed; the converge task will retry")
    finally:
        if own_thread:
            connections.close_all()


DONE = (GatewayPush.Status.VERIFIED, GatewayPush.Status.SUPERSEDED, GatewayPush.Status.FAILED,
        GatewayPush.Status.ABANDONED)
_pool: Any = None


def _push_threads() -> Any:
    """Threads kept for the process's life: a drain is timed in milliseconds."""
    global _pool
    if _pool is None:
        import sys
        from concurrent.futures import ThreadPoolExecutor

        # Ten pushes at once each need the interpreter lock for a moment between admin calls;
        # at Python's default 5 ms hand-over they queue behind whichever thread holds it. A
        # process-wide setting, made by the processes that push (TRAFFIC_THREAD_SWITCH_INTERVAL_S):
        # 10-Envoy drains verified 14 ms sooner at 0.5 ms.
        sys.setswitchinterval(settings.TRAFFIC_THREAD_SWITCH_INTERVAL_S)
        _pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="push")
    return _pool


def push_execute(*, push_id: int, attempts: int | None = None) -> str:
    """One attempt at making a gateway hold its whole desired state (the push_run task);
    queues its own retry. Returns the push's status.

    It stands down — no attempt, no retry — when the push is done, when `attempts` (what the
    push had when this attempt was queued) no longer matches (someone attempted it since and
    their retry carries on), or when a newer push to the same gateway is open: that one
    sends the same whole state, and its verification settles this one. So however many
    pushes pile up while a gateway is down, one is retried."""
    push = (GatewayPush.objects.select_related("gateway", "revision__route")
            .filter(pk=push_id).first())
    if push is None:  # its route was deleted meanwhile
        return "gone"
    if push.gateway is None:  # its gateway was deleted meanwhile: the push was abandoned
        return push.status
    if push.status in DONE or (attempts is not None and push.attempts != attempts):
        return push.status
    known = _open_pushes_now([push.live_gateway_id]).get(push.live_gateway_id, frozenset())
    if any(pk > push.pk for pk in known):
        return push.status
    desired = selectors.gateway_desired_state(gateway=push.live_gateway)
    status, retry_in = _push_record([_push_io(push, desired, known)])[0]
    if retry_in is not None:
        _retry_later(push.pk, retry_in, attempts=push.attempts + 1)
    elif status == GatewayPush.Status.VERIFIED:
        drains_advance()  # the gateway may be back: drains waiting on it complete now
    return status


# --- converge and reconcile (beat) ---------------------------------------------------------

def gateway_reconcile(*, gateway: Gateway) -> bool:
    """Compare what the gateway holds with what it should; re-push on drift (e.g. an Envoy
    restarted empty). Returns True when a push was queued. A gateway with an open push is
    left to it: that push sends the whole state and brings the gateway in line, and
    pushes_converge keeps it going even if its own retry was lost."""
    if GatewayPush.objects.filter(gateway=gateway, status__in=OPEN).exists():
        return False
    desired = selectors.gateway_desired_state(gateway=gateway)
    try:
        adapter = adapter_for(selectors.gateway_spec(gateway))
        if adapter.matches(desired, adapter.read_back()) and adapter.mirror_matches(desired)[0]:
            return False
    except AdapterError as exc:
        Gateway.objects.filter(pk=gateway.pk).update(state=Gateway.State.FAILING,
                                                      last_error=mirror_auth.redact(str(exc)))
    revisions = [r for r in (selectors.revision_current(route=route)
                             for route in gateway.routes.all()) if r is not None]
    if not revisions:
        return False
    refuse_in_transaction("gateway_reconcile")
    push = GatewayPush.objects.create(revision=revisions[0], gateway=gateway, reason="reconcile")
    _retry_later(push.pk, 0, attempts=0)
    log.warning("gateway %s drifted from its desired state; re-pushing", gateway.name)
    return True


def pushes_converge() -> int:
    """From the rows alone: drive again the newest open push of every gateway whose
    attempt is overdue — never attempted ORPHAN_PUSH_AFTER_S after it was stored, or its
    retry later than its backoff plus RETRY_LOST_AFTER_S (the message died with a worker).
    Older open pushes need nothing: the newest sends the same whole state and settles them.
    Returns how many were driven; the converge task calls this every few seconds."""
    newest: dict[int, GatewayPush] = {}
    for push in (GatewayPush.objects.filter(status__in=OPEN).select_related("gateway")
                 .annotate(last_attempt_at=Max("attempt_rows__answered_at")).order_by("-pk")):
        newest.setdefault(push.live_gateway_id, push)
    now = timezone.now()
    overdue = [push for push in newest.values() if _overdue(push, now)]
    for late in overdue:
        log.warning("push %s to %s is overdue (%s attempt(s), none queued); driving it again",
                    late.pk, late.live_gateway.name, late.attempts)
        _retry_later(late.pk, 0, attempts=late.attempts)
    return len(overdue)


def _overdue(push: GatewayPush, now: Any) -> bool:
    if push.attempts == 0:
        return now - push.created_at > timedelta(seconds=ORPHAN_PUSH_AFTER_S)
    backoff = RETRY_DELAYS_S[min(push.attempts - 1, len(RETRY_DELAYS_S) - 1)]
    last = push.last_attempt_at or push.created_at  # type: ignore[attr-defined]
    return now - last > timedelta(seconds=backoff + RETRY_LOST_AFTER_S)
