"""Per-request exports of a run, streamed row by row (a run can hold millions of samples).

CSV columns, one row per request the client sent (warm-up requests included, flagged):

| column | meaning |
|---|---|
| run | the run's id |
| pool | the pool measured |
| concurrency | the level's concurrency (streams in flight); 0 for a trace-timing level |
| speed | trace-timing level: the trace speed factor (1 = the trace's own timing); else empty |
| attempt | the level's attempt at that concurrency (a search may measure one twice) |
| verdict | the level's verdict: pass, fail, insufficient, invalid, error |
| shard | which client process measured the request (0 … shards − 1) |
| index | sequence number within its shard (trace timing: place in the whole schedule) |
| stream | fixed concurrency: the stream that sent it (0 … concurrency − 1) |
| endpoint | which of the pool's base URLs it went to (0 = the first, in the pool's order) |
| warmup | 1 when sent during warm-up (left out of every statistic), else 0 |
| status | ok, error or timeout |
| http_status | the HTTP status the server answered (empty if none) |
| scheduled_s | when the request was due, seconds from the level's start |
| schedule_lag_s | how late the client sent it |
| ttft_s | time to the first content-bearing chunk |
| tpot_s | (E2E − TTFT) / (output tokens − 1) |
| e2e_s | request start to the last byte |
| itl_count | number of gaps between chunks |
| itl_p50_s, itl_max_s | median (nearest-rank) and largest gap between chunks |
| input_tokens, output_tokens | token counts (from the server's usage, see tokens_source) |
| window_tokens | output tokens whose chunk arrived inside the steady-state window |
| tokens_source | usage (the server's report) or chunks (counted by the client: fallback) |
| error | the error text, if any |

Times are seconds, floats; empty cells mean "not measured" (an error before the first chunk).
The JSON export holds the run, its per-pool results, its levels and the same rows with the
full list of chunk gaps (`itl_s`).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from fleetctl.bench import selectors, stats
from fleetctl.bench.models import Run, Sample
from fleetctl.core.csvcells import spreadsheet_safe

CSV_COLUMNS = [
    "run", "pool", "concurrency", "speed", "attempt", "verdict", "shard", "index", "stream",
    "endpoint", "warmup",
    "status", "http_status", "scheduled_s", "schedule_lag_s", "ttft_s", "tpot_s", "e2e_s",
    "itl_count", "itl_p50_s", "itl_max_s", "input_tokens", "output_tokens", "window_tokens",
    "tokens_source", "error",
]


def _cell(value: Any) -> Any:
    return "" if value is None else value


def sample_row(sample: Sample) -> list[Any]:
    level = sample.level
    gaps = list(sample.itl_s)
    return [
        level.run_id, level.pool.name, level.concurrency, _cell(level.speed), level.attempt,
        level.verdict,
        sample.shard, sample.index, sample.stream, sample.endpoint, int(sample.warmup),
        sample.status,
        _cell(sample.http_status), sample.scheduled_s, sample.schedule_lag_s,
        _cell(sample.ttft_s), _cell(sample.tpot_s), _cell(sample.e2e_s), len(gaps),
        _cell(stats.percentile(gaps, 50)), _cell(max(gaps, default=None)),
        sample.input_tokens, sample.output_tokens, sample.window_tokens,
        # The error text comes from the measured server: it must not run as a formula.
        sample.tokens_source, spreadsheet_safe(sample.error),
    ]


def csv_lines(run: Run) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")

    def flush() -> str:
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    writer.writerow(CSV_COLUMNS)
    yield flush()
    for n, sample in enumerate(selectors.run_samples_iter(run=run), start=1):
        writer.writerow(sample_row(sample))
        if n % 500 == 0:  # a few dozen kB per chunk, not one write per row
            yield flush()
    yield flush()


def sample_json(sample: Sample) -> dict[str, Any]:
    level = sample.level
    return {
        "pool": level.pool.name, "concurrency": level.concurrency, "speed": level.speed,
        "attempt": level.attempt,
        "verdict": level.verdict, "shard": sample.shard, "index": sample.index,
        "stream": sample.stream, "endpoint": sample.endpoint,
        "warmup": sample.warmup, "status": sample.status, "http_status": sample.http_status,
        "scheduled_s": sample.scheduled_s, "schedule_lag_s": sample.schedule_lag_s,
        "ttft_s": sample.ttft_s, "tpot_s": sample.tpot_s, "e2e_s": sample.e2e_s,
        "itl_s": sample.itl_s, "input_tokens": sample.input_tokens,
        "output_tokens": sample.output_tokens, "window_tokens": sample.window_tokens,
        "tokens_source": sample.tokens_source, "error": sample.error,
    }


def json_chunks(run: Run, head: dict[str, Any]) -> Iterator[str]:
    """`head` (the run, results, levels) then "samples": [...] one row at a time."""
    opening = json.dumps(head, default=str)
    yield opening[:-1] + ', "samples": ['
    yield from _joined(json.dumps(sample_json(s), default=str)
                       for s in selectors.run_samples_iter(run=run))
    yield "]}\n"


def _joined(items: Iterable[str], batch: int = 500) -> Iterator[str]:
    pending: list[str] = []
    first = True
    for item in items:
        pending.append(item)
        if len(pending) >= batch:
            yield ("" if first else ",") + ",".join(pending)
            first, pending = False, []
    if pending:
        yield ("" if first else ",") + ",".join(pending)
