"""Worker code for a whole run: sweep each pool's levels (or trace speeds), record what the
run found (each pool's cost and its benchmark evidence), and reap runs whose worker died."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.bench import stats, sweep
from fleetctl.bench.models import Level, Run, ShardPart
from fleetctl.bench.services._shared import HEARTBEAT_STALE_S, QUEUED_STALE_S, log, trace_requests
from fleetctl.bench.services.levels import (
    _Context,
    _judge,
    _measure_shard,
    _save_part,
    _split,
    _trace_shards,
)
from fleetctl.fleet.models import Pool
from migrations_plan import jobs


async def _measure(ctx: _Context, pool: Pool, concurrency: int,
                   speed: float | None = None) -> stats.Verdict:
    """One level of one pool: every shard's part stored, then judged on the merged samples.
    `speed` set: a trace-timing level (concurrency 0), every shard at that speed."""
    async with ctx.lock:  # pools take turns (FIFO): drift hits all alike
        run = ctx.run
        doing = (f"{pool.name} at trace speed {speed:g}×" if speed is not None
                 else f"{pool.name} at concurrency {concurrency}")
        if not await sync_to_async(_heartbeat)(run, doing):  # cancelled (or reaped)
            ctx.cancelled = True
            return stats.Verdict("invalid", "cancelled", None, {}, "run cancelled")
        level = await sync_to_async(_level_start)(run, pool, concurrency, speed)
        n_shards = _trace_shards(run, len(ctx.requests))
        shares = (_split(concurrency, run.shards) if speed is None
                  else [0] * n_shards)
        start_at = time.time() + (1.5 if len(shares) > 1 else 0.0)
        if len(shares) > 1:
            from fleetctl.bench.tasks import shard as shard_task

            for index, share in enumerate(shares[1:], start=1):
                await sync_to_async(shard_task.delay)(level.pk, index, share, start_at)
        try:
            result = await _measure_shard(run=run, requests=ctx.requests, pool=pool,
                                          concurrency=shares[0], start_at=start_at,
                                          speed=speed, shard=0, shards=len(shares),
                                          total=concurrency)
            await sync_to_async(_save_part)(level, 0, shares[0], result)
        except Exception as exc:
            await sync_to_async(_save_part)(level, 0, shares[0], None,
                                            f"{type(exc).__name__}: {exc}")
        deadline = time.monotonic() + run.warmup_s + run.window_s * 6 + 120
        while (reported := await sync_to_async(_parts_reported)(level)) < len(shares):
            if time.monotonic() > deadline:
                await sync_to_async(_parts_missing)(level, len(shares) - reported)
                break
            await asyncio.sleep(0.2)
        return await sync_to_async(_judge)(level, ctx)


def _level_start(run: Run, pool: Pool, concurrency: int, speed: float | None = None) -> Level:
    attempt = Level.objects.filter(run=run, pool=pool, concurrency=concurrency,
                                   speed=speed).count() + 1
    return Level.objects.create(run=run, pool=pool, concurrency=concurrency, speed=speed,
                                attempt=attempt)


def _parts_reported(level: Level) -> int:
    return ShardPart.objects.filter(level=level).count()


def _parts_missing(level: Level, missing: int) -> None:
    ShardPart.objects.bulk_create([
        ShardPart(level=level, shard=1000 + i, concurrency=0,
                  error="a shard never reported (is a worker consuming the bench queue?)")
        for i in range(missing)])


def _heartbeat(run: Run, doing: str) -> bool:
    """Beat (on an executor thread): False once the run is no longer running."""
    try:
        return jobs.heartbeat(run, doing)
    finally:
        close_old_connections()


@dataclass
class SpeedSweep:
    """A trace-timing pool's outcome: the highest passing speed (what `_record` reads)."""

    best: float | None
    client_bound: bool
    note: str


async def _sweep_speeds(ctx: _Context, pool: Pool) -> SpeedSweep:
    """The speeds in ascending order, as an explicit level list (sweep.run_levels over their
    ranks): stop after an invalid one, the best is the highest that passed."""
    speeds = sorted(float(x) for x in ctx.run.speeds)

    async def measure(rank: int) -> stats.Verdict:
        return await _measure(ctx, pool, 0, speed=speeds[rank - 1])

    result = await sweep.run_levels(measure, range(1, len(speeds) + 1))

    def at(rank: int | None) -> float | None:
        return None if rank is None else speeds[rank - 1]

    best = at(result.best)
    parts = ["no trace speed passed" if best is None
             else f"highest passing trace speed {best:g}×"]
    first_fail = min((s.concurrency for s in result.steps
                      if s.outcome in ("fail", "insufficient")), default=None)
    if first_fail is not None:
        parts.append(f"lowest failing {at(first_fail):g}×")
    if result.client_bound:
        parts.append("client was the bottleneck at "
                     f"{', '.join(f'{at(r):g}×' for r in result.invalid_levels)}: "
                     "add client processes")
    if result.skipped:
        parts.append(f"not measured: {', '.join(f'{at(r):g}×' for r in result.skipped)}")
    return SpeedSweep(best=best, client_bound=result.client_bound, note="; ".join(parts))


