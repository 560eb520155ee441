"""Writes for shadow runs: start, adjust and stop a run, execute one sampled request (the
`shadow.pair` task), replay a trace (`shadow.replay`), judge a run (beat `shadow.judge`) and
purge stored text past its retention (beat `shadow.purge`).

A mirror run asks traffic to have the route's gateways copy a share of its requests to the
shadow collector (route_mirror_set: traffic owns the route, and checks the pools against its
residency pin) and publishes the run in Redis (live.publish_run) so the collector knows whose
requests they are. Stopping is one action: unpublished first (the collectors stop within a
second), the mirror cleared, the run stopped. A worker that finds a pool outside the route's
pin stops the run itself: it fails closed.

Every sampled request becomes a ShadowPair: three answers (primary, secondary, candidate) and
two comparisons (noise = primary vs secondary, signal = primary vs candidate). Text is stored
only as the run's content policy allows; with content "off" no column holds any of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.db.models import Q
from django.db.models.expressions import RawSQL
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.compare import Answer, Comparison, compare, requested_form, requested_greedy
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool
from fleetctl.shadow import live, selectors, stats, triple
from fleetctl.shadow.evidence import KIND
from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun
from fleetctl.shadow.redact import redact, redact_value
from fleetctl.traffic import mirror_auth
from migrations_plan import jobs

if TYPE_CHECKING:
    from fleetctl.bench.models import Trace
    from fleetctl.traffic.models import Route
    from migrations_plan.models import Evidence, Plan

log = logging.getLogger("fleetctl.shadow")
PRODUCER = "shadow"
# Evidence is recorded when the verdict changes, else at most this often while pairs arrive.
EVIDENCE_EVERY_S = 60
ADJUSTABLE = ("sample_percent", "max_rps", "max_tokens_per_day", "content", "retention_hours",
              "min_pairs")
# A replay sends at most this many pairs at once; a sample due while all are busy is dropped
# (dropped_behind), as the collector drops when the workers fall behind.
REPLAY_CONCURRENCY = 8
# A replay looks at the run's status this often while it waits for the next arrival.
REPLAY_POLL_S = 0.5
# The run verdict's evidence verdict: "insufficient" is evidence of nothing yet.
EVIDENCE_VERDICT = {"pass": "pass", "warn": "warn", "fail": "fail", "insufficient": "info"}
# Stage 4's "Quality unchanged" kind (registered by fleetctl/evals/evidence.py): a run judged
# while its plan is live records it too.
LIVE_QUALITY_KIND = "live-quality"


def _owner(run: ShadowRun) -> str:
    return f"shadow run {run.pk}"


def _system() -> Actor:
    return Actor.for_system(PRODUCER)


# --- start ------------------------------------------------------------------------------------

def _choose_route(plan: Plan, route: Route | None) -> Route:
    routes = list(plan.routes.order_by("name"))
    if route is None:
        if len(routes) == 1:
            return routes[0]
        raise ValidationError({"route": [
            f"Plan {plan.name} has routes {', '.join(r.name for r in routes)}: name the one "
            f"to shadow." if routes else f"Plan {plan.name} has no route to shadow; add one "
                                         f"to the plan first."]})
    if route.pk not in {r.pk for r in routes}:
        raise ValidationError({"route": [
            f"Route {route.name} is not one of plan {plan.name}'s routes "
            f"({', '.join(r.name for r in routes) or 'none'})."]})
    return route


def _outside_pin(route: Route, pools: list[Pool]) -> list[str]:
    """Residency: each pool the route's pin does not allow its requests to go to."""
    return [f"Residency: pool {pool.name} is in jurisdiction {pool.region.jurisdiction}, but "
            f"route {route.name} is pinned to {route.residency}; its requests may not be sent "
            f"there." for pool in pools
            if route.residency and pool.region.jurisdiction != route.residency]


def _without_mirror(route: Route, mode: str) -> list[str]:
    """Names of the route's gateways that cannot mirror; refuses a mirror run when none can."""
    gateways = list(route.gateways.order_by("name"))
    unable = [g for g in gateways if not g.supports_mirror]
    without = [g.name for g in unable]
    if mode != ShadowRun.Mode.MIRROR:
        return without
    if not gateways:
        raise ValidationError({"route": [
            f"Route {route.name} is carried by no gateway, so no gateway can mirror it: add it "
            f"to a gateway, or start a replay run instead."]})
    if len(without) == len(gateways):
        labels = sorted({g.get_kind_display() for g in unable})
        raise ValidationError({"mode": [
            f"{' and '.join(labels)} cannot mirror; start a replay run instead (route "
            f"{route.name} is carried only by {', '.join(without)})."]})
    return without


