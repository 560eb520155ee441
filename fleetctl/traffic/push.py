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

Every entry point that may run in a request refuses to run inside a transaction
(`refuse_in_transaction`): gateway I/O must never sit inside someone's open transaction, nor
move silently to its commit.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Case, DateTimeField, F, Max, PositiveIntegerField, Value, When
from django.utils import timezone

from fleetctl.traffic import mirror_auth, selectors
from fleetctl.traffic.gateways.base import AdapterError, ApplyResult, DesiredState, adapter_for
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, GatewayPushAttempt

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

# Every push sends the gateway its whole desired state, so a gateway that is down needs only
# one push retried (its newest open one) and the retry is the probe: cheap (a refused
# connection) and capped low, so a gateway that answers again is sent the current state
# within seconds, which settles every older open push to it (_gateways_in_sync).
RETRY_DELAYS_S = (0.2, 0.5, 1, 2, 5)
# A push stored but not attempted this long after its commit lost the process that was to
# make its first attempt (a web process killed right after a drain committed): the converge
# task attempts it. An inline first attempt still in flight this late (a hung gateway) may be
# doubled by that — harmless: a push is idempotent, it sets the gateway's whole state.
ORPHAN_PUSH_AFTER_S = 3.0
# A retrying push whose retry is this late was lost (countdown messages can die with their
# worker): the converge task drives it again.
RETRY_LOST_AFTER_S = 3.0
OPEN = (GatewayPush.Status.PENDING, GatewayPush.Status.RETRYING)


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
    by_gateway = {io.push.live_gateway_id: io for io in outcomes}
    for push in open_now:  # the rows as these attempts left them, for the caller's answer
        attempt = by_gateway.get(push.live_gateway_id)
        if attempt is not None and attempt.push.pk == push.pk:
            push.attempts, push.last_error = push.attempts + 1, attempt.error
        if push.pk in settled:
            push.status, verified_at = settled[push.pk]
            if push.status == GatewayPush.Status.VERIFIED and attempt is not None:
                push.applied_at, push.verified_at = attempt.answered, verified_at
                push.last_error = ""
    return Settled(statuses=settled, pushes=open_now)


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


@dataclass
class _PushIO:
    """What one attempt found out from the gateway; recorded afterwards."""

    push: GatewayPush
    desired: DesiredState
    known: frozenset[int]
    sent: Any
    started: float
    answered: Any = None
    verified_at: Any = None
    result: ApplyResult | None = None
    verified: bool = False
    error: str = ""
    permanent: bool = False
    duration_ms: float = 0.0


def _push_io(push: GatewayPush, desired: DesiredState, known: frozenset[int]) -> _PushIO:
    """Apply and read back; no database work here (it runs in a thread per gateway).
    `known`: the gateway's open pushes read before `desired` (_open_pushes_now)."""
    io = _PushIO(push=push, desired=desired, known=known, sent=timezone.now(),
                 started=time.monotonic())
    try:
        adapter = adapter_for(selectors.gateway_spec(push.live_gateway))
        io.result = adapter.apply(desired)
        io.answered = timezone.now()
        held = adapter.read_back()
        io.verified = adapter.matches(desired, held)
        if io.verified:
            # The mirror fraction (shadow runs) is held too, or this kind says it cannot tell.
            io.verified, mirror_note = adapter.mirror_matches(desired)
            if not io.verified:
                io.error = mirror_note
            elif mirror_note and io.result is not None:
                io.result.detail = "; ".join(t for t in (io.result.detail, mirror_note) if t)
        io.verified_at = timezone.now()
        if not io.verified and not io.error:
            io.error = f"read back {held} differs from what was applied"
    except AdapterError as exc:
        io.error, io.permanent = str(exc), exc.permanent
        io.answered = io.answered or timezone.now()
    io.duration_ms = (time.monotonic() - io.started) * 1000
    # What a gateway says may quote its config, which holds the mirror tokens.
    io.error = mirror_auth.redact(io.error)
    if io.result is not None:
        io.result.detail = mirror_auth.redact(io.result.detail)
    return io


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


