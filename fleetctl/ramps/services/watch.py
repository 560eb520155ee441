"""The standing live watch: when a ramp completes, the guard does not stop. Every pool carrying
weight on the route gets a `Watch` (`watches_hand_over`, in the completing transaction), and
`watch_tick` (beat, `ramps.watch_tick` on the `watch` queue) judges each active watch on its
newest whole telemetry window through the ramp guard's own judgement
(`selectors.pool_judgement` → `guard.judge`) and counts failing windows with the guard's own
rule (`guard.failures_after`): `failure_threshold` failing windows in a row (never one noisy
window; insufficient data never counts) drain the pool off the route by policy `drain`
(`system:live-watch`, through traffic's drain service and a real push), or alert by policy
`alert` (webhook `watch.failed`, audit; the watch carries on). Each judged window is a
`WatchVerdict` row: the history stage 4's `watch.held` rule measures.

Windows are judged back to back, aligned on the epoch: a window of `window_s` (rounded up to
whole telemetry windows) ending at the newest boundary that is at least one telemetry window
in the past (the ingester has flushed it). A tick that comes late judges only the newest
window: the windows it missed stay unjudged, and the history shows the gap (time is read
from the rows, never assumed). A watch is claimed by a lease (conditional UPDATE) as ramps
are, so two ticks never judge one window twice (and a unique row per window says so too).

A person with the ramp role may change a watch's policy or end it (`watch_set_policy`,
`watch_end`); a watch whose pool no longer carries weight on the route ends by itself."""

from __future__ import annotations

import math
import os
import socket
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError, required_reason
from fleetctl.ramps import guard
from fleetctl.ramps.models import Ramp, Watch, WatchVerdict
from fleetctl.ramps.services._shared import log, thresholds_of
from fleetctl.traffic.models import Drain, Route

SYSTEM = "live-watch"
HAND_OVER = "ramp-guard"
LEASE_S = 60.0
_VERDICTS = {guard.PASS: WatchVerdict.Verdict.PASS, guard.WARN: WatchVerdict.Verdict.WARN,
             guard.FAIL: WatchVerdict.Verdict.FAIL, guard.WAIT: WatchVerdict.Verdict.INSUFFICIENT}


# --- hand-over --------------------------------------------------------------------------------

def _carrying(route: Route) -> dict[str, float]:
    """Pools with weight on the route's current split, in percent."""
    from fleetctl.traffic.selectors import revision_current

    revision = revision_current(route=route)
    if revision is None:
        return {}
    return {pool: bp / 100 for pool, bp in (revision.weights or {}).items() if bp > 0}


def watches_hand_over(ramp: Ramp, route: Route, *, now: datetime) -> list[Watch]:
    """A watch of every pool carrying weight on `route` (in the caller's transaction, the
    ramp's completion): the ramped pool against the ramp's SLO and the primary, by policy
    `drain` (the ramp guard's own answer to a failure: a ramp has no other rollback policy);
    the primary against the same SLO only, by policy `alert` (draining the primary would move
    its traffic onto pools that took less of it: a person decides); any other pool with
    weight against the SLO and the primary, `alert`. A pool already watched on the route
    keeps its watch. Audited as `system:ramp-guard`."""
    from fleetctl.fleet.models import Pool

    actor = Actor.for_system(HAND_OVER)
    made: list[Watch] = []
    primary = route.primary_pool.name
    pools = {p.name: p for p in Pool.objects.filter(name__in=list(_carrying(route)))}
    for name in sorted(pools, key=lambda n: (n != ramp.pool.name, n != primary, n)):
        role = Watch.Role.PRIMARY if name == primary else Watch.Role.CANDIDATE
        policy = Watch.Policy.DRAIN if name == ramp.pool.name else Watch.Policy.ALERT
        if Watch.objects.filter(route=route, pool=pools[name], state=Watch.State.ACTIVE).exists():
            continue
        try:
            with transaction.atomic():
                watch = Watch.objects.create(
                    route=route, pool=pools[name], ramp=ramp, plan=ramp.plan, role=role,
                    policy=policy, slo_ttft_p95_ms=ramp.slo_ttft_p95_ms,
                    slo_tpot_p95_ms=ramp.slo_tpot_p95_ms, slo_error_rate=ramp.slo_error_rate,
                    latency_margin_pct=ramp.latency_margin_pct,
                    slo_e2e_p95_ms=ramp.slo_e2e_p95_ms, min_samples=ramp.min_samples,
                    window_s=ramp.window_s, failure_threshold=ramp.failure_threshold,
                    created_by=actor.label, started_at=now)
        except IntegrityError:  # watched meanwhile
            continue
        audit_record(actor=actor, action="watch.start", target=watch,
                     message=f"ramp {ramp.pk} complete: {name} on {route.name} is watched "
                             f"({watch.get_role_display()}), policy {policy}",
                     after={"policy": policy, "role": role, **thresholds_of(watch).as_dict()})
        made.append(watch)
    return made


# --- the tick ---------------------------------------------------------------------------------