def _check_trace(mode: str, trace: Trace | None) -> None:
    if mode == ShadowRun.Mode.MIRROR:
        if trace is not None:
            raise ValidationError({"trace": ["A mirror run copies live requests; leave the trace "
                                             "out, or start a replay run to replay it."]})
        return
    if trace is None:
        raise ValidationError({"trace": ["A replay run needs a stored trace whose requests "
                                         "carry prompt texts; name one."]})
    if not (trace.summary or {}).get("with_text_share"):
        raise ValidationError({"trace": [
            f"Trace {trace.name} carries no prompt texts (token counts only), so there is "
            f"nothing to compare answers on: replay a trace whose requests have a prompt or "
            f"messages."]})


def run_create(*, actor: Actor, plan: Plan, mode: str = "mirror", route: Route | None = None,
               trace: Trace | None = None, sample_percent: float = 10.0, max_rps: float = 2.0,
               max_tokens_per_day: int = 2_000_000, content: str = "redacted",
               retention_hours: int = 168, min_pairs: int = 200,
               confidence: float = 0.95) -> ShadowRun:
    """Start a shadow run of the plan's candidate against its primary, on the route's model
    (jobs.resolve_plan_targets, each pool inside the route's residency pin). Nothing is
    stored, mirrored or published when anything is refused."""
    actor.require(roles.JOBS, action="shadow.run.create", target=plan)
    jobs.require_open(plan, "shadow runs", optional=False)
    if mode not in ShadowRun.Mode.values:
        raise ValidationError({"mode": [f"Mode is mirror (copy live requests) or replay "
                                        f"(replay a stored trace), not {mode!r}."]})
    _check_trace(mode, trace)
    route = _choose_route(plan, route)
    candidate = Pool.objects.select_related("region").get(pk=plan.candidate_pool_id)
    primary = Pool.objects.select_related("region").get(pk=plan.primary_pool_id)
    outside = _outside_pin(route, [candidate, primary])
    if outside:
        raise ValidationError({"route": outside})
    jobs.resolve_plan_targets(plan, noun="shadow runs", candidate=candidate, primary=primary,
                              model_id=route.model_id,
                              fields={"candidate": "plan", "primary": "plan"})
    without = _without_mirror(route, mode)
    now = timezone.now()
    run = ShadowRun(plan=plan, plan_stage=plan.stage, route=route, candidate=candidate,
                    primary=primary, model_id=route.model_id, mode=mode, trace=trace,
                    sample_percent=sample_percent, max_rps=max_rps,
                    max_tokens_per_day=max_tokens_per_day, content=content,
                    retention_hours=retention_hours, min_pairs=min_pairs,
                    confidence=confidence, margin=plan.quality_margin_pct / 100,
                    gateways_without_mirror=without, created_by=actor.label,
                    started_at=now, heartbeat_at=now)
    run.full_clean(validate_constraints=False)  # one running run per plan: checked below
    try:
        with transaction.atomic():
            _refuse_busy(plan, route, mode)
            run.save()
            if mode == ShadowRun.Mode.MIRROR:
                from fleetctl.traffic.services import route_mirror_set

                route_mirror_set(actor=actor, route=route, percent=float(sample_percent),
                                 pools=[candidate, primary], owner=_owner(run))
            audit_record(actor=actor, action="shadow.run.create", target=run,
                         after=_settings_of(run) | {
                             "plan": plan.name, "route": route.name, "mode": mode,
                             "trace": trace.name if trace else None,
                             "candidate": candidate.name, "primary": primary.name,
                             "margin": run.margin, "gateways_without_mirror": without})
            transaction.on_commit(lambda: _start(run))
    except IntegrityError:
        raise ConflictError(f"Plan {plan.name} already has a running shadow run; stop it "
                            f"first.") from None
    return run


def _refuse_busy(plan: Plan, route: Route, mode: str) -> None:
    """One running run per plan; and one mirror per route (the route holds one mirror share
    and the collectors one run per route). A replay uses no mirror."""
    clash = Q(plan=plan)
    if mode == ShadowRun.Mode.MIRROR:
        clash |= Q(route=route, mode=ShadowRun.Mode.MIRROR)
    busy = (ShadowRun.objects.select_for_update()
            .filter(clash, status=ShadowRun.Status.RUNNING).first())
    if busy is not None:
        raise ConflictError(
            f"Shadow run {busy.pk} ({busy.mode} of route "
            f"{busy.route.name if busy.route else '-'}, plan {busy.plan.name}) is still "
            f"running; stop it first.")


