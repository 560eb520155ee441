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

`people` holds what a person does (traces, starting and cancelling runs); `levels` and
`worker` the worker code that measures a run and records what it found; `_shared` what
both use. Import them from here: `from fleetctl.bench import services`."""

from __future__ import annotations

from fleetctl.bench.services._shared import (
    HEARTBEAT_STALE_S,
    MAX_TRACE_REQUESTS_IN_MEMORY,
    QUEUED_STALE_S,
    trace_requests,
)
from fleetctl.bench.services.levels import MAX_SHARD_ROWS, _plan, _trace_share, shard_execute
from fleetctl.bench.services.people import (
    MAX_SPEED,
    RESERVED_TRACE_NAMES,
    RUN_FIELDS,
    SPEEDS_HELP,
    run_cancel,
    run_create,
    trace_generate,
    trace_upload,
)
from fleetctl.bench.services.worker import (
    PoolResult,
    SpeedSweep,
    benchmark_evidence_data,
    run_execute,
    run_results,
    runs_reap,
)

__all__ = [
    "HEARTBEAT_STALE_S",
    "MAX_SHARD_ROWS",
    "MAX_SPEED",
    "MAX_TRACE_REQUESTS_IN_MEMORY",
    "QUEUED_STALE_S",
    "RESERVED_TRACE_NAMES",
    "RUN_FIELDS",
    "SPEEDS_HELP",
    "PoolResult",
    "SpeedSweep",
    "_plan",
    "_trace_share",
    "benchmark_evidence_data",
    "run_cancel",
    "run_create",
    "run_execute",
    "run_results",
    "runs_reap",
    "shard_execute",
    "trace_generate",
    "trace_requests",
    "trace_upload",
]