def _push_record(outcomes: list[_PushIO], *, settled: dict[int, tuple[str, Any]] | None = None
                 ) -> list[tuple[str, float | None]]:
    """Attempt rows in one insert, then the pushes a verified attempt settles and its gateway
    in one update each; failures one by one (they are rare and each has its own retry).
    `settled` collects push id → (status, verified at) of every push settled here."""
    if not outcomes:
        return []
    GatewayPushAttempt.objects.bulk_create([
        GatewayPushAttempt(
            push=io.push, number=io.push.attempts + 1, sent_at=io.sent,
            answered_at=io.answered, applied=bool(io.result and io.result.applied),
            verified=io.verified, method=io.result.method if io.result else "",
            detail=io.result.detail if io.result else "", error=io.error,
            duration_ms=io.duration_ms)
        for io in outcomes
    ])
    _gateways_in_sync([io for io in outcomes if io.verified],
                      settled if settled is not None else {})
    return [(GatewayPush.Status.VERIFIED, None) if io.verified
            else _push_failed(io.push, io.push.attempts + 1, io.error, io.permanent)
            for io in outcomes]


def _push_failed(push: GatewayPush, attempts: int, error: str,
                 permanent: bool) -> tuple[str, float | None]:
    retry = None if permanent else RETRY_DELAYS_S[min(attempts - 1, len(RETRY_DELAYS_S) - 1)]
    status = GatewayPush.Status.FAILED if permanent else GatewayPush.Status.RETRYING
    # A push abandoned meanwhile (its gateway deleted) stays abandoned: it counts the attempt.
    GatewayPush.objects.filter(pk=push.pk).exclude(status=GatewayPush.Status.ABANDONED).update(
        status=status, last_error=error, attempts=F("attempts") + 1)
    gateway = push.live_gateway
    if gateway.state != Gateway.State.FAILING:
        log.error("gateway %s cannot be updated: %s", gateway.name, error)
    # Conditional, so of two attempts failing at once only one reports the flip.
    flipped = Gateway.objects.filter(pk=gateway.pk).exclude(
        state=Gateway.State.FAILING).update(state=Gateway.State.FAILING, last_error=error,
                                            state_changed_at=timezone.now())
    if flipped:
        _gateway_notify(gateway.name, failing=True, error=error)
    else:
        Gateway.objects.filter(pk=gateway.pk).update(last_error=error)
    return status, retry


def _gateway_notify(name: str, *, failing: bool, error: str = "") -> None:
    from fleetctl.webhooks.services import notify

    state = Gateway.State.FAILING if failing else Gateway.State.IN_SYNC
    notify("gateway.failing", {"gateway": name, "state": str(state), "error": error,
                               "url": f"/api/v1/gateways/{name}/"},
           text=(f"fleetctl gateway {name} is failing: {error}" if failing
                 else f"fleetctl gateway {name} is in sync again"))