def _settings_of(run: ShadowRun) -> dict[str, Any]:
    return {name: getattr(run, name) for name in (*ADJUSTABLE, "confidence")}


def _start(run: ShadowRun) -> None:
    if run.mode == ShadowRun.Mode.MIRROR:
        _publish(run)
    else:
        from fleetctl.shadow.tasks import replay

        replay.delay(run.pk)


def _publish(run: ShadowRun) -> None:
    """The run for its route, and which gateways may mirror the route (their tokens: the
    collector refuses other copies). The tokens first: a Redis that lost them would have
    the run's genuine copies refused."""
    assert run.route is not None
    mirror_auth.publish_quietly()
    live.publish_run(run.pk, run.route.name, max_rps=run.max_rps,
                     max_tokens_per_day=run.max_tokens_per_day)


# --- adjust and stop --------------------------------------------------------------------------

def run_adjust(*, actor: Actor, run: ShadowRun, **changes: Any) -> ShadowRun:
    """Change a running run's share, caps, content policy, retention or min_pairs. The
    collectors see new caps within a second; a new share is pushed to the gateways."""
    actor.require(roles.JOBS, action="shadow.run.adjust", target=run)
    unknown = sorted(set(changes) - set(ADJUSTABLE))
    if unknown:
        raise ValidationError({name: [f"Cannot be changed on a running run; what can: "
                                      f"{', '.join(ADJUSTABLE)}."] for name in unknown})
    if not changes:
        raise ValidationError({"changes": [f"Nothing to change; give one of "
                                           f"{', '.join(ADJUSTABLE)}."]})
    with transaction.atomic():
        locked = (ShadowRun.objects.select_for_update(of=("self",))
                  .select_related("route").get(pk=run.pk))
        if not locked.running:
            raise ConflictError(f"Shadow run {locked.pk} is {locked.status}; only a running "
                                f"run can be adjusted.")
        before = _settings_of(locked)
        for name, value in changes.items():
            setattr(locked, name, value)
        locked.full_clean()
        locked.save(update_fields=list(changes))
        if ("sample_percent" in changes and locked.mode == ShadowRun.Mode.MIRROR
                and locked.route is not None):
            from fleetctl.traffic.services import route_mirror_set

            route_mirror_set(actor=actor, route=locked.route,
                             percent=float(locked.sample_percent),
                             pools=[locked.candidate, locked.primary], owner=_owner(locked))
        audit_record(actor=actor, action="shadow.run.adjust", target=locked, before=before,
                     after=_settings_of(locked))
        if locked.mode == ShadowRun.Mode.MIRROR and locked.route is not None:
            transaction.on_commit(lambda: _publish(locked))
    return locked


def run_stop(*, actor: Actor, run: ShadowRun, reason: str) -> ShadowRun:
    """The kill switch, one action: unpublished (collectors stop within a second), the
    route's mirror cleared, the run stopped with the reason."""
    actor.require(roles.JOBS, action="shadow.run.stop", target=run)
    if not (reason or "").strip():
        raise ValidationError({"reason": ["Say why the run stops (it goes in the record)."]})
    current = ShadowRun.objects.select_related("route").get(pk=run.pk)
    if not current.running:
        raise ConflictError(f"Shadow run {current.pk} is {current.status} already"
                            f"{': ' + current.stop_reason if current.stop_reason else ''}.")
    _unpublish(current)
    with transaction.atomic():
        locked = (ShadowRun.objects.select_for_update(of=("self",))
                  .select_related("route").get(pk=run.pk))
        if not locked.running:
            raise ConflictError(f"Shadow run {locked.pk} is {locked.status} already.")
        _end(locked, status=ShadowRun.Status.STOPPED, reason=reason.strip(), actor=actor)
    return locked


def _unpublish(run: ShadowRun) -> None:
    """Remove the route's entry when it is this run's (another run's is left alone)."""
    if run.route is None:
        return
    config = live.published().get(run.route.name)
    if config is not None and config.run == run.pk:
        live.unpublish_run(run.route.name)


