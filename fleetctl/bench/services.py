"""Writes for benchmarks: store traces, start runs, execute them, record what they found.

A run replays one trace against one or more pools. Each pool's concurrency levels are
measured in turn with the other pools' (an asyncio lock hands the client out in FIFO order),
so machine drift hits every pool alike. A level split over several client processes
(`shards`) runs shard 0 in the coordinating task and the others as `bench.shard` tasks on the
`bench` queue — on any machine with a worker for that queue — all starting at one wall-clock
instant; their raw samples are merged exactly (never percentiles of percentiles).

A run's `timing` says how a level loads the pool. "concurrency" (the default): N streams,
closed loop, swept over a list of levels or searched. "trace": open loop at the trace's own
arrival times divided by a speed factor (1 = as recorded, 2 = twice as fast), one level per
speed in `run.speeds`, ascending (stopping after an invalid one, as for concurrency levels).
A trace-timing level split over shards gives request i (in arrival order) to shard
i % shards; every shard replays its subset at the same speed from the same start instant, so
together they send exactly the trace's schedule and the merged samples are exact (a sample's
`index` is the request's position in the replayed schedule: no index appears twice). Such a
level is stored with `concurrency = 0` and `speed` set.

When a run ends, each pool's highest SLO-passing level gives its cost per 1M output tokens
(hourly rate / tokens per second × 1e6 / 3600), which becomes the pool's derived cost field,
and an `Evidence` row of kind "benchmark" for migration plans' gates. For trace timing the
"highest level" is the highest trace speed that meets the SLO, and the cost is at its output
tokens/s; the evidence then carries `timing: "trace"` and `best_speed` (`best_concurrency`
stays null, so concurrency rules say it is not the measurement they need).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import socket
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import close_old_connections, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.bench import runner, stats, sweep, traces
from fleetctl.bench.models import (
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    Level,
    Run,
    Sample,
    ShardPart,
    Trace,
)
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool
from migrations_plan import jobs

log = logging.getLogger("fleetctl.bench")
MAX_TRACE_REQUESTS_IN_MEMORY = 1_000_000
HEARTBEAT_STALE_S = 120
QUEUED_STALE_S = 900
RESERVED_TRACE_NAMES = frozenset({"generate", "upload", "new"})


# --- traces -----------------------------------------------------------------------------------

def _trace_dir() -> Path:
    folder = Path(settings.DATA_DIR) / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _store(*, actor: Actor, name: str, description: str, source: str,
           requests: Iterable[traces.TraceRequest], generator: dict[str, Any] | None = None
           ) -> Trace:
    """Stream the requests into a normalised fleetctl JSONL file (hashing and summarising on
    the way), then record it. Nothing is kept if any line is bad."""
    trace = Trace(name=name, description=description, source=source, path="-", sha256="-",
                  requests=0, duration_s=0, created_by=actor.label, generator=generator or {})
    trace.full_clean(exclude=["path", "sha256"])
    if name in RESERVED_TRACE_NAMES:
        raise ValidationError({"name": [f"{name!r} is reserved (a dashboard path); choose "
                                        f"another name."]})
    if Trace.objects.filter(name=name).exists():
        raise ValidationError({"name": [f"A trace named {name!r} exists; choose another name."]})
    folder = _trace_dir()
    summariser = traces.TraceSummariser()
    handle, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
    digest = hashlib.sha256()

    class _Hashing:
        def __init__(self, raw: IO[bytes]) -> None:
            self.raw = raw

        def write(self, data: str | bytes) -> int:
            chunk = data.encode() if isinstance(data, str) else data
            digest.update(chunk)
            return self.raw.write(chunk)

    def counted() -> Iterator[traces.TraceRequest]:
        for request in requests:
            summariser.add(request)
            yield request

    try:
        with os.fdopen(handle, "wb") as raw:
            traces.write_jsonl(counted(), _Hashing(raw))  # type: ignore[arg-type]
        summary = summariser.result()
        if summary.request_count == 0:
            raise traces.TraceError([(0, "the trace has no requests")])
        final = folder / f"{digest.hexdigest()}.jsonl"
        os.replace(tmp, final)
    except traces.TraceError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ValidationError({"file": _trace_errors(exc)}) from exc
    except (TypeError, ValueError) as exc:  # a generator refusing its parameters
        Path(tmp).unlink(missing_ok=True)
        raise ValidationError({"generator": [str(exc)]}) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    trace.path = final.name
    trace.sha256 = digest.hexdigest()
    trace.requests = summary.request_count
    trace.duration_s = summary.duration_s
    trace.summary = asdict(summary)
    with transaction.atomic():
        trace.save()
        audit_record(actor=actor, action="trace.create", target=trace,
                     after={"source": source, "requests": trace.requests,
                            "sha256": trace.sha256})
    return trace


def trace_upload(*, actor: Actor, name: str, fileobj: IO[bytes], description: str = "",
                 source: str = "auto") -> Trace:
    """Validate and store an uploaded trace (fleetctl JSONL, Mooncake JSONL or Azure CSV,
    detected from the first line unless `source` says), streamed line by line; every error
    names its line and nothing is kept."""
    actor.require(roles.JOBS, action="trace.create", target="bench.trace")
    if source != "auto" and source not in traces.PARSERS:
        raise ValidationError({"source": [f"Unknown trace format {source!r}; formats: "
                                          f"{', '.join(traces.PARSERS)} (or auto)."]})
    try:
        stream = traces.parse_trace(fileobj, trace_format=None if source == "auto"
                                    else source)  # type: ignore[arg-type]
    except traces.TraceError as exc:
        raise ValidationError({"file": _trace_errors(exc)}) from exc
    return _store(actor=actor, name=name, description=description,
                  source=stream.format,
                  requests=stream)


def _trace_errors(exc: traces.TraceError) -> list[str]:
    return [f"line {line}: {message}" if line else message for line, message in exc.errors]


def _dist(spec: Any, what: str) -> traces.Dist:
    if isinstance(spec, int) and not isinstance(spec, bool):
        return traces.Dist.constant(spec)
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ValueError(f"{what}: give a number or {{\"kind\": \"constant|uniform|lognormal|"
                         f"empirical\", …}}")
    params = {k: v for k, v in spec.items() if k != "kind"}
    maker = {"constant": traces.Dist.constant, "uniform": traces.Dist.uniform,
             "lognormal": traces.Dist.lognormal, "empirical": traces.Dist.empirical}.get(
        spec["kind"])
    if maker is None:
        raise ValueError(f"{what}: unknown kind {spec['kind']!r}")
    return maker(**params)  # type: ignore[operator]


def _arrival(spec: Any) -> traces.Arrival:
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ValueError('arrival: give {"kind": "constant|poisson|bursty|on_off", …}')
    params = {k: v for k, v in spec.items() if k != "kind"}
    maker = {"constant": traces.Arrival.constant, "poisson": traces.Arrival.poisson,
             "bursty": traces.Arrival.bursty, "on_off": traces.Arrival.on_off}.get(spec["kind"])
    if maker is None:
        raise ValueError(f"arrival: unknown kind {spec['kind']!r}")
    return maker(**params)  # type: ignore[operator]


def trace_generate(*, actor: Actor, name: str, description: str = "", n: int = 1000,
                   seed: int = 0, prompt_tokens: Any = 512, completion_tokens: Any = 128,
                   arrival: Any = None, shared_prefix_groups: int = 0,
                   shared_prefix_tokens: int = 0, latency_class: str | None = None) -> Trace:
    """A synthetic trace: token-length distributions, shared system prompts, Poisson,
    bursty or on/off arrivals (TRACES.md)."""
    actor.require(roles.JOBS, action="trace.create", target="bench.trace")
    spec = {"n": n, "seed": seed, "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "arrival": arrival or {"kind": "poisson", "rate": 10.0},
            "shared_prefix_groups": shared_prefix_groups,
            "shared_prefix_tokens": shared_prefix_tokens, "latency_class": latency_class}
    try:
        requests = traces.generate(
            n=n, seed=seed, prompt_tokens=_dist(prompt_tokens, "prompt_tokens"),
            completion_tokens=_dist(completion_tokens, "completion_tokens"),
            arrival=_arrival(spec["arrival"]), shared_prefix_groups=shared_prefix_groups,
            shared_prefix_tokens=shared_prefix_tokens, latency_class=latency_class)
    except (TypeError, ValueError) as exc:
        raise ValidationError({"generator": [str(exc)]}) from exc
    return _store(actor=actor, name=name, description=description, source="synthetic",
                  requests=requests, generator=spec)


def trace_requests(trace: Trace) -> list[traces.TraceRequest]:
    path = _trace_dir() / trace.path
    if not path.exists():
        raise ConflictError(f"The file of trace {trace.name} is missing on this machine "
                            f"({trace.path}); upload it again.")
    with path.open("rb") as fp:
        return list(traces.parse_jsonl(fp, max_requests=MAX_TRACE_REQUESTS_IN_MEMORY))


# --- runs -------------------------------------------------------------------------------------

MAX_SPEED = 1000.0
SPEEDS_HELP = ("Give trace speeds as a list of positive numbers up to 1000, e.g. [0.5, 1, 2, 4] "
               "(1 = the trace's own arrival times, 2 = twice as fast).")
RUN_FIELDS = ["name", "trace", "model_id", "mode", "levels", "timing", "speeds",
              "max_concurrency",
              "slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_error_rate", "warmup_s", "window_s",
              "ramp_s", "min_samples", "shards", "lag_limit_ms"]


def _load(*, timing: str, mode: str, levels: list[int], speeds: list[float],
          max_concurrency: int, ramp_s: float | None, warmup_s: float
          ) -> tuple[str, list[int], list[float]]:
    """How the run loads each pool, checked: (mode, levels, speeds) as stored."""
    if timing not in Run.Timing.values:
        raise ValidationError({"timing": [f"Unknown timing {timing!r}; choose "
                                          f"{' or '.join(Run.Timing.values)}."]})
    if timing == Run.Timing.TRACE:
        if not speeds or any(not isinstance(x, int | float) or isinstance(x, bool)
                             or not math.isfinite(x) or not 0 < x <= MAX_SPEED
                             for x in speeds):
            raise ValidationError({"speeds": [SPEEDS_HELP]})
        speeds = sorted({float(x) for x in speeds})
        mode, levels = Run.Mode.LEVELS, []  # the speeds are the explicit list
    elif speeds:
        raise ValidationError({"speeds": ["Speeds are for timing=trace; a concurrency run "
                                          "takes levels or a search."]})
    if timing == Run.Timing.CONCURRENCY and mode == Run.Mode.LEVELS:
        if not levels or any(not isinstance(c, int) or isinstance(c, bool) or c < 1
                             for c in levels):
            raise ValidationError({"levels": ["Give concurrency levels as positive integers, "
                                              "e.g. [1, 4, 16, 64]."]})
        if max(levels) > max_concurrency:
            raise ValidationError({"levels": [f"Levels go up to max_concurrency "
                                              f"({max_concurrency})."]})
    if ramp_s is not None and timing == Run.Timing.TRACE:
        raise ValidationError({"ramp_s": ["A ramp staggers fixed-concurrency streams; trace "
                                          "timing sends at the trace's own times. Leave it "
                                          "out."]})
    if ramp_s is not None and (isinstance(ramp_s, bool) or not isinstance(ramp_s, int | float)
                               or not math.isfinite(ramp_s) or ramp_s < 0):
        raise ValidationError({"ramp_s": ["Give the ramp in seconds, a number from 0 up to the "
                                          "warm-up, or leave it out (half the warm-up)."]})
    if ramp_s is not None and isinstance(warmup_s, int | float) and ramp_s > warmup_s:
        raise ValidationError({"ramp_s": [f"The ramp ({ramp_s:g} s) must fit in the warm-up "
                                          f"({warmup_s:g} s): the window starts once every "
                                          f"stream runs. Lower ramp_s or raise warmup_s."]})
    return mode, levels, speeds


def run_create(*, actor: Actor, trace: Trace, pools: list[Pool], model_id: str,
               slo_ttft_p95_ms: float, slo_tpot_p95_ms: float, slo_error_rate: float,
               mode: str = Run.Mode.SEARCH, levels: list[int] | None = None,
               max_concurrency: int = 256, warmup_s: float = DEFAULT_WARMUP_S,
               window_s: float = DEFAULT_WINDOW_S, ramp_s: float | None = None,
               min_samples: int = 30, shards: int = 1, lag_limit_ms: float = 25.0,
               name: str = "", timing: str = Run.Timing.CONCURRENCY,
               speeds: list[float] | None = None) -> Run:
    """Queue a benchmark of `pools` (no plan: its evidence is about the pools). Every pool
    must serve the model; nothing is stored when anything is refused."""
    actor.require(roles.JOBS, action="bench.run.create", target="bench.run")
    if not pools:
        raise ValidationError({"pools": ["Name at least one pool."]})
    missing = sorted(p.name for p in pools if model_id not in jobs.models_served(p))
    if missing:
        raise ValidationError({"pools": [f"{', '.join(missing)} do(es) not serve {model_id}."]})
    mode, levels, speeds = _load(timing=timing, mode=mode, levels=list(levels or []),
                                 speeds=list(speeds or []), max_concurrency=max_concurrency,
                                 ramp_s=ramp_s, warmup_s=warmup_s)
    run = Run(name=name, trace=trace, model_id=model_id, mode=mode, levels=sorted(set(levels)),
              timing=timing, speeds=speeds, ramp_s=ramp_s,
              max_concurrency=max_concurrency, slo_ttft_p95_ms=slo_ttft_p95_ms,
              slo_tpot_p95_ms=slo_tpot_p95_ms, slo_error_rate=slo_error_rate,
              warmup_s=warmup_s, window_s=window_s, min_samples=min_samples, shards=shards,
              lag_limit_ms=lag_limit_ms, created_by=actor.label)
    run.full_clean()
    with transaction.atomic():
        run.save()
        run.pools.set(pools)
        audit_record(actor=actor, action="bench.run.create", target=run,
                     after={"trace": trace.name, "pools": [p.name for p in pools],
                            "mode": mode, "levels": run.levels, "timing": timing,
                            "speeds": speeds})
        from fleetctl.bench.tasks import run_execute as task

        transaction.on_commit(lambda: task.delay(run.pk))
    return run


def run_cancel(*, actor: Actor, run: Run) -> Run:
    return jobs.cancel(actor, run, action="bench.run.cancel", noun="Run")


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
    rules.py describes it): the best level and its cost, and what makes two runs comparable —
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