def _gateways_in_sync(outcomes: list[_PushIO], settled: dict[int, tuple[str, Any]]) -> None:
    """Each gateway holds exactly the revisions it was sent: its open pushes of those
    revisions are verified, open pushes of older ones (or of routes it no longer carries)
    superseded. Only pushes that were committed before the attempt read its desired state
    are settled: one made meanwhile (a newer revision, a registry edit the attempt never saw)
    stays open for its own attempt. The attempted pushes count their attempt. Fills
    `settled` with push id → (status, verified at)."""
    if not outcomes:
        return
    now = timezone.now()
    by_gateway = {io.push.live_gateway_id: io for io in outcomes}
    attempted = [io.push.pk for io in outcomes]
    open_pushes = GatewayPush.objects.filter(
        gateway_id__in=by_gateway,
        status__in=[GatewayPush.Status.PENDING, GatewayPush.Status.RETRYING],
    ).select_related("revision__route")
    verified: dict[int, _PushIO] = {}
    superseded = []
    for push in open_pushes:
        io = by_gateway[push.live_gateway_id]
        if push.pk not in io.known and push.pk != io.push.pk:
            continue  # committed after this attempt read its state: it may hold more
        held = {spec.key: spec.revision for spec in io.desired.routes}
        number = held.get(push.revision.route.name)
        if number == push.revision.number:
            verified[push.pk] = io
        elif number is None or push.revision.number < number:
            superseded.append(push.pk)
    counted = Case(When(pk__in=attempted, then=F("attempts") + 1), default=F("attempts"),
                   output_field=PositiveIntegerField())
    if verified:
        _settle_verified(verified, attempted)
        settled.update({pk: (GatewayPush.Status.VERIFIED, io.verified_at)
                        for pk, io in verified.items()})
    if superseded:
        GatewayPush.objects.filter(pk__in=superseded, status__in=OPEN).update(
            status=GatewayPush.Status.SUPERSEDED, attempts=counted)
        settled.update({pk: (GatewayPush.Status.SUPERSEDED, None) for pk in superseded})
    uncounted = [pk for pk in attempted if pk not in verified and pk not in superseded]
    if uncounted:  # settled by another attempt meanwhile: it still had this one
        GatewayPush.objects.filter(pk__in=uncounted).update(attempts=F("attempts") + 1)
    recovered = list(Gateway.objects.filter(pk__in=by_gateway, state=Gateway.State.FAILING)
                     .values_list("name", flat=True))
    Gateway.objects.filter(pk__in=by_gateway).update(
        state=Gateway.State.IN_SYNC, last_error="", last_verified_at=now,
        state_changed_at=Case(When(state=Gateway.State.IN_SYNC, then=F("state_changed_at")),
                              default=Value(now), output_field=DateTimeField()))
    for name in recovered:
        _gateway_notify(name, failing=False)
    # In sync with all it can hold; what it had to leave out (a pool it cannot route to)
    # stays in view until a push holds everything again.
    for gateway_id, io in by_gateway.items():
        if io.result is not None and io.result.warning:
            log.warning("gateway %s: %s", io.push.live_gateway.name, io.result.warning)
            Gateway.objects.filter(pk=gateway_id).update(
                last_error=f"warning: {io.result.warning}")