def _clear_mirror(locked: ShadowRun, *, reason: str, actor: Actor) -> None:
    """The route's mirror, when this run holds it (pushed to the gateways after the
    commit)."""
    if locked.mode == ShadowRun.Mode.MIRROR and locked.route is not None \
            and getattr(locked.route, "mirror_owner", "") == _owner(locked):
        from fleetctl.traffic.services import route_mirror_clear

        route_mirror_clear(actor=actor, route=locked.route, reason=f"{_owner(locked)}: {reason}")


def _end(locked: ShadowRun, *, status: str, reason: str, actor: Actor) -> None:
    """Inside a transaction holding the run's lock: clear the mirror this run owns, record
    the end (stopped: who stopped it; failed: the reason is its error too)."""
    _clear_mirror(locked, reason=reason, actor=actor)
    locked.status = status
    locked.stop_reason = reason[:2000]
    locked.finished_at = timezone.now()
    locked.counters = selectors.live_counters(locked)
    fields = ["status", "stop_reason", "finished_at", "counters"]
    if status == ShadowRun.Status.STOPPED:
        locked.cancelled_by = actor.label
        fields.append("cancelled_by")
    if status == ShadowRun.Status.FAILED:
        locked.error = reason[:2000]
        fields.append("error")
    locked.save(update_fields=fields)
    audit_record(actor=actor, action=f"shadow.run.{'stop' if status == 'stopped' else 'finish'}",
                 target=locked, message=reason[:2000],
                 after={"status": status, "counters": locked.counters})


def _stop_by_system(run: ShadowRun, reason: str) -> None:
    """A worker found the run must not go on (a pool outside the pin): stop it, once."""
    with contextlib.suppress(ConflictError):  # another worker stopped it first
        run_stop(actor=_system(), run=run, reason=reason)


# --- one pair ---------------------------------------------------------------------------------

_sequence = itertools.count()


def _residency_problem(run: ShadowRun) -> str | None:
    """Fail closed: the route gone, or either pool now outside the route's pin."""
    route = run.route
    if route is None:
        return "the route was deleted: nothing says where its requests may go"
    if not route.residency:
        return None
    for pool in (run.candidate, run.primary):
        if pool.region.jurisdiction != route.residency:
            return (f"residency: pool {pool.name} is now in jurisdiction "
                    f"{pool.region.jurisdiction}, but route {route.name} is pinned to "
                    f"{route.residency}; no more requests are sent")
    return None


def pair_execute(*, run_id: int, request: Any, received_at: str | None = None,
                 source: str = "mirror") -> ShadowPair | None:
    """The `shadow.pair` task: send one sampled request to the three sides, compare, store
    the pair, count it. Returns None when it was dropped (counted with the reason)."""
    run = (ShadowRun.objects.select_related("route", "candidate__region", "primary__region")
           .filter(pk=run_id).first())
    if run is None or not run.running:
        live.count(run_id, dropped_stopped=1)
        return None
    problem = _residency_problem(run)
    if problem is not None:
        live.count(run.pk, dropped_residency=1)
        _stop_by_system(run, problem)
        return None
    if not isinstance(request, dict) or not request.get("model"):
        live.count(run.pk, dropped_malformed=1)
        return None
    when = (parse_datetime(received_at) if isinstance(received_at, str) else None) \
        or timezone.now()
    try:
        endpoints = triple.pick_endpoints(run.primary.base_urls, run.candidate.base_urls,
                                          next(_sequence))
        sides = triple.send(request, endpoints, timeout_s=settings.SHADOW_PAIR_TIMEOUT_S)
        pair = _pair_row(run, request, when, source, sides)
        pair.save()
    except Exception:
        log.exception("shadow run %s: a pair could not be completed", run.pk)
        live.count(run.pk, pair_errors=1)
        return None
    errored = any(side.answer.failed for side in sides.values())
    tokens = sum(_tokens(side.answer) for side in sides.values())
    live.count(run.pk, pairs=1, tokens=tokens, **({"pair_errors": 1} if errored else {}))
    if tokens:
        live.add_tokens(run.pk, tokens)
    return pair


def _tokens(answer: Answer) -> int:
    usage = answer.usage
    if usage is not None and (usage.prompt_tokens or usage.completion_tokens):
        return int(usage.prompt_tokens or 0) + int(usage.completion_tokens or 0)
    return 0 if answer.failed else len(answer.tokens)