def watch_span_s(watch: Watch) -> int:
    """A verdict's window: `window_s` rounded up to whole telemetry windows."""
    width = int(settings.TELEMETRY_WINDOW_S)
    return max(width, math.ceil(watch.window_s / width) * width)


def newest_window(watch: Watch, now: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the newest window a tick at `now` judges: whole, and at least one
    telemetry window old (flushed by the ingester)."""
    from fleetctl.telemetry.services import window_start

    span = watch_span_s(watch)
    end = window_start(now.timestamp() - settings.TELEMETRY_WINDOW_S, span)
    return end - timedelta(seconds=span), end


def watch_tick(*, now: datetime | None = None, owner: str | None = None,
               only: int | None = None) -> int:
    """Judge every active watch's newest window not judged yet (or only watch `only`);
    returns how many windows this call judged. Never raises for one watch's trouble (it is
    logged; the next tick tries again)."""
    now = now or timezone.now()
    owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    due = Watch.objects.filter(free, state=Watch.State.ACTIVE)
    if only is not None:
        due = due.filter(pk=only)
    judged = 0
    for pk in list(due.order_by("pk").values_list("pk", flat=True)):
        if not Watch.objects.filter(free, pk=pk, state=Watch.State.ACTIVE).update(
                lease_owner=owner, lease_until=now + timedelta(seconds=LEASE_S)):
            continue  # another tick holds it
        try:
            watch = Watch.objects.select_related("route__primary_pool", "pool").get(pk=pk)
            judged += _judge_newest(watch, now=now)
        except Exception:  # one watch's trouble must not stop the others
            log.exception("watch %s: tick failed", pk)
        finally:
            Watch.objects.filter(pk=pk, lease_owner=owner).update(lease_owner="",
                                                                  lease_until=None)
    return judged


def _judge_newest(watch: Watch, *, now: datetime) -> int:
    from fleetctl.ramps.selectors import pool_judgement

    start, end = newest_window(watch, now)
    if end <= watch.started_at or (watch.judged_until is not None
                                   and end <= watch.judged_until):
        return 0  # nothing new, or before the hand-over
    if watch.pool.name not in _carrying(watch.route):
        _end(watch, actor=Actor.for_system(SYSTEM), now=now,
             reason=f"{watch.pool.name} carries no weight on {watch.route.name} any more")
        return 0
    primary = watch.route.primary_pool.name
    judgement = pool_judgement(pool=watch.pool.name, route=watch.route.name,
                               primary=None if primary == watch.pool.name else primary,
                               thresholds=thresholds_of(watch), min_samples=watch.min_samples,
                               since=start, until=end, now=end)
    return _record(watch, judgement, start=start, end=end, now=now)


def _figures(numbers: dict[str, Any], who: str) -> dict[str, Any]:
    stats = numbers.get(who) or {}

    def value(key: str) -> float | None:
        figure = stats.get(key) or {}
        return figure.get("value") if isinstance(figure, dict) else None

    return {"requests": stats.get("requests"), "ttft": value("ttft_p95"),
            "tpot": value("tpot_p95"), "e2e": value("duration_p95"),
            "error_rate": value("error_rate")}


def _record(watch: Watch, judgement: guard.Judgement, *, start: datetime, end: datetime,
            now: datetime) -> int:
    verdict = _VERDICTS[judgement.decision]
    mine, prim = _figures(judgement.numbers, "candidate"), _figures(judgement.numbers, "primary")
    failures = guard.failures_after(watch.consecutive_failures, judgement.decision)
    drain: Drain | None = None
    action = ""
    if verdict == WatchVerdict.Verdict.FAIL:
        action = "counted"
        if failures == watch.failure_threshold:
            action = "drained" if watch.policy == Watch.Policy.DRAIN else "alerted"
    summary = (f"{verdict}: " + " ".join(judgement.reasons))[:5000]
    if action == "counted":
        summary = (f"fail ({failures} of {watch.failure_threshold} in a row): "
                   + " ".join(judgement.reasons))[:5000]
    with transaction.atomic():
        locked = (Watch.objects.select_for_update().filter(pk=watch.pk, state=Watch.State.ACTIVE)
                  .first())
        if locked is None or (locked.judged_until is not None and end <= locked.judged_until):
            return 0
        row = WatchVerdict.objects.create(
            watch=watch, window_start=start, window_end=end, verdict=verdict,
            requests=int(mine["requests"] or 0), ttft_p95_ms=mine["ttft"],
            tpot_p95_ms=mine["tpot"], e2e_p95_ms=mine["e2e"], error_rate=mine["error_rate"],
            primary_requests=prim["requests"], primary_ttft_p95_ms=prim["ttft"],
            primary_tpot_p95_ms=prim["tpot"], primary_e2e_p95_ms=prim["e2e"],
            primary_error_rate=prim["error_rate"], summary=summary, action=action,
            numbers=judgement.numbers, at=now)
        Watch.objects.filter(pk=watch.pk).update(judged_until=end,
                                                 consecutive_failures=failures)
        watch.judged_until, watch.consecutive_failures = end, failures
        if action == "drained":
            drain = _drain_off(watch, row, now=now)
        elif action == "alerted":
            _alert(watch, row)
    if drain is not None:
        from fleetctl.traffic import push

        push.drain_push_now(drain)
    return 1


def _drain_off(watch: Watch, row: WatchVerdict, *, now: datetime) -> Drain | None:
    from fleetctl.traffic.services import drain_request

    actor = Actor.for_system(SYSTEM)
    reason = (f"live watch {watch.pk}: {watch.pool.name} failed {watch.failure_threshold} "
              f"windows in a row on {watch.route.name}")
    try:
        with transaction.atomic():
            drain: Drain | None = drain_request(actor=actor, pool=watch.pool,
                                                routes=[watch.route], reason=reason)
    except ConflictError:  # no weight left on the route
        drain = None
    why = (f"drained by policy: {row.summary}" if drain is not None else
           f"failed, nothing left to drain: {row.summary}")[:5000]
    Watch.objects.filter(pk=watch.pk).update(state=Watch.State.ENDED, ended_at=now,
                                             ended_reason=why, drain=drain)
    watch.state, watch.ended_at, watch.ended_reason, watch.drain = (Watch.State.ENDED, now, why,
                                                                    drain)
    audit_record(actor=actor, action="watch.drain", target=watch, message=why[:2000],
                 before={"state": "active"},
                 after={"state": "ended", "drain": drain.pk if drain else None})
    _notify(watch, row, drain=drain)
    return drain


def _alert(watch: Watch, row: WatchVerdict) -> None:
    actor = Actor.for_system(SYSTEM)
    audit_record(actor=actor, action="watch.alert", target=watch,
                 message=f"{watch.pool.name} on {watch.route.name}: {row.summary}"[:2000],
                 after={"verdict": row.pk, "policy": watch.policy})
    _notify(watch, row, drain=None)


def _notify(watch: Watch, row: WatchVerdict, *, drain: Drain | None) -> None:
    from fleetctl.webhooks.services import notify

    did = (f"drained (drain {drain.pk})" if drain is not None else
           "alerted (the pool keeps its weight)" if watch.policy == Watch.Policy.ALERT else
           "failed (nothing left to drain)")
    notify("watch.failed",
           {"watch": watch.pk, "route": watch.route.name, "pool": watch.pool.name,
            "policy": watch.policy, "state": watch.state, "verdict": row.verdict,
            "window_start": row.window_start.isoformat(),
            "window_end": row.window_end.isoformat(), "summary": row.summary,
            "drain": drain.pk if drain else None, "url": f"/ramps/watches/{watch.pk}/"},
           text=f"Live watch {watch.pk} ({watch.pool.name} on {watch.route.name}) {did}: "
                f"{row.summary}"[:500])


# --- a person's actions -----------------------------------------------------------------------

def _end(watch: Watch, *, actor: Actor, now: datetime, reason: str) -> Watch:
    with transaction.atomic():
        if not Watch.objects.filter(pk=watch.pk, state=Watch.State.ACTIVE).update(
                state=Watch.State.ENDED, ended_at=now, ended_reason=reason[:5000]):
            raise ConflictError(f"Watch {watch.pk} has already ended.")
        watch.state, watch.ended_at, watch.ended_reason = Watch.State.ENDED, now, reason
        audit_record(actor=actor, action="watch.end", target=watch, message=reason[:2000],
                     before={"state": "active"}, after={"state": "ended"})
    return watch


def watch_end(*, actor: Actor, watch: Watch, reason: str) -> Watch:
    """A person ends a watch (scope/role `ramp`): nothing is drained, judging stops."""
    actor.require(roles.RAMP, action="watch.end", target=watch.route)
    required_reason(reason, "Say why the watch ends (it goes in the record).")
    return _end(watch, actor=actor, now=timezone.now(), reason=f"{actor.label}: {reason}")


def watch_set_policy(*, actor: Actor, watch: Watch, policy: str, reason: str = "") -> Watch:
    """Change what a failure does: `alert` or `drain` (role `ramp`; 409 once ended)."""
    actor.require(roles.RAMP, action="watch.policy", target=watch.route)
    if policy not in Watch.Policy.values:
        raise ValidationError({"policy": [f"Unknown policy {policy!r}: one of "
                                          f"{', '.join(Watch.Policy.values)}."]})
    with transaction.atomic():
        locked = Watch.objects.select_for_update().get(pk=watch.pk)
        if locked.state != Watch.State.ACTIVE:
            raise ConflictError(f"Watch {watch.pk} has ended; its policy no longer applies.")
        before = locked.policy
        if before == policy:
            return locked
        Watch.objects.filter(pk=watch.pk).update(policy=policy)
        locked.policy = policy
        audit_record(actor=actor, action="watch.policy", target=locked,
                     message=reason or f"policy {before} → {policy}",
                     before={"policy": before}, after={"policy": policy})
    return locked