async def _sweep_pool(ctx: _Context, pool: Pool) -> Any:
    async def measure(concurrency: int) -> stats.Verdict:
        return await _measure(ctx, pool, concurrency)

    if ctx.run.timing == Run.Timing.TRACE:
        return await _sweep_speeds(ctx, pool)
    if ctx.run.mode == Run.Mode.LEVELS:
        return await sweep.run_levels(measure, ctx.run.levels)
    return await sweep.search(measure, max_concurrency=ctx.run.max_concurrency)


async def _execute(ctx: _Context, pools: list[Pool]) -> dict[str, Any]:
    results = await asyncio.gather(*(_sweep_pool(ctx, pool) for pool in pools))
    return dict(zip([p.name for p in pools], results, strict=True))


def run_execute(*, run_id: int) -> Run:
    """The coordinator (a `bench.run` task): sweep every pool, record the outcome."""
    taken = jobs.take(Run, run_id, worker=socket.gethostname())
    run = Run.objects.select_related("trace").get(pk=run_id)
    if not taken:
        return run  # already taken (a redelivered task) or cancelled
    pools = list(run.pools.order_by("name"))
    try:
        ctx = _Context(run=run, requests=trace_requests(run.trace),
                       slo=stats.Slo(ttft_p95_s=run.slo_ttft_p95_ms / 1000,
                                     tpot_p95_s=run.slo_tpot_p95_ms / 1000,
                                     error_rate=run.slo_error_rate))
        outcome = asyncio.run(_execute(ctx, pools))
    except Exception as exc:
        log.exception("benchmark run %s failed", run_id)
        jobs.fail(run, f"{type(exc).__name__}: {exc}")
        return Run.objects.get(pk=run_id)
    return _record(run, pools, outcome, cancelled=ctx.cancelled)


@dataclass
class PoolResult:
    pool: Pool
    best: Level | None
    levels: list[Level]
    client_bound: bool
    note: str


def run_results(run: Run) -> list[PoolResult]:
    """Per pool: its highest passing level (its latest attempt at that concurrency)."""
    out = []
    progress = run.progress or {}
    trace_timing = run.timing == Run.Timing.TRACE
    for pool in run.pools.order_by("name"):
        levels = list(Level.objects.filter(run=run, pool=pool)
                      .order_by("concurrency", "speed", "attempt"))
        best_c = (progress.get("best") or {}).get(pool.name)
        best = next((lv for lv in reversed(levels)
                     if (lv.speed == best_c if trace_timing else lv.concurrency == best_c)
                     and best_c is not None and lv.verdict == Level.Verdict.PASS), None)
        out.append(PoolResult(pool=pool, best=best, levels=levels,
                              client_bound=bool((progress.get("client_bound") or {})
                                                .get(pool.name)),
                              note=(progress.get("notes") or {}).get(pool.name, "")))
    return out


def _record(run: Run, pools: list[Pool], outcome: dict[str, Any], *, cancelled: bool) -> Run:
    """The sweep's outcome on the run; unless it was cancelled meanwhile, the run finished
    (partial when a level could not run) with each pool's cost and benchmark evidence."""
    progress = {"best": {name: result.best for name, result in outcome.items()},
                "client_bound": {name: result.client_bound for name, result in outcome.items()},
                "notes": {name: result.note for name, result in outcome.items()},
                "doing": "done"}
    if cancelled:  # it keeps the status that stopped it; what was measured is shown
        Run.objects.filter(pk=run.pk).update(progress=progress, heartbeat_at=timezone.now())
        return Run.objects.get(pk=run.pk)
    errored = Level.objects.filter(run=run, verdict=Level.Verdict.ERROR).exists()
    return jobs.finish(run, actor=Actor.for_system("benchmark"), action="bench.run.finish",
                       status=Run.Status.PARTIAL if errored else Run.Status.COMPLETE,
                       fields={"progress": progress}, evidence=_record_evidence,
                       after={"best": progress["best"]})