def _compare(a: Answer, b: Answer, greedy: bool, options: dict[str, Any]) -> Comparison:
    try:
        return compare(a, b, greedy=greedy, **options)
    except Exception:  # a schema that is not one: compare without it
        return compare(a, b, greedy=greedy, expect_json=options["expect_json"],
                       tools=options["tools"])


def _params(request: Mapping[str, Any]) -> dict[str, Any]:
    """The request's parameters without any of its content."""
    fmt = request.get("response_format")
    raw_tools = request.get("tools")
    tools: list[Any] = raw_tools if isinstance(raw_tools, list) else []
    messages = request.get("messages")
    out: dict[str, Any] = {
        "api": "chat" if "messages" in request else "completions",
        "model": str(request.get("model"))[:200],
        "temperature": request.get("temperature"),
        "max_tokens": request.get("max_tokens", request.get("max_completion_tokens")),
        "stream": bool(request.get("stream")),
        "response_format": fmt.get("type") if isinstance(fmt, dict) else None,
        "tools": [str((t.get("function") or {}).get("name", ""))[:100]
                  for t in tools if isinstance(t, dict)],
        "messages": len(messages) if isinstance(messages, list) else None,
        "logprobs": bool(request.get("logprobs")),
    }
    return {k: v for k, v in out.items() if v is not None}


def _side_text(answer: Answer) -> str:
    if not answer.tool_calls:
        return answer.text
    calls = json.dumps([{"name": c.name, "arguments": c.arguments} for c in answer.tool_calls])
    return f"{answer.text}\n{calls}" if answer.text else calls


def _error_text(answer: Answer, content: str) -> str:
    if not answer.failed:
        return ""
    label = answer.error_code or (f"HTTP {answer.status}" if answer.status else "no answer")
    if content == ShadowRun.Content.OFF or not answer.error_message:
        return label  # a server's message may quote the prompt
    message = answer.error_message[:300]
    return f"{label}: {redact(message) if content == ShadowRun.Content.REDACTED else message}"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _side_record(side: triple.Side, content: str) -> dict[str, Any]:
    answer = side.answer
    usage = answer.usage
    return {"endpoint": side.endpoint, "status": answer.status,
            "error": _error_text(answer, content), "finish": answer.finish_reason,
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "completion_tokens": (usage.completion_tokens if usage and usage.completion_tokens
                                  is not None else (None if answer.failed
                                                    else len(answer.tokens))),
            "ttft_ms": _ms(answer.ttft_s), "tpot_ms": _ms(answer.tpot_s),
            "latency_ms": round(side.latency_ms, 2),
            "text_sha256": hashlib.sha256(_side_text(answer).encode()).hexdigest()}


def _comparison_record(comparison: Comparison, content: str) -> dict[str, Any]:
    out: dict[str, Any] = dict(comparison.metrics())
    out.update(first_divergence=comparison.first_divergence,
               edit_distance=comparison.edit_distance, length_ratio=comparison.length_ratio)
    if content != ShadowRun.Content.OFF:
        for key in ("token_a", "token_b"):
            token = getattr(comparison, key)
            out[key] = (redact(token) if content == ShadowRun.Content.REDACTED and token
                        else token)
    return out


def _content(run: ShadowRun, request: Mapping[str, Any],
             sides: Mapping[str, triple.Side]) -> dict[str, Any]:
    if run.content == ShadowRun.Content.OFF:
        return {}
    stored: dict[str, Any] = {"prompt": request.get("messages", request.get("prompt"))}
    stored.update({role: _side_text(side.answer) for role, side in sides.items()})
    return redact_value(stored) if run.content == ShadowRun.Content.REDACTED else stored


def request_hash(request: Mapping[str, Any]) -> str:
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _pair_row(run: ShadowRun, request: Mapping[str, Any], received_at: datetime, source: str,
              sides: Mapping[str, triple.Side]) -> ShadowPair:
    greedy = requested_greedy(request)
    options = requested_form(request)
    primary = sides["primary"].answer
    noise = _compare(primary, sides["secondary"].answer, greedy, options)
    signal = _compare(primary, sides["candidate"].answer, greedy, options)
    if signal.error_mismatch:
        score = 1.0
    elif signal.edit_distance is not None:
        score = float(signal.edit_distance)
    else:
        score = float(signal.diverged)
    return ShadowPair(
        run=run, source=source if source in ShadowPair.Source.values else "mirror",
        received_at=received_at, completed_at=timezone.now(),
        request_hash=request_hash(request), greedy=greedy, params=_params(request),
        sides={role: _side_record(side, run.content) for role, side in sides.items()},
        content=_content(run, request, sides),
        noise=_comparison_record(noise, run.content),
        signal=_comparison_record(signal, run.content),
        noise_diverged=noise.diverged, signal_diverged=signal.diverged,
        candidate_error=sides["candidate"].answer.failed, divergence_score=score)


