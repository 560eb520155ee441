"""What a person (or an API client) does: upload or generate a trace, start a run, cancel one.
Each checks the permission and is audited."""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.bench import traces
from fleetctl.bench.models import DEFAULT_WARMUP_S, DEFAULT_WINDOW_S, Run, Trace
from fleetctl.bench.services._shared import _trace_dir
from fleetctl.fleet.models import Pool
from migrations_plan import jobs

RESERVED_TRACE_NAMES = frozenset({"generate", "upload", "new"})


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
