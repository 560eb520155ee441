"""The streaming runner against a real simulator process (timing checked against the
simulator's own per-request ground truth) and against a tiny misbehaving server."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from aiohttp import web

from fleetctl.bench.runner import Endpoint, LevelPlan, LevelResult, run_level
from fleetctl.bench.stats import summarize
from tests.noise import best_of
from tests.sim.simproc import MODEL, SimProcess
from tests.support.waiting import wait_until

from .conftest import Row

pytestmark = pytest.mark.slow

QUICK = LevelPlan(warmup_s=0.0, window_s=0.5, min_samples=4, max_duration_s=10.0,
                  request_timeout_s=10.0)


def run(coro: Awaitable[LevelResult]) -> LevelResult:
    return asyncio.run(coro)  # type: ignore[arg-type]


def ground_truth(url: str) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    since = 0
    while True:
        page = httpx.get(f"{url}/admin/ground-truth",
                         params={"kind": "requests", "since": since, "limit": 500}).json()
        records.update({r["request_id"]: r for r in page["requests"]})
        if not page["requests"]:
            return records
        since = page["next_since"]


def relative_error(measured: Sequence[float | None], truth: Sequence[float]) -> float:
    values = [m for m in measured if m is not None]
    assert len(values) == len(truth)
    return abs(statistics.median(values) / statistics.median(truth) - 1)


# ---- against the simulator ------------------------------------------------------------------


def test_ttft_and_tpot_medians_match_what_the_simulator_did(bench_sim: SimProcess) -> None:
    url = bench_sim.url("paced")
    trace = [Row(prompt_tokens=1200, completion_tokens=16), Row(900, 24)]
    attempt = itertools.count(1)

    def measure() -> str | None:
        level = run(run_level(Endpoint(url, MODEL), trace, QUICK, concurrency=4,
                              request_id_prefix=f"accuracy-{next(attempt)}"))
        truth = ground_truth(url)
        ok = [r for r in level.results if r.status == "ok"]
        assert len(ok) >= 4 and all(r.tokens_source == "usage" for r in ok)
        gt = [truth[r.request_id] for r in ok]
        gt_tpot = [(g["token_times_mono"][-1] - g["token_times_mono"][0])
                   / (g["completion_tokens"] - 1) for g in gt]
        assert [r.output_tokens for r in ok] == [g["completion_tokens"] for g in gt]
        assert [r.input_tokens for r in ok] == [g["prompt_tokens"] for g in gt]
        assert all(len(r.chunk_times) == r.output_tokens for r in ok)  # one token per chunk
        # Within 5 %: a descheduled client can spoil one level's medians, not every one;
        # a client that measures from the wrong moment spoils them all.
        ttft_error = relative_error([r.ttft_s for r in ok], [g["ttft_s"] for g in gt])
        tpot_error = relative_error([r.tpot_s for r in ok], gt_tpot)
        if ttft_error < 0.05 and tpot_error < 0.05:
            return None
        return f"median TTFT off by {ttft_error:.1%}, TPOT by {tpot_error:.1%}"

    best_of(3, measure)


def test_a_level_runs_past_its_window_until_it_has_its_minimum_samples(
    bench_sim: SimProcess,
) -> None:
    plan = LevelPlan(warmup_s=0.3, window_s=0.2, min_samples=6, max_duration_s=10.0)
    level = run(run_level(Endpoint(bench_sim.url("paced"), MODEL), [Row(50, 10)], plan,
                          concurrency=2))

    warm = [r for r in level.results if r.warmup]
    measured = [r for r in level.results if not r.warmup]
    assert warm and all(r.started_at < 0.3 for r in warm)
    assert len(measured) >= 6 and all(r.started_at >= 0.3 for r in measured)
    assert level.stopped_by == "window" and level.window_s >= 0.2
    summary = summarize(level.samples())
    assert summary.n_warmup == len(warm) and summary.n_ok == len(measured)
    assert summary.output_tokens_per_s > 0 and 0 < summary.client_cpu_share < 1  # type: ignore[operator]


def test_max_duration_ends_a_level_that_cannot_get_its_samples(bench_sim: SimProcess) -> None:
    plan = LevelPlan(warmup_s=0.0, window_s=0.2, min_samples=1000, max_duration_s=0.6)
    level = run(run_level(Endpoint(bench_sim.url("paced"), MODEL), [Row(50, 5)], plan,
                          concurrency=1))
    assert level.stopped_by == "max_duration" and 0 < len(level.results) < 1000


def test_trace_timing_sends_at_the_traces_offsets_scaled_by_speed(bench_sim: SimProcess) -> None:
    url = bench_sim.url("paced")
    trace = [Row(40, 4, arrival_s=t) for t in (0.0, 0.2, 0.4, 0.6)]
    plan = LevelPlan(warmup_s=0.0, window_s=0.35, min_samples=1, max_duration_s=10.0)
    attempt = itertools.count(1)

    def measure() -> str | None:
        level = run(run_level(Endpoint(url, MODEL), trace, plan, speed=2.0,
                              request_id_prefix=f"timed-{next(attempt)}"))
        scheduled = [r.scheduled_at for r in level.results[:4]]
        assert scheduled == pytest.approx([0.0, 0.1, 0.2, 0.3])
        # Never sent before its time (a floor), and on time within 50 ms and 100 ms apart
        # at the pool within 30 ms: a descheduled client can spoil one level, not every one;
        # ignoring the speed (200 ms apart) or the offsets (all at once) spoils them all.
        assert all(r.schedule_lag_s > -0.001 for r in level.results)
        truth = ground_truth(url)
        arrivals = [truth[r.request_id]["arrival_mono"] for r in level.results[:4]]
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        lag = max(r.schedule_lag_s for r in level.results)
        if lag < 0.05 and gaps == pytest.approx([0.1, 0.1, 0.1], abs=0.03):
            return None
        return f"schedule lag up to {lag * 1000:.0f} ms, arrival gaps {gaps}"

    best_of(3, measure)


def test_synthetic_prompts_are_about_prompt_tokens_long_and_share_their_prefix_group(
    bench_sim: SimProcess,
) -> None:
    url = bench_sim.url("paced")
    trace = [Row(400, 2, prefix_group="system-a", prefix_tokens=320)] * 2
    level = run(run_level(Endpoint(url, MODEL), trace, QUICK, concurrency=1,
                          request_id_prefix="prefix"))
    truth = ground_truth(url)
    first, second = (truth[r.request_id] for r in level.results[:2])
    # The simulator counts 1 BOS + 10 chat-template tokens on top of the prompt's words.
    assert first["prompt_tokens"] == 400 + 11
    assert second["cached_tokens"] >= 304  # whole 16-token blocks of the shared 320 words


def test_the_servers_error_message_is_kept_for_http_errors(bench_sim: SimProcess) -> None:
    level = run(run_level(Endpoint(bench_sim.url("paced"), "no-such-model"), [Row(10, 2)],
                          QUICK, concurrency=1))
    result = level.results[0]
    assert result.status == "error" and result.http_status == 404
    assert result.error is not None and result.error.startswith("HTTP 404: ")
    assert "no-such-model" in result.error


def test_a_pool_going_down_mid_stream_counts_as_an_error_and_keeps_its_partial_timing(
    bench_sim: SimProcess,
) -> None:
    url = bench_sim.url("faulty")

    def tokens_generated() -> float:
        return sum(float(line.rsplit(" ", 1)[1])
                   for line in httpx.get(f"{url}/metrics").text.splitlines()
                   if line.startswith("vllm:generation_tokens_total{"))

    before = tokens_generated()

    async def go_down_during_the_level() -> LevelResult:
        level = asyncio.create_task(run_level(Endpoint(url, MODEL), [Row(50, 200)], QUICK,
                                              concurrency=2))
        # Down once the streams are under way (tokens sent; 200 tokens take 4 s), rather
        # than after a fixed pause a loaded machine may not have used to start them.
        await asyncio.to_thread(wait_until, lambda: tokens_generated() >= before + 4,
                                timeout_s=30, every_s=0.02, what="a stream to start")
        async with httpx.AsyncClient() as http:
            await http.post(f"{url}/admin/faults", json={"down": True})
        try:
            return await level
        finally:
            async with httpx.AsyncClient() as http:
                await http.post(f"{url}/admin/reset")

    level = run(go_down_during_the_level())
    cut = [r for r in level.results if r.chunk_times]
    assert cut and all(r.status == "error" for r in cut)
    assert all(r.error and r.error.startswith("in stream: ") for r in cut)
    assert all(r.ttft_s is not None and 0 < len(r.chunk_times) < 200 for r in cut)
    later = [r for r in level.results if not r.chunk_times]
    assert later and all(r.http_status == 503 for r in later)
    assert summarize(level.samples()).error_rate == 1.0


def test_a_pool_that_is_down_gives_a_clear_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the test sends
    level = run(run_level(Endpoint(f"http://127.0.0.1:{port}", MODEL), [Row(10, 2)], QUICK,
                          concurrency=2))
    assert level.results and all(r.status == "error" for r in level.results)
    error = level.results[0].error or ""
    assert f"cannot connect to 127.0.0.1:{port}" in error and "pool is down" in error


# ---- against a tiny server that misbehaves on purpose ---------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def sse(data: dict[str, Any] | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def token(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


async def streaming(request: web.Request, events: list[bytes], *, drop: bool = False,
                    pause_s: float = 0.01) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionResetError):  # the client may leave first (timeouts)
        for event in events:
            await response.write(event)
            await asyncio.sleep(pause_s)
        if drop:
            assert request.transport is not None
            request.transport.close()  # mid-body: no terminating chunk
            return response
        await response.write_eof()
    return response


async def drops(request: web.Request) -> web.StreamResponse:
    return await streaming(request, [sse(token(" a")), sse(token(" b"))], drop=True)


async def no_usage(request: web.Request) -> web.StreamResponse:
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    events = [sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    events += [sse(token(f" w{i}")) for i in range(5)] + [sse(finish), sse("[DONE]")]
    return await streaming(request, events)


async def not_streaming(request: web.Request) -> web.StreamResponse:
    return web.json_response({"choices": [{"message": {"content": "hi"}}],
                              "usage": {"prompt_tokens": 3, "completion_tokens": 1}})


async def stalls(request: web.Request) -> web.StreamResponse:
    """One token, then nothing for 10 s (unless the client leaves first)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(sse(token(" a")))
    for _ in range(1000):
        if request.transport is None or request.transport.is_closing():
            break
        await asyncio.sleep(0.01)
    return response


