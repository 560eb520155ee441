"""Eval runs driven for real: the session's Celery worker (or two drivers in this process)
sends a small suite to simulated pools, directly, and writes every row once.

- a run completes: one row per (item, pool), each scored once with its one attempt, sent to
  its own pool's endpoints round-robin, counted, finished with evidence;
- a pool whose endpoint refuses connections: each row tried max_attempts times (each attempt
  recorded, none with a byte back), scored 0 with the reason; the run still completes;
- cancel: the driver stops within its heartbeat, rows not written go back to pending;
- run_execute twice at once on one run: one drives, the other returns; no row scored twice;
- a run whose worker died (stale heartbeat, rows claimed by it) is taken over: its claimed rows
  sent again with an "interrupted" attempt, its written rows left alone.

The statistical end-to-end runs and the kill -9 test are tests/evals/test_e2e.py and
test_resume.py. Also here: inference.upstream's first_byte, on sockets that fail before and after
the status line.
"""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.celery import app
from fleetctl.evals import runner, services
from fleetctl.evals.models import EvalResult, EvalRun, EvalSuite
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from fleetctl.inference import upstream
from migrations_plan.models import Evidence
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

MODEL = "llama-3.1-8b-instruct"
SYSTEM = Actor.for_system("eval-runs-test")


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("evals-runs"), TEST_PROFILES,
                            {"a1": "quick", "a2": "quick", "b": "quick-twin",
                             "slow": "slow-40ms", "slow2": "slow-40ms"})
    yield sim
    sim.stop()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def sim_pool(sims: SimProcess, make_pool: Callable[..., Pool], system: Any
             ) -> Callable[..., Pool]:
    def make(name: str, *urls: str) -> Pool:
        pool = make_pool(name=name, base_urls=list(urls))
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=4096)
        return Pool.objects.get(pk=pool.pk)

    return make


def suite(n: int, name: str = "adds", max_tokens: int = 8) -> EvalSuite:
    header = {"fleetctl_eval_suite": 1, "description": "additions",
              "decoding": {"temperature": 0, "seed": 3, "max_tokens": max_tokens}}
    lines = [json.dumps(header)] + [json.dumps({
        "id": f"add-{i:03d}", "messages": [{"role": "user", "content": f"What is {i}+{i}?"}],
        "references": [str(2 * i)], "scorer": "numeric", "tags": ["arithmetic"]})
        for i in range(n)]
    made, _ = services.suite_upload(actor=SYSTEM, name=name,
                                    fileobj=io.BytesIO(("\n".join(lines) + "\n").encode()))
    return made


def lead(make_user: Callable[..., Any]) -> Actor:
    return Actor(user=make_user("lead", "platform-lead"))


def rows(run: EvalRun) -> list[EvalResult]:
    return list(EvalResult.objects.filter(run=run).select_related("run_pool__pool")
                .order_by("position"))


def finished(run: EvalRun, timeout_s: float = 120) -> EvalRun:
    return wait_until(lambda: (lambda r: r if r.status not in EvalRun.ACTIVE else None)(
        EvalRun.objects.get(pk=run.pk)), timeout_s=timeout_s, what=f"eval run {run.pk} to end")


@pytest.fixture
def evals_queue_held(celery_worker: Any) -> Iterator[None]:
    """The session's worker stops consuming `evals` for the test (and starts again after), so
    the test decides who drives a run."""
    active = app.control.inspect(timeout=5).active_queues() or {}
    [name] = [n for n in active if n.startswith("test-")]
    app.control.cancel_consumer("evals", destination=[name], reply=True, timeout=5)
    try:
        yield
    finally:
        app.control.add_consumer("evals", destination=[name], reply=True, timeout=5)


# --- the one-endpoint call --------------------------------------------------------------------