# --- replay -----------------------------------------------------------------------------------

def replay_body(row: Any, model_id: str) -> dict[str, Any]:
    """A trace row as a chat request: its messages (or its prompt as one user message), its
    completion length as max_tokens, greedy and streamed, with logprobs so that near-tie
    flips can be told apart from real divergence."""
    messages = list(row.messages) if row.messages else [{"role": "user", "content": row.prompt}]
    return {"model": model_id, "messages": messages, "max_tokens": row.completion_tokens,
            "temperature": 0, "stream": True, "logprobs": True, "top_logprobs": 5}


def _pair_in_thread(run_id: int, body: dict[str, Any], received_at: str) -> None:
    try:
        pair_execute(run_id=run_id, request=body, received_at=received_at, source="replay")
    finally:
        connection.close()  # this pool thread's own connection


def replay_execute(*, run_id: int) -> ShadowRun | None:
    """The `shadow.replay` task: send a `sample_percent` share of the trace's requests with
    text, at the trace's arrival times, each admitted by live.admit (rate, tokens, behind) and
    executed as a pair; then judge the run and mark it finished. Stops when the run stops."""
    from fleetctl.bench.services import trace_requests

    run = ShadowRun.objects.select_related("trace", "route").filter(pk=run_id).first()
    if run is None or not run.running or run.trace is None:
        return run
    try:
        rows = [r for r in trace_requests(run.trace) if r.prompt is not None or r.messages]
    except ConflictError as exc:
        _fail(run, str(exc))
        return ShadowRun.objects.get(pk=run_id)
    rng = random.Random(run.pk)
    chosen = [r for r in rows if rng.random() * 100 < run.sample_percent]
    busy: set[Future[None]] = set()
    lock = threading.Lock()
    stopped = False
    with ThreadPoolExecutor(max_workers=REPLAY_CONCURRENCY,
                            thread_name_prefix=f"shadow-replay-{run.pk}") as pool:
        t0 = time.monotonic()
        for row in chosen:
            if not _wait_until(run, t0 + row.arrival_s):
                stopped = True
                break
            live.count(run.pk, received=1)
            # The caps as they are now: run_adjust may have changed them meanwhile.
            caps = ShadowRun.objects.filter(pk=run.pk).values(
                "max_rps", "max_tokens_per_day").first() or run
            reason = live.admit(run.pk, caps)
            with lock:
                busy = {f for f in busy if not f.done()}
                if not reason and len(busy) >= REPLAY_CONCURRENCY:
                    reason = "behind"
            if reason:
                live.count(run.pk, **{f"dropped_{reason}": 1})
                continue
            live.count(run.pk, sampled=1)
            busy.add(pool.submit(_pair_in_thread, run.pk, replay_body(row, run.model_id),
                                 timezone.now().isoformat()))
    close_old_connections()
    if not stopped and jobs.heartbeat(run):
        _complete(run, f"the trace was replayed ({len(chosen)} of {len(rows)} requests "
                       f"sampled)")
    return ShadowRun.objects.get(pk=run.pk)


def _complete(run: ShadowRun, reason: str) -> ShadowRun:
    """A replay that sent its trace: complete (jobs.finish), judged one last time in the
    same transaction — the judgement is its evidence hook."""

    def judged(locked: ShadowRun) -> dict[str, Any]:
        return {"judgement": run_judge(run=locked).pk}

    return jobs.finish(run, actor=_system(), action="shadow.run.finish", evidence=judged,
                       fields={"stop_reason": reason,
                               "counters": selectors.live_counters(run)},
                       message=reason)


def _wait_until(run: ShadowRun, at: float) -> bool:
    """Sleep until monotonic time `at`, looking at the run meanwhile; False once it stopped."""
    while True:
        left = at - time.monotonic()
        if not jobs.heartbeat(run):  # the replay's beat; False once the run stopped
            return False
        if left <= 0:
            return True
        time.sleep(min(left, REPLAY_POLL_S))