@asynccontextmanager
async def tiny_server(handlers: dict[str, Handler]) -> AsyncIterator[str]:
    app = web.Application()
    for name, handler in handlers.items():
        app.router.add_post(f"/{name}/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def against(handler: Handler, plan: LevelPlan = QUICK) -> LevelResult:
    async def go() -> LevelResult:
        async with tiny_server({"x": handler}) as base:
            return await run_level(Endpoint(f"{base}/x", MODEL), [Row(10, 5)], plan,
                                   concurrency=1)
    return run(go())


def test_a_connection_dropped_mid_stream_is_an_error_with_partial_timing() -> None:
    result = against(drops).results[0]
    assert result.status == "error" and result.http_status == 200
    assert result.error is not None and "dropped mid-stream after 2 content chunks" in result.error
    assert result.ttft_s is not None and len(result.chunk_times) == 2


def test_an_endpoint_that_does_not_stream_is_an_error() -> None:
    result = against(not_streaming).results[0]
    assert result.status == "error"
    assert result.error is not None and result.error.startswith("endpoint did not stream")
    assert "application/json" in result.error


def test_a_stream_without_usage_counts_content_chunks_and_says_so() -> None:
    level = against(no_usage)
    result = level.results[0]
    assert result.status == "ok" and result.tokens_source == "chunks"
    assert result.output_tokens == 5 and result.input_tokens == 10  # the trace's prompt tokens
    assert result.ttft_s is not None and result.ttft_s >= 0.01  # the role-only chunk is not a token
    assert summarize(level.samples()).n_tokens_fallback == len(level.results)


def test_a_request_slower_than_its_timeout_is_a_timeout() -> None:
    plan = LevelPlan(warmup_s=0.0, window_s=0.1, min_samples=1, max_duration_s=5.0,
                     request_timeout_s=0.3)
    level = against(stalls, plan)
    result = level.results[0]
    assert result.status == "timeout" and result.error == "timed out after 0.3 s"
    assert len(result.chunk_times) == 1
    # Cut at 0.3 s (a floor), not when the server would have gone on (10 s); seconds of
    # room for a loaded machine.
    assert 0.29 <= result.e2e_s < 3 and level.wall_s < 5
