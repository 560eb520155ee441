"""Worker code for one level of a run: how it loads the pool, one shard's measurement (in
the coordinating task or a `bench.shard` task), the shards' samples merged exactly, and
the level judged against the SLO."""

from __future__ import annotations

import asyncio
import math
import socket
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from fleetctl.bench import runner, stats, traces
from fleetctl.bench.models import Level, Run, Sample, ShardPart
from fleetctl.bench.services._shared import log, trace_requests
from fleetctl.fleet.models import Pool

# --- execution --------------------------------------------------------------------------------

@dataclass
class _Row:
    """A Sample row as stats.py reads it."""

    status: str
    warmup: bool
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    itl_s: list[float]
    output_tokens: int
    window_tokens: float
    schedule_lag_s: float
    tokens_source: str


@dataclass
class _Context:
    run: Run
    requests: list[traces.TraceRequest]
    slo: stats.Slo
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    cancelled: bool = False


def _plan(run: Run) -> runner.LevelPlan:
    return runner.LevelPlan(warmup_s=run.warmup_s, window_s=run.window_s,
                            min_samples=run.min_samples, ramp_s=run.ramp_s,
                            max_duration_s=run.warmup_s + max(run.window_s * 6, 60.0))


def _endpoints(pool: Pool, model_id: str) -> list[runner.Endpoint]:
    """Every endpoint of the pool, in its `base_urls` order: a level drives them all (the
    cost divides the whole pool's hourly rate by the whole pool's throughput)."""
    return [runner.Endpoint(base_url=url.rstrip("/").removesuffix("/v1"), model=model_id)
            for url in pool.base_urls]


def _streams(run: Run, pool: Pool, total: int, shard: int) -> tuple[list[int], list[float]]:
    """Shard `shard`'s streams of a level of `total` streams, and their first sends: the
    level's streams are numbered 0 … total − 1 across its client processes (shard 0 the
    first share, …) and their offsets drawn once for the whole level, seeded by run, pool
    and level, so every process staggers its share into one common ramp."""
    shares = _split(total, run.shards)
    first = sum(shares[:shard])
    ids = list(range(first, first + shares[shard]))
    offsets = runner.stagger_offsets(total, _plan(run).ramp,
                                     zlib.crc32(f"run{run.pk}-{pool.name}-c{total}".encode()))
    return ids, [offsets[i] for i in ids]