def _record_evidence(run: Run) -> dict[str, Any]:
    """Each pool's cost (from its highest passing level) and its `benchmark` evidence."""
    from fleetctl.fleet.services import pool_set_cost
    from migrations_plan.services import evidence_record

    system = Actor.for_system("benchmark")
    now = run.finished_at or timezone.now()
    results = run_results(run)
    for result in results:
        pool, best = result.pool, result.best
        if best is not None and best.cost_per_1m is not None:
            pool_set_cost(actor=system, pool=pool, cost_per_1m=best.cost_per_1m,
                          measured_at=now, hourly_rate=best.hourly_rate,
                          currency=best.currency, source=f"run #{run.pk}")
            load = (f"trace speed {best.speed:g}×" if best.speed is not None
                    else f"concurrency {best.concurrency}")
            summary = (f"highest SLO-passing {load}: "
                       f"{best.output_tokens_per_s:,.0f} output tok/s, "
                       f"{best.cost_per_1m} {best.currency or pool.currency} per 1M "
                       f"(run {run.pk})")
            verdict = "pass"
        else:
            summary = f"no level met the SLO (run {run.pk})"
            verdict = "fail"
        evidence_record(
            actor=system, pool=pool, kind="benchmark", verdict=verdict, summary=summary,
            model_id=run.model_id, url=f"/bench/runs/{run.pk}/",
            source=f"benchmark run {run.pk}",
            data=benchmark_evidence_data(run, result, [r.pool.name for r in results],
                                         measured_at=now))
    return {}


def benchmark_evidence_data(run: Run, result: PoolResult, pools: list[str], *,
                            measured_at: Any) -> dict[str, Any]:
    """What a run's benchmark evidence about one pool says (the kind's data schema in
    evidence.py describes it): the best level and its cost, and what makes two runs comparable —
    the trace (by content), the SLO, the timing and window, the pools measured together — the
    hourly rate and currency the cost was computed with, and every counted level's
    latencies."""
    best = result.best
    last: dict[tuple[int, float | None], Level] = {}
    for level in result.levels:  # ordered by load then attempt: the latest attempt wins
        if level.verdict in (Level.Verdict.PASS, Level.Verdict.FAIL):
            last[(level.concurrency, level.speed)] = level
    rate = best.hourly_rate if best is not None and best.hourly_rate is not None else None
    return {
        "run": run.pk, "timing": run.timing,
        "best_concurrency": best.concurrency if best and best.speed is None else None,
        "best_speed": best.speed if best else None,
        "output_tokens_per_s": best.output_tokens_per_s if best else None,
        "cost_per_1m": str(best.cost_per_1m) if best and best.cost_per_1m is not None
        else None,
        "hourly_rate": str(rate if rate is not None else result.pool.node_hourly_rate),
        "currency": (best.currency if best is not None and best.currency
                     else result.pool.currency),
        "measured_on": measured_at.date().isoformat(),
        "binding": best.binding if best else None,
        "slo": {"ttft_p95_ms": run.slo_ttft_p95_ms, "tpot_p95_ms": run.slo_tpot_p95_ms,
                "error_rate": run.slo_error_rate},
        "window_s": run.window_s, "warmup_s": run.warmup_s,
        "client_bound": result.client_bound, "trace": run.trace.name,
        "trace_sha256": run.trace.sha256, "pools": sorted(pools),
        "endpoints": len(result.pool.base_urls),
        "levels": [{"concurrency": lv.concurrency if lv.speed is None else None,
                    "speed": lv.speed, "verdict": lv.verdict,
                    "ttft_p95_ms": lv.ttft_p95_ms, "tpot_p95_ms": lv.tpot_p95_ms,
                    "output_tokens_per_s": lv.output_tokens_per_s}
                   for _, lv in sorted(last.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0))],
    }


def _interrupted(run: Run) -> None:
    Level.objects.filter(run=run, verdict=Level.Verdict.RUNNING).update(
        verdict=Level.Verdict.ERROR, note="interrupted: the worker stopped")


def runs_reap(*, stale_after_s: float = HEARTBEAT_STALE_S) -> int:
    """Beat: a run whose coordinator stopped beating (its worker died) is failed, not left
    "running" — the levels it measured stay, labelled — and so is one no worker took
    (policy FAIL: a benchmark is not resumed half-way, its levels would not interleave)."""
    return jobs.reap(Run, policy=jobs.Reap.FAIL, stale_after_s=stale_after_s,
                     queued_after_s=QUEUED_STALE_S, queue="bench",
                     kept="the levels measured so far are kept", on_failed=_interrupted)