def _settle_verified(verified: dict[int, _PushIO], attempted: list[int]) -> None:
    """One statement for every push settled verified, each applied and verified when its
    gateway's attempt was; `status IN (open)` keeps a push another attempt settled meanwhile.
    Written as SQL: the ORM builds this CASE from one expression per push, and resolving
    those took ~20 ms of every drain's answer (benchmarks/drain_latency.py)."""
    ops, quote = connection.ops, connection.ops.quote_name
    column = quote  # these fields' columns carry their names

    pks = list(verified)
    marks = ", ".join(["%s"] * len(pks))
    cases = {"applied_at": [], "verified_at": []}  # type: dict[str, list[Any]]
    for pk, io in verified.items():
        cases["applied_at"] += [pk, ops.adapt_datetimefield_value(io.answered)]
        cases["verified_at"] += [pk, ops.adapt_datetimefield_value(io.verified_at)]
    when = " ".join(["WHEN %s THEN %s"] * len(pks))
    counted = [pk for pk in attempted if pk in verified]
    attempts = column("attempts")
    bump = (f"CASE WHEN {quote('id')} IN ({', '.join(['%s'] * len(counted))}) "
            f"THEN 1 ELSE 0 END" if counted else "0")
    sql = (f"UPDATE {quote(GatewayPush._meta.db_table)} SET {column('status')} = %s, "
           f"{column('last_error')} = %s, "
           f"{column('applied_at')} = CASE {quote('id')} {when} END, "
           f"{column('verified_at')} = CASE {quote('id')} {when} END, "
           f"{attempts} = {attempts} + {bump} "
           f"WHERE {quote('id')} IN ({marks}) AND {column('status')} IN (%s, %s)")
    params = [GatewayPush.Status.VERIFIED.value, "", *cases["applied_at"],
              *cases["verified_at"], *counted, *pks, *(status.value for status in OPEN)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


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


# --- drains ----------------------------------------------------------------------------------

DRAINS_OPEN = (Drain.Status.PUSHING, Drain.Status.VERIFIED, Drain.Status.PARTIAL)


def drain_progress(*, drain_id: int, look_in_flight: bool = True) -> bool:
    """One look at a drain: all pushes verified? in-flight to drained pools zero? Updates
    the record and returns True when there is nothing more to wait for. Without
    `look_in_flight` it stops after noting the verified time (no gateway is asked).

    A drain gives up — status `failed`, the reason stored, never left `partial` or
    `verified` — when a gateway refused one of its pushes for good (a permanent adapter
    error: nothing retries it), when it is still not verified on every gateway
    DRAIN_WATCH_TIMEOUT_S after it was requested, or when the drained pools' in-flight
    requests have not reached zero by then (or could not be read). Retrying pushes carry on
    after that (a gateway that answers again still gets the current state); the record says
    the drain did not do what it was asked in time."""
    drain = Drain.objects.filter(pk=drain_id).first()
    if drain is None or drain.status in (Drain.Status.COMPLETE, Drain.Status.FAILED):
        return True
    pushes = list(GatewayPush.objects.select_related("gateway", "revision__route")
                  .filter(revision__in=drain.revisions.all()))
    now = timezone.now()
    failing = [p for p in pushes if p.status in (GatewayPush.Status.RETRYING,
                                                 GatewayPush.Status.FAILED)]
    # A push whose gateway was deleted before it verified waits no more: the drain finishes
    # for the remaining gateways, and its record keeps saying which one never verified.
    done = [p for p in pushes if p.status in (GatewayPush.Status.VERIFIED,
                                              GatewayPush.Status.SUPERSEDED,
                                              GatewayPush.Status.ABANDONED)]
    if len(done) < len(pushes):
        error = "; ".join(f"{p.gateway_label}: {p.last_error}" for p in failing)
        reason = _given_up(drain, pushes, now)
        if reason:
            log.error("%s %s failed: %s", drain.action, drain.pk, reason)
            Drain.objects.filter(pk=drain.pk).update(
                status=Drain.Status.FAILED, failure_reason=reason, last_error=error)
            return True
        status = Drain.Status.PARTIAL if failing else Drain.Status.PUSHING
        if (drain.status, drain.last_error) != (status, error):  # the watcher polls: no idle writes
            Drain.objects.filter(pk=drain.pk).update(status=status, last_error=error)
        return False
    if drain.verified_at is None:
        # The last gateway's read-back — or the moment a gateway it waited on was deleted:
        # the drain was not done with its gateways before that.
        verified_times = [p.verified_at for p in pushes if p.verified_at] + [
            p.gateway_deleted_at for p in pushes
            if p.status == GatewayPush.Status.ABANDONED and p.gateway_deleted_at] or [now]
        drain.verified_at = max(verified_times)
        Drain.objects.filter(pk=drain.pk).update(verified_at=drain.verified_at,
                                                 status=Drain.Status.VERIFIED, last_error="")
    if not look_in_flight:
        return False
    if drain.in_flight_zero_at is None and not _in_flight_zero(drain):
        reason = _in_flight_given_up(drain, now)
        if reason:
            log.error("%s %s failed: %s", drain.action, drain.pk, reason)
            Drain.objects.filter(pk=drain.pk).update(status=Drain.Status.FAILED,
                                                     failure_reason=reason)
            return True
        return False
    zero_at = drain.in_flight_zero_at or now
    Drain.objects.filter(pk=drain.pk).update(
        in_flight_zero_at=zero_at, completed_at=max(zero_at, drain.verified_at),
        status=Drain.Status.COMPLETE,
    )
    return True


def _given_up(drain: Drain, pushes: list[GatewayPush], now: Any) -> str:
    """Why a drain not yet verified everywhere will not be: a push refused for good, or the
    watch timeout passed. Empty while there is still reason to wait."""
    refused = [p for p in pushes if p.status == GatewayPush.Status.FAILED]
    if refused:
        return "; ".join(f"gateway {p.gateway_label} refused {p.revision.route.name} "
                         f"r{p.revision.number} for good: {p.last_error}" for p in refused)
    timeout_s = settings.DRAIN_WATCH_TIMEOUT_S
    if not _past_deadline(drain, now):
        return ""
    waiting = sorted({p.gateway_label for p in pushes
                      if p.status not in (GatewayPush.Status.VERIFIED,
                                          GatewayPush.Status.SUPERSEDED,
                                          GatewayPush.Status.ABANDONED)})
    return (f"not verified on {', '.join(waiting)} within {timeout_s:g} s "
            f"(DRAIN_WATCH_TIMEOUT_S); their pushes keep retrying")


def _past_deadline(drain: Drain, now: Any) -> bool:
    return now - drain.requested_at > timedelta(seconds=settings.DRAIN_WATCH_TIMEOUT_S)


def _in_flight_given_up(drain: Drain, now: Any) -> str:
    """Why a drain verified everywhere stops waiting for in-flight requests: the watch
    timeout passed. Empty while there is still reason to wait."""
    if not _past_deadline(drain, now):
        return ""
    return (f"verified on every gateway, but in-flight requests to "
            f"{', '.join(drain.drained_pools)} did not reach zero (or could not be read) "
            f"within {settings.DRAIN_WATCH_TIMEOUT_S:g} s (DRAIN_WATCH_TIMEOUT_S)")


def _in_flight_zero(drain: Drain) -> bool:
    """In-flight requests to each drained pool, summed over the gateways that carried it.
    A pool that still has weight on some other route of a gateway cannot be told apart per
    route, so that gateway is not waited for (its cluster counts both routes)."""
    if drain.action == Drain.Action.RESTORE or not drain.drained_pools:
        return True
    for gateway in Gateway.objects.filter(routes__in=[r.route_id for r in
                                                      drain.revisions.all()]).distinct():
        desired = selectors.gateway_desired_state(gateway=gateway)
        adapter = adapter_for(selectors.gateway_spec(gateway))
        for pool in drain.drained_pools:
            if any(r.weights.get(pool) for r in desired.routes):
                continue
            try:
                count = adapter.in_flight(pool)
            except AdapterError:
                return False
            if count > 0:
                return False
    return True


def _give_up_unfollowable(drain_id: int, exc: Exception) -> bool:
    """A drain whose progress cannot even be looked at (every look raises) is not left open
    for ever: past the watch timeout it is failed, with what went wrong."""
    now = timezone.now()
    reason = (f"its progress could not be followed within {settings.DRAIN_WATCH_TIMEOUT_S:g} "
              f"s (DRAIN_WATCH_TIMEOUT_S): {type(exc).__name__}: {exc}")
    return bool(Drain.objects.filter(
        pk=drain_id, status__in=DRAINS_OPEN,
        requested_at__lt=now - timedelta(seconds=settings.DRAIN_WATCH_TIMEOUT_S)).update(
            status=Drain.Status.FAILED, failure_reason=reason))


def drains_advance() -> int:
    """One look at every open drain and restore (drain_progress), whoever made it and
    whatever process died since: the converge task runs this every few seconds, and a push
    that verifies runs it at once. Returns how many are settled now (complete or failed)."""
    complete = 0
    for pk in Drain.objects.filter(status__in=DRAINS_OPEN).values_list("pk", flat=True):
        try:
            complete += drain_progress(drain_id=pk)
        except Exception as exc:  # one drain's trouble must not keep the others waiting
            log.exception("drain %s: could not look at its progress", pk)
            complete += _give_up_unfollowable(pk, exc)
    return complete
