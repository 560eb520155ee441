"""A shadow run's pairs as CSV or JSON: metrics only, never prompt or answer text (a run that
stores content shows it on its page and under …/pairs/, within its retention; an export is a
file that outlives both). Streamed: a run can hold hundreds of thousands of pairs.

CSV columns, one row per pair (empty cell: not measured for this pair):

| column | meaning |
|---|---|
| run, pair | the run's and the pair's id |
| source | mirror or replay |
| received_at | when the sampled request arrived (ISO 8601, UTC) |
| greedy | 1 when the request asked temperature 0 (text compared), else 0 |
| model, stream, temperature, max_tokens, response_format | the request's parameters |
| candidate_error | 1 when the candidate answered an error |
| divergence_score | normalised edit distance primary→candidate (1.0 for an error mismatch) |
| noise_diverged, signal_diverged | primary vs secondary, primary vs candidate diverged |
| noise_<m>, signal_<m> | per comparison (see below) |
| <side>_<f> | per side: primary_, secondary_, candidate_ + each side field (see below) |

Comparison fields <m>: finish_mismatch, error_mismatch, validity_mismatch, refusal_mismatch,
near_tie, hard_flip, exact_match (0/1), first_divergence (token index), edit_distance,
length_ratio. Side fields <f>: endpoint, status (HTTP), finish, prompt_tokens,
completion_tokens, ttft_ms, tpot_ms, latency_ms, error_text.

Text cells a spreadsheet would run as a formula (an error a pool sent back) start with a quote
(fleetctl/core/csvcells.py). The JSON export holds the run and the same pairs with their full
`params`, `sides`, `noise` and `signal` objects.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from fleetctl.core.csvcells import spreadsheet_safe
from fleetctl.shadow import selectors
from fleetctl.shadow.models import ShadowPair, ShadowRun

COMPARED = ("finish_mismatch", "error_mismatch", "validity_mismatch", "refusal_mismatch",
            "near_tie", "hard_flip", "exact_match", "first_divergence", "edit_distance",
            "length_ratio")
SIDES = ("primary", "secondary", "candidate")
SIDE_FIELDS = ("endpoint", "status", "finish", "prompt_tokens", "completion_tokens", "ttft_ms",
               "tpot_ms", "latency_ms", "error")
# The side's error text: "<side>_error_text", since "candidate_error" is the pair's 0/1 flag.
SIDE_COLUMNS = {"error": "error_text"}
PARAMS = ("model", "stream", "temperature", "max_tokens", "response_format")
CSV_COLUMNS = [
    "run", "pair", "source", "received_at", "greedy", *PARAMS, "candidate_error",
    "divergence_score", "noise_diverged", "signal_diverged",
    *(f"{which}_{m}" for which in ("noise", "signal") for m in COMPARED),
    *(f"{side}_{SIDE_COLUMNS.get(f, f)}" for side in SIDES for f in SIDE_FIELDS),
]
T = TypeVar("T")
BATCH = 500  # rows per streamed chunk: tens of kB, not one write per row


# Cells the csv module writes as they are (None as an empty cell): most of a row, so the
# per-cell conversion below runs only for text, booleans and objects.
PLAIN = frozenset({int, float, type(None)})


def _cell(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return spreadsheet_safe(value)


def pair_row(pair: ShadowPair) -> list[Any]:
    params = pair.params or {}
    sides = pair.sides or {}
    row: list[Any] = [pair.run_id, pair.pk, pair.source, pair.received_at.isoformat(),
                      pair.greedy, *(params.get(p) for p in PARAMS), pair.candidate_error,
                      pair.divergence_score, pair.noise_diverged, pair.signal_diverged]
    row += [(getattr(pair, which) or {}).get(m) for which in ("noise", "signal")
            for m in COMPARED]
    row += [(sides.get(side) or {}).get(f) for side in SIDES for f in SIDE_FIELDS]
    return [value if type(value) in PLAIN else _cell(value) for value in row]


def pair_json(pair: ShadowPair) -> dict[str, Any]:
    return {"id": pair.pk, "source": pair.source, "received_at": pair.received_at,
            "completed_at": pair.completed_at, "request_hash": pair.request_hash,
            "greedy": pair.greedy, "params": pair.params, "sides": pair.sides,
            "noise": pair.noise, "signal": pair.signal, "noise_diverged": pair.noise_diverged,
            "signal_diverged": pair.signal_diverged, "candidate_error": pair.candidate_error,
            "divergence_score": pair.divergence_score}


def _batches(items: Iterable[T]) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def csv_lines(run: ShadowRun) -> Iterator[str]:
    """The header, then a chunk of rows per batch of pairs."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    for pairs in _batches(selectors.pairs_for_export(run)):
        buffer.seek(0)
        buffer.truncate()
        writer.writerows(pair_row(pair) for pair in pairs)
        yield buffer.getvalue()


def json_chunks(run: ShadowRun, head: dict[str, Any]) -> Iterator[str]:
    """{"run": head, "pairs": [...]}, a batch of pairs per chunk."""
    opening = json.dumps({"run": head}, default=str)
    yield opening[:-1] + ', "pairs": ['
    rows = (json.dumps(pair_json(pair), default=str) for pair in selectors.pairs_for_export(run))
    for n, batch in enumerate(_batches(rows)):
        yield ("," if n else "") + ",".join(batch)
    yield "]}\n"