def _split(concurrency: int, shards: int) -> list[int]:
    """Streams per client process: as even as possible, none empty."""
    shards = max(1, min(shards, concurrency))
    base, extra = divmod(concurrency, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


async def _measure_shard(*, run: Run, requests: list[traces.TraceRequest], pool: Pool,
                         concurrency: int, start_at: float, speed: float | None = None,
                         shard: int = 0, shards: int = 1, total: int | None = None
                         ) -> runner.LevelResult:
    """One client process's share: `concurrency` of the level's `total` streams (default:
    all of them), or its part of a trace-timing level."""
    if speed is not None:
        return await _replay_shard(run=run, requests=requests, pool=pool, start_at=start_at,
                                   speed=speed, shard=shard, shards=shards)
    ids, offsets = _streams(run, pool, total or concurrency, shard)
    delay = start_at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    return await runner.run_level(_endpoints(pool, run.model_id), requests, _plan(run),
                                  concurrency=concurrency, streams=ids, start_offsets=offsets,
                                  request_id_prefix=f"run{run.pk}-{pool.name}-c{concurrency}")


@dataclass(frozen=True, slots=True)
class _ShardRow:
    """A trace row as one shard replays it: the row, shifted by whole trace periods."""

    prompt_tokens: int
    completion_tokens: int
    arrival_s: float
    prompt: str | None
    messages: Any
    prefix_group: str | None
    prefix_tokens: int


MAX_SHARD_ROWS = 500_000


def _trace_share(requests: list[traces.TraceRequest], shard: int, shards: int, speed: float,
                 horizon_s: float) -> tuple[list[Any], list[int], int, float]:
    """Shard `shard`'s part of a trace-timing level: request j (in arrival order) of every
    pass over the trace goes to shard j % shards. The passes are laid out here (as the
    runner would loop them, same period) so that every shard keeps the whole trace's
    clock; returns (rows, the schedule position of each row, positions per lay-out, the
    delay of the shard's first send after the common start, in seconds)."""
    n = len(requests)
    order = sorted(range(n), key=lambda i: requests[i].arrival_s)
    first = requests[order[0]].arrival_s
    span = requests[order[-1]].arrival_s - first
    period = span + span / (n - 1) if n > 1 and span > 0 else 1.0  # as runner._open_loop
    mine = range(shard, n, shards)
    passes = max(1, min(math.ceil(horizon_s * speed / period) + 1,
                        MAX_SHARD_ROWS // max(1, len(mine))))
    rows: list[Any] = []
    positions: list[int] = []
    for loop in range(passes):
        for j in mine:
            r = requests[order[j]]
            rows.append(_ShardRow(r.prompt_tokens, r.completion_tokens,
                                  r.arrival_s + loop * period, r.prompt, r.messages,
                                  r.prefix_group, r.prefix_tokens))
            positions.append(loop * n + j)
    return rows, positions, passes * n, (rows[0].arrival_s - first) / speed


async def _replay_shard(*, run: Run, requests: list[traces.TraceRequest], pool: Pool,
                        start_at: float, speed: float, shard: int, shards: int
                        ) -> runner.LevelResult:
    plan = _plan(run)
    rows, positions, per_layout, offset = _trace_share(requests, shard, shards, speed,
                                                       plan.max_duration_s)
    delay = start_at + offset - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    result = await runner.run_level(
        _endpoints(pool, run.model_id), rows, plan, speed=speed,
        request_id_prefix=f"run{run.pk}-{pool.name}-s{speed:g}-{shard}")
    for r in result.results:  # the sample index: the request's place in the whole schedule
        r.seq = (r.seq // len(rows)) * per_layout + positions[r.index]
    return result


def _save_part(level: Level, shard: int, concurrency: int, result: runner.LevelResult | None,
               error: str = "") -> None:
    rows = []
    if result is not None:
        for r in result.results:
            rows.append(Sample(
                level=level, shard=shard, index=r.seq, warmup=r.warmup,
                scheduled_s=r.scheduled_at, schedule_lag_s=r.schedule_lag_s, ttft_s=r.ttft_s,
                tpot_s=r.tpot_s, e2e_s=r.e2e_s,
                itl_s=[round(g, 6) for g in r.itl_s], input_tokens=r.input_tokens or 0,
                output_tokens=r.output_tokens, window_tokens=r.window_tokens,
                tokens_source=r.tokens_source, status=r.status, http_status=r.http_status,
                error=(r.error or "")[:2000], stream=r.stream, endpoint=r.endpoint))
    with transaction.atomic():
        Sample.objects.bulk_create(rows, batch_size=1000)
        samples = result.samples() if result is not None else None
        part = samples.parts[0] if samples is not None else None
        ShardPart.objects.create(
            level=level, shard=shard, concurrency=concurrency,
            window_s=part.window_s if part else 0, window_tokens=part.window_tokens if part else 0,
            measured_requests=part.measured_requests if part else 0,
            client_cpu_s=part.client_cpu_s if part else 0, wall_s=part.wall_s if part else 0,
            loop_lag_s=[round(x, 6) for x in (result.loop_lag_s if result else [])],
            stream_starts=[[s, round(t, 6), e] for s, t, e in result.stream_starts]
            if result else [],
            endpoints=result.endpoints if result else [],
            window_start_s=result.window_start_s if result else 0,
            error=error[:2000], worker=socket.gethostname())


def shard_execute(*, level_id: int, shard: int, concurrency: int, start_at: float) -> None:
    """One client process's share of a level (a `bench.shard` task)."""
    level = Level.objects.select_related("run__trace", "pool").get(pk=level_id)
    run = level.run
    try:
        requests = trace_requests(run.trace)
        result = asyncio.run(_measure_shard(
            run=run, requests=requests, pool=level.pool, concurrency=concurrency,
            start_at=start_at, speed=level.speed, shard=shard,
            shards=_trace_shards(run, len(requests)), total=level.concurrency))
        _save_part(level, shard, concurrency, result)
    except Exception as exc:  # recorded on the level; the coordinator decides
        log.exception("bench shard %s/%s failed", level_id, shard)
        _save_part(level, shard, concurrency, None, error=f"{type(exc).__name__}: {exc}")


def _load_shape(level: Level) -> dict[str, Any]:
    """How the level loaded the pool, for its page and export: each stream's first send and
    endpoint (fixed concurrency), when the window began, and per endpoint how many requests
    it got and the output tokens/s it gave inside the window."""
    parts = [p for p in level.parts.order_by("shard") if p.shard < 1000]
    urls: list[str] = next((list(p.endpoints) for p in parts if p.endpoints),
                           list(level.pool.base_urls))
    window = {p.shard: p.window_s for p in parts}
    rows: dict[int, dict[str, Any]] = {
        i: {"endpoint": i, "url": url, "requests": 0, "measured": 0, "ok": 0,
            "output_tokens_per_s": 0.0} for i, url in enumerate(urls)}
    counts = (Sample.objects.filter(level=level)
              .values("shard", "endpoint", "warmup", "status")
              .annotate(n=Count("id"), tokens=Sum("window_tokens")))
    for c in counts:
        row = rows.setdefault(c["endpoint"], {
            "endpoint": c["endpoint"], "url": "", "requests": 0, "measured": 0, "ok": 0,
            "output_tokens_per_s": 0.0})
        row["requests"] += c["n"]
        if not c["warmup"]:
            row["measured"] += c["n"]
            row["ok"] += c["n"] if c["status"] == "ok" else 0
        if window.get(c["shard"]):
            row["output_tokens_per_s"] += (c["tokens"] or 0.0) / window[c["shard"]]
    streams = sorted(
        ({"stream": s, "start_s": t, "endpoint": e, "shard": p.shard}
         for p in parts for s, t, e in p.stream_starts), key=lambda x: x["stream"])
    return {
        "ramp_s": level.run.ramp_s if level.run.ramp_s is not None
        else _plan(level.run).ramp if level.speed is None else 0.0,
        "warmup_s": level.run.warmup_s,
        "window_start_s": max((p.window_start_s for p in parts), default=None),
        "streams": streams,
        "endpoints": [rows[i] for i in sorted(rows)],
    }


def _merged(level: Level) -> stats.LevelSamples:
    parts = list(level.parts.order_by("shard"))
    rows = [
        _Row(status=s.status, warmup=s.warmup, ttft_s=s.ttft_s, tpot_s=s.tpot_s,
             e2e_s=s.e2e_s or 0.0, itl_s=list(s.itl_s), output_tokens=s.output_tokens,
             window_tokens=s.window_tokens, schedule_lag_s=s.schedule_lag_s,
             tokens_source=s.tokens_source)
        for s in level.samples.all().only(
            "status", "warmup", "ttft_s", "tpot_s", "e2e_s", "itl_s", "output_tokens",
            "window_tokens", "schedule_lag_s", "tokens_source").iterator(chunk_size=2000)
    ]
    return stats.LevelSamples(
        results=rows,  # type: ignore[arg-type]
        parts=[stats.ClientPart(window_s=p.window_s, window_tokens=p.window_tokens,
                                measured_requests=p.measured_requests,
                                client_cpu_s=p.client_cpu_s, wall_s=p.wall_s) for p in parts],
        loop_lag_s=[x for p in parts for x in p.loop_lag_s])


def _judge(level: Level, ctx: _Context) -> stats.Verdict:
    run = ctx.run
    errors = [p.error for p in level.parts.exclude(error="")]
    summary = stats.summarize(_merged(level))
    verdict = stats.verdict(summary, ctx.slo, min_samples=run.min_samples,
                            lag_limit_s=run.lag_limit_ms / 1000)
    if summary.n_measured and summary.n_ok == 0:
        first = next((s.error for s in level.samples.exclude(error="")[:1]), "")
        verdict = replace(verdict, reason=f"{verdict.reason}: {first}")
    level.summary = asdict(summary) | {"load_shape": _load_shape(level)} | {
        "reason": verdict.reason,
                                                "ratios": verdict.ratios,
                                                "shard_errors": errors}
    level.verdict = "error" if errors and summary.n_measured == 0 else verdict.outcome
    level.binding = verdict.binding
    level.output_tokens_per_s = summary.output_tokens_per_s
    level.ttft_p95_ms = summary.ttft_p95_s * 1000 if summary.ttft_p95_s is not None else None
    level.tpot_p95_ms = summary.tpot_p95_s * 1000 if summary.tpot_p95_s is not None else None
    level.error_rate = summary.error_rate
    rate = level.pool.node_hourly_rate
    level.hourly_rate, level.currency = rate, level.pool.currency  # what the cost is in
    if summary.output_tokens_per_s:
        level.cost_per_1m = stats.cost_per_1m(rate, summary.output_tokens_per_s)
    level.note = verdict.reason if not errors else f"{verdict.reason}; shard errors: " + \
        "; ".join(errors)
    level.finished_at = timezone.now()
    level.save()
    return verdict


def _trace_shards(run: Run, n_requests: int) -> int:
    """Client processes of a trace-timing level: each needs at least one request."""
    return max(1, min(run.shards, n_requests))