def _serve_once(reply: bytes) -> tuple[str, threading.Thread]:
    """A socket that reads one request, writes `reply` (maybe nothing) and closes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        if reply:
            conn.sendall(reply)
        conn.close()
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{server.getsockname()[1]}", thread


def test_upstream_tells_a_failure_before_the_first_byte_from_one_after():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    refused = upstream.call(closed_port_url(), body, timeout_s=5)
    assert (refused.answer.status, refused.answer.error_code, refused.first_byte) == (
        0, "unreachable", False)
    url, thread = _serve_once(b"")  # accepted, then closed without a byte
    silent = upstream.call(url, body, timeout_s=5)
    thread.join(5)
    assert (silent.answer.status, silent.first_byte) == (0, False)
    url, thread = _serve_once(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n"
                              b"1a\r\ndata: {\"choices\": []}\n\n\r\n")  # then dropped
    dropped = upstream.call(url, body, timeout_s=5)
    thread.join(5)
    assert dropped.answer.failed and dropped.first_byte
    url, thread = _serve_once(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n"
                              b"Connection: close\r\n\r\nbusy")
    busy = upstream.call(url, body, timeout_s=5)
    thread.join(5)
    assert (busy.answer.status, busy.first_byte) == (503, True)


# --- runs -------------------------------------------------------------------------------------

def test_a_run_sends_every_item_to_each_pool_directly_and_scores_each_row_once(
        celery_worker, sims, sim_pool, make_user):
    cand = sim_pool("cand", sims.url("a1"), sims.url("a2"))
    prim = sim_pool("prim", sims.url("b"))
    s = suite(24)
    run = services.run_create(actor=lead(make_user), suite=s, candidate=cand, primary=prim,
                              concurrency=6, min_items=5)
    assert run.total == 48
    run = finished(run)
    assert run.status == "complete", run.error
    assert (run.done, run.resumed) == (48, 0) and run.worker and run.finished_at
    assert run.verdict in ("pass", "warn", "fail", "insufficient") and run.summary
    got = rows(run)
    assert len(got) == 48 and {(r.item_id, r.run_pool_id) for r in got} == {
        (i, rp) for i in s.items.values_list("pk", flat=True)
        for rp in run.run_pools.values_list("pk", flat=True)}
    urls = {"cand": {sims.url("a1"), sims.url("a2")}, "prim": {sims.url("b")}}
    for r in got:
        assert r.status == "done" and r.score is not None and r.scored_at and r.reason
        assert r.http_status == 200 and not r.error and r.text and r.finish_reason
        assert r.completion_tokens and r.prompt_tokens and r.latency_ms and r.ttft_ms
        [attempt] = r.attempts  # one attempt, answered
        assert attempt["error"] == "" and attempt["first_byte"] is True
        # Pinned: each row went to an endpoint of its own pool, never anywhere else.
        assert r.endpoint == attempt["endpoint"] and r.endpoint in urls[r.run_pool.pool.name]
    # Round-robin over the candidate's two endpoints.
    used = [r.endpoint for r in got if r.run_pool.pool.name == "cand"]
    assert {used.count(u) for u in urls["cand"]} == {12}
    assert EvalRun.objects.get(pk=run.pk).stats["paired"]["n"] == 24
    assert Evidence.objects.get(pk=run.evidence_id).kind == "eval"


def test_a_pool_that_refuses_connections_is_tried_max_attempts_times_and_scored_zero(
        celery_worker, sims, sim_pool, make_user):
    cand = sim_pool("cand", sims.url("a1"))
    down = sim_pool("down", closed_port_url())
    run = services.run_create(actor=lead(make_user), suite=suite(6), candidate=cand,
                              primary=down, concurrency=4, max_attempts=3, min_items=2)
    run = finished(run)
    assert run.status == "complete" and run.done == run.total == 12
    for r in rows(run):
        if r.run_pool.pool.name == "cand":
            assert len(r.attempts) == 1 and r.http_status == 200
            continue
        assert len(r.attempts) == 3, r.attempts
        assert all(a["error"].startswith("unreachable") and a["first_byte"] is False
                   and a["status"] == 0 for a in r.attempts)
        assert (r.score, r.http_status) == (0.0, 0)
        assert r.reason.startswith("the call failed (no response)")
        assert r.error.startswith("unreachable")
    # The candidate was fine; the primary scored nothing: the verdict says so.
    assert run.stats["pools"]["down"]["score"] == 0.0


def test_a_cancelled_run_stops_and_gives_back_the_rows_it_had_not_written(
        celery_worker, sims, sim_pool, make_user):
    cand = sim_pool("cand", sims.url("slow"))
    prim = sim_pool("prim", sims.url("slow2"))
    run = services.run_create(actor=lead(make_user), suite=suite(40, max_tokens=24),
                              candidate=cand, primary=prim, concurrency=2)
    wait_until(lambda: EvalRun.objects.get(pk=run.pk).done >= 2, timeout_s=60,
               what="a few rows scored")
    services.run_cancel(actor=lead_again(make_user), run=run)
    # The driver sees it at its next heartbeat and gives its claimed rows back.
    wait_until(lambda: not EvalResult.objects.filter(run=run, status="claimed").exists(),
               timeout_s=30, what="the claimed rows given back")
    done_then = EvalRun.objects.get(pk=run.pk).done
    stopped = EvalRun.objects.get(pk=run.pk)
    assert stopped.status == "cancelled" and stopped.cancelled_by == "lead2"
    assert 2 <= done_then < stopped.total
    got = rows(stopped)
    assert sum(r.status == "done" for r in got) == stopped.done
    assert {r.status for r in got} == {"done", "pending"}
    assert stopped.evidence_id is None and not stopped.verdict
    beat = stopped.heartbeat_at
    # Nothing drives it any more: its heartbeat and its rows stay as they are.
    wait_until(lambda: (timezone.now() - beat).total_seconds() > 3, timeout_s=10,
               what="three seconds")
    assert EvalRun.objects.get(pk=run.pk).heartbeat_at == beat
    assert EvalRun.objects.get(pk=run.pk).done == stopped.done


def lead_again(make_user: Callable[..., Any]) -> Actor:
    return Actor(user=make_user("lead2", "platform-lead"))


def _execute_in_thread(run_id: int, out: list[Any]) -> threading.Thread:
    def body() -> None:
        try:
            out.append(services.run_execute(run_id=run_id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_two_drivers_at_once_one_drives_and_no_row_is_scored_twice(
        evals_queue_held, sims, sim_pool, make_user):
    cand = sim_pool("cand", sims.url("a1"))
    prim = sim_pool("prim", sims.url("b"))
    run = services.run_create(actor=lead(make_user), suite=suite(30), candidate=cand,
                              primary=prim, concurrency=4, min_items=5)
    assert EvalRun.objects.get(pk=run.pk).status == "queued"  # nobody took it
    results: list[Any] = []
    threads = [_execute_in_thread(run.pk, results) for _ in range(2)]
    for thread in threads:
        thread.join(120)
    final = EvalRun.objects.get(pk=run.pk)
    assert final.status == "complete" and final.done == final.total == 60
    assert final.resumed == 0
    for r in rows(final):
        assert r.status == "done" and len(r.attempts) == 1, r.attempts
    # A third call on the finished run does nothing.
    again = services.run_execute(run_id=run.pk)
    assert again is not None and again.finished_at == final.finished_at


def test_a_run_whose_worker_died_is_taken_over_and_nothing_is_scored_twice(
        evals_queue_held, sims, sim_pool, make_user, settings):
    cand = sim_pool("cand", sims.url("a1"))
    prim = sim_pool("prim", sims.url("b"))
    run = services.run_create(actor=lead(make_user), suite=suite(20), candidate=cand,
                              primary=prim, concurrency=4, min_items=5)
    # What a worker that died leaves: the run running under its token with an old heartbeat,
    # the first 10 rows written by it, the next 6 claimed (in flight), the rest pending.
    long_ago = timezone.now() - timedelta(hours=1)
    EvalRun.objects.filter(pk=run.pk).update(status="running", worker="dead-worker",
                                             started_at=long_ago, heartbeat_at=long_ago,
                                             done=10)
    ordered = rows(run)
    written_attempt = {"at": long_ago.isoformat(), "endpoint": "x", "ms": 1.0, "status": 200,
                       "first_byte": True, "error": ""}
    for r in ordered[:10]:
        EvalResult.objects.filter(pk=r.pk).update(
            status="done", claim="dead-worker", score=1.0, reason="by the dead worker",
            text="earlier", http_status=200, scored_at=long_ago, attempts=[written_attempt])
    for r in ordered[10:16]:
        EvalResult.objects.filter(pk=r.pk).update(status="claimed", claim="dead-worker",
                                                  claimed_at=long_ago)
    # A driver while the heartbeat is fresh would not take it; a stale one is taken over.
    EvalRun.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
    assert runner.take(run.pk, "intruder") is None
    EvalRun.objects.filter(pk=run.pk).update(heartbeat_at=long_ago)
    assert services.runs_reap() == 1  # what beat does: enqueued again...
    results: list[Any] = []
    _execute_in_thread(run.pk, results).join(120)  # ...and a worker takes it over
    final = EvalRun.objects.get(pk=run.pk)
    assert final.status == "complete" and final.resumed == 1
    assert final.worker not in ("", "dead-worker")
    assert final.done == final.total == 40
    got = rows(final)
    for r in got[:10]:  # written before: untouched
        assert (r.reason, r.scored_at, r.attempts) == ("by the dead worker", long_ago,
                                                        [written_attempt])
    for r in got[10:16]:  # in flight when it died: interrupted, then answered once
        assert [a["error"].split(":")[0] for a in r.attempts] == ["interrupted", ""]
        assert r.status == "done" and r.text != "earlier"
    for r in got[16:]:
        assert len(r.attempts) == 1 and r.attempts[0]["error"] == ""