def _fail(run: ShadowRun, reason: str) -> None:
    with transaction.atomic():
        locked = ShadowRun.objects.select_for_update(of=("self",)).select_related(
            "route").get(pk=run.pk)
        if locked.running:
            _end(locked, status=ShadowRun.Status.FAILED, reason=reason, actor=_system())


# --- judge and purge --------------------------------------------------------------------------

def _evidence_due(run: ShadowRun, judged: stats.RunJudgement) -> bool:
    from migrations_plan.models import Evidence

    if judged.pairs == 0:
        return False
    if run.evidence_id is None or judged.verdict != run.verdict:
        return True
    last = Evidence.objects.filter(pk=run.evidence_id).values("observed_at", "data").first()
    if last is None:
        return True
    stale = last["observed_at"] <= timezone.now() - timedelta(seconds=EVIDENCE_EVERY_S)
    return stale and judged.pairs > int((last["data"] or {}).get("pairs", 0))


def _evidence_data(run: ShadowRun, judged: stats.RunJudgement, counters: dict[str, int],
                   window: tuple[datetime | None, datetime | None]) -> dict[str, Any]:
    from migrations_plan.evidence import pool_fingerprint

    first, last = window
    return {
        "run": run.pk, "mode": run.mode, "pairs": judged.pairs, "min_pairs": run.min_pairs,
        "margin": run.margin, "confidence": run.confidence,
        "window": {"from": first.isoformat() if first else None,
                   "to": last.isoformat() if last else None},
        "metrics": judged.metrics_dict(), "gated": list(stats.GATED),
        "counters": {k: v for k, v in counters.items() if v >= 0},
        "primary": run.primary.name, "candidate": run.candidate.name,
        "fingerprints": {"primary": pool_fingerprint(run.primary, [run.model_id]),
                         "candidate": pool_fingerprint(run.candidate, [run.model_id])},
        "route": run.route.name if run.route else None, "model": run.model_id,
    }


def _record_live_quality(run: ShadowRun, judged: stats.RunJudgement,
                         shadow: Evidence) -> None:
    """In stage 4 the mirrored requests are live traffic, so the judgement also speaks to the
    stage-4 check "Quality unchanged": record it as `live-quality` evidence too (the kind the
    evals app registers; shadow may not import evals, hence the name). The same verdict and
    summary as the `shadow` row, with the gated metrics' intervals."""
    from migrations_plan.services import evidence_record

    data = {"run": run.pk, "source": "shadow", "stage": 4, "items": judged.pairs,
            "min_items": run.min_pairs, "margin": run.margin, "confidence": run.confidence,
            "candidate": run.candidate.name, "primary": run.primary.name,
            "model": run.model_id,
            "metrics": {name: m for name, m in judged.metrics_dict().items()
                        if name in stats.GATED},
            "fingerprints": (shadow.data or {}).get("fingerprints", {})}
    evidence_record(actor=_system(), pool=run.candidate, kind=LIVE_QUALITY_KIND,
                    verdict=shadow.verdict, summary=shadow.summary, data=data,
                    route=run.route, model_id=run.model_id, source=f"shadow run {run.pk}",
                    url=f"/shadow/runs/{run.pk}/")


def run_judge(*, run: ShadowRun) -> ShadowJudgement:
    """Judge the run's pairs (stats.judge_pairs), store the judgement, fold the Redis
    counters into the run, and record `shadow` evidence about the candidate when the verdict
    changed or a minute passed with new pairs."""
    from migrations_plan.services import evidence_record

    run = ShadowRun.objects.select_related("route", "candidate", "primary", "plan").get(pk=run.pk)
    # The newest SHADOW_JUDGE_WINDOW_PAIRS pairs: a run that lasts for weeks is judged on
    # its recent behaviour at a bounded cost per look, not on every pair it ever made. One
    # pair per distinct request (its newest): a prompt asked a hundred times diverges, or
    # not, a hundred times alike, and counted a hundred times it would narrow the interval
    # as if it were a hundred different requests.
    rows = list(ShadowPair.objects.filter(run=run).order_by("-received_at", "-id")
                .values_list("noise", "signal", "received_at", "request_hash", "sides")
                [:settings.SHADOW_JUDGE_WINDOW_PAIRS])
    seen: set[str] = set()
    pairs = []
    for noise, signal, _, digest, _sides in rows:
        if digest not in seen:
            seen.add(digest)
            pairs.append((noise, signal))
    window = (rows[-1][2], rows[0][2]) if rows else (None, None)
    judged = stats.judge_pairs(pairs, margin=run.margin, min_pairs=run.min_pairs,
                               confidence=run.confidence)
    counters = selectors.live_counters(run)
    now = timezone.now()
    with transaction.atomic():
        judgement = ShadowJudgement.objects.create(
            run=run, at=now, pairs=judged.pairs, verdict=judged.verdict,
            metrics=judged.metrics_dict(), counters=counters,
            latency=stats.latency_summary([row[4] for row in rows]))
        evidence_id = run.evidence_id
        if _evidence_due(run, judged):
            evidence = evidence_record(
                actor=_system(), pool=run.candidate, kind=KIND,
                verdict=EVIDENCE_VERDICT[judged.verdict], summary=judged.summary,
                data=_evidence_data(run, judged, counters, window), route=run.route,
                model_id=run.model_id, source=f"shadow run {run.pk}",
                url=f"/shadow/runs/{run.pk}/")
            evidence_id = evidence.pk
            if run.plan.stage == 4:
                _record_live_quality(run, judged, evidence)
        ShadowRun.objects.filter(pk=run.pk).update(
            verdict=judged.verdict, summary=judged.summary[:600], counters=counters,
            judged_at=now, evidence_id=evidence_id)
    return judgement


