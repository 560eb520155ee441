"""Ground truth: what the simulator actually did, per request and per scheduler step.

Benchmarks and shadow tests compare their client-side measurements with these records.
Memory is bounded: two ring buffers (requests and steps); the oldest records fall off and
are counted in `dropped`. Every record gets a cursor number (`seq`), shared by both kinds,
so a reader asks for `since=<last seq seen>` and never misses or repeats a record.

All `*_mono` times are `time.monotonic()` of the simulator process — CLOCK_MONOTONIC on
Linux, so a client on the same machine can compare them with its own `time.monotonic()`.
`*_wall` times are Unix seconds derived from the same instant.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .engine import Sequence, StepRecord

DEFAULT_REQUEST_CAPACITY = 2000
STEPS_PER_REQUEST_SLOT = 10


@dataclass
class RequestInfo:
    """What the HTTP layer knows about a request, beside the engine's Sequence."""

    request_id: str
    response_id: str
    endpoint: str
    model: str
    stream: bool
    arrival_mono: float
    wall_offset: float = field(default_factory=lambda: time.time() - time.monotonic())
    recorded: bool = False  # one record per request, whichever path ends it
    tool_call: bool = False  # the answer is a tool call: a natural end is "tool_calls"
    # A regress switch that hit this answer: "json_broken" or "truncated" (None: healthy).
    regression: str | None = None


class GroundTruth:
    def __init__(self, *, enabled: bool = False, capacity: int = DEFAULT_REQUEST_CAPACITY) -> None:
        self.enabled = enabled
        self._counter = itertools.count(1)
        self.capacity = capacity
        self.requests: deque[tuple[int, dict[str, Any]]] = deque(maxlen=capacity)
        self.steps: deque[tuple[int, StepRecord]] = deque(
            maxlen=capacity * STEPS_PER_REQUEST_SLOT
        )
        self.dropped = 0

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        self.requests = deque(self.requests, maxlen=capacity)
        self.steps = deque(self.steps, maxlen=capacity * STEPS_PER_REQUEST_SLOT)

    def clear(self) -> None:
        self.requests.clear()
        self.steps.clear()
        self.dropped = 0

    def add_step(self, step: StepRecord) -> None:
        if len(self.steps) == self.steps.maxlen:
            self.dropped += 1
        self.steps.append((next(self._counter), step))

    def add_request(self, record: dict[str, Any]) -> None:
        if len(self.requests) == self.requests.maxlen:
            self.dropped += 1
        self.requests.append((next(self._counter), record))

    def read(
        self, since: int = 0, limit: int | None = None, kind: str = "all"
    ) -> dict[str, Any]:
        """Records after cursor `since`, oldest first, at most `limit` of them in all;
        `kind` is "all", "requests" or "steps". `next_since` continues where this ended."""
        streams: list[Iterator[tuple[int, str, Any]]] = []
        if kind in ("all", "requests"):
            streams.append((n, "request", r) for n, r in self.requests if n > since)
        if kind in ("all", "steps"):
            streams.append((n, "step", s) for n, s in self.steps if n > since)
        merged = heapq.merge(*streams, key=lambda record: record[0])
        picked = list(merged if limit is None else itertools.islice(merged, limit))
        return {
            "enabled": self.enabled,
            "capacity": self.capacity,
            "dropped": self.dropped,
            "next_since": picked[-1][0] if picked else since,
            "requests": [dict(r, seq=n) for n, what, r in picked if what == "request"],
            "steps": [_step_dict(n, s) for n, what, s in picked if what == "step"],
        }


def _step_dict(n: int, step: StepRecord) -> dict[str, Any]:
    return {
        "seq": n,
        "intended_mono": step.intended,
        "actual_mono": step.actual,
        "lag_s": step.actual - step.intended,
        "batch": step.batch,
        "prefill_tokens": step.prefill_tokens,
        "step_s": step.step_s,
        "flush_s": step.flush_s,
    }


def request_record(
    info: RequestInfo, seq: Sequence | None, *, status: int, error: str | None = None
) -> dict[str, Any]:
    """One finished (or rejected) request as a JSON-ready dict."""
    record: dict[str, Any] = {
        "request_id": info.request_id,
        "response_id": info.response_id,
        "endpoint": info.endpoint,
        "model": info.model,
        "stream": info.stream,
        "status": status,
        "error": error,
        "arrival_mono": info.arrival_mono,
        "arrival_wall": info.arrival_mono + info.wall_offset,
    }
    if seq is not None:
        record.update(_sequence_fields(seq, info))
    return record


def _sequence_fields(seq: Sequence, info: RequestInfo) -> dict[str, Any]:
    times = seq.token_times or []
    first = times[0] if times else None
    admitted = seq.admitted
    return {
        "enqueued_mono": seq.enqueued,
        "admitted_mono": admitted,
        "queue_wait_s": None if admitted is None else admitted - seq.enqueued,
        "prefill_start_mono": seq.prefill_start,
        "prefill_end_mono": seq.prefill_end,
        "first_token_mono": first,
        "ttft_s": None if first is None else first - info.arrival_mono,
        "finished_mono": seq.finished_at,
        "token_times_mono": times,
        "token_times_wall": [t + info.wall_offset for t in times],
        # Streaming only: when each token's chunk went to the socket (step time + its turn).
        "token_written_mono": seq.written_times or [],
        "prompt_tokens": seq.params.prompt_tokens,
        "cached_tokens": seq.cached_tokens,
        "completion_tokens": seq.generated,
        # What the client was told: a tool call that ends by itself finishes with "tool_calls"
        # (the engine and its vLLM metrics say "stop", as vLLM's do).
        "finish_reason": "tool_calls" if info.tool_call and seq.finish_reason == "stop"
        else seq.finish_reason,
        "preemptions": seq.preemptions,
        "diverged_at": None if seq.stream.divergence is None else seq.stream.divergence.position,
        # Replica noise: the position this answer flipped at (a near-tie), if it did.
        "flipped_at": seq.stream.flipped_at,
        "regression": info.regression,
    }
