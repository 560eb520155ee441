"""Worker code for pairs: execute one sampled request three ways (the `shadow.pair` task)
and replay a trace (`shadow.replay`), storing each pair as the run's content policy allows.
A worker that finds a pool outside the route's pin stops the run itself."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleetctl.core.errors import ConflictError
from fleetctl.inference.compare import Answer, Comparison, compare, requested_form, requested_greedy
from fleetctl.shadow import live, selectors, triple
from fleetctl.shadow.models import ShadowPair, ShadowRun
from fleetctl.shadow.redact import redact, redact_value
from fleetctl.shadow.services._shared import _end, _system, log
from fleetctl.shadow.services.judging import run_judge
from fleetctl.shadow.services.people import run_stop
from migrations_plan import jobs

# A replay sends at most this many pairs at once; a sample due while all are busy is dropped
# (dropped_behind), as the collector drops when the workers fall behind.
REPLAY_CONCURRENCY = 8
# A replay looks at the run's status this often while it waits for the next arrival.
REPLAY_POLL_S = 0.5


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