def publications_reconcile() -> None:
    """Make what the collectors read in Redis match the running mirror runs: a Redis that
    restarted empty (the demo's embedded one, a failover) forgets every run, and the
    collectors would count the route's copies as unmatched for as long as the run lasts; a
    publication whose run is no longer running is taken down."""
    running = {run.route.name: run for run in ShadowRun.objects.select_related("route").filter(
        status=ShadowRun.Status.RUNNING, mode=ShadowRun.Mode.MIRROR, route__isnull=False)
        if run.route is not None}
    if running:
        # Cheap (one read, one write), and a Redis that restarted empty lost these too.
        mirror_auth.publish_quietly()
    held = live.published()
    for name, run in running.items():
        expected = live.RunConfig(run.pk, float(run.max_rps), int(run.max_tokens_per_day))
        if held.get(name) != expected:
            log.warning("shadow run %s was not published for route %s; publishing it again",
                        run.pk, name)
            _publish(run)
            if not any(live.counters(run.pk).values()):
                # Redis lost the counters too: carry on from what the judge last folded in,
                # so what comes next adds to them instead of hiding under them.
                stored = {k: int(v) for k, v in (run.counters or {}).items()
                          if k in live.COUNTER_FIELDS and int(v) > 0}
                if stored:
                    live.count(run.pk, **stored)
    for name in set(held) - set(running):
        log.warning("route %s was published for shadow run %s, which is not running; taking "
                    "it down", name, held[name].run)
        live.unpublish_run(name)


def runs_judge() -> int:
    """Beat: judge every running run; one run's failure does not stop the others. Running
    mirror runs are published again first if Redis lost them."""
    try:
        publications_reconcile()
    except Exception:
        log.exception("shadow runs could not be checked against what the collectors read")
    judged = 0
    for run in ShadowRun.objects.filter(status=ShadowRun.Status.RUNNING):
        try:
            run_judge(run=run)
            judged += 1
        except Exception:
            log.exception("shadow run %s could not be judged", run.pk)
    return judged


def _without_tokens(column: str) -> RawSQL:
    """The comparison JSON less its divergent tokens (text), in the database's own dialect:
    jsonb on PostgreSQL, the JSON1 functions on SQLite (the demo's database)."""
    if connection.vendor == "postgresql":
        return RawSQL(f"{column} - 'token_a' - 'token_b'", ())
    return RawSQL(f"json_remove({column}, '$.token_a', '$.token_b')", ())


def pairs_purge(now: datetime | None = None) -> int:
    """Beat: empty the stored text (content, and the divergent tokens in the comparisons)
    of pairs received longer ago than their run's retention. Metrics and hashes stay."""
    now = now or timezone.now()
    purged = 0
    for hours in (ShadowRun.objects.filter(pairs__content_purged_at__isnull=True)
                  .values_list("retention_hours", flat=True).distinct()):
        purged += ShadowPair.objects.filter(
            run__retention_hours=hours, content_purged_at__isnull=True,
            received_at__lt=now - timedelta(hours=hours)).update(
            content={}, content_purged_at=now,
            noise=_without_tokens("noise"), signal=_without_tokens("signal"))
    if purged:
        log.info("shadow: purged the text of %s pairs past their retention", purged)
    return purged
