"""A run's item diff (selectors.diff and diff_rows, the dashboard's too) as CSV or JSON,
streamed in batches.

CSV columns, one row per item:

| column | meaning |
|---|---|
| run, item, position | the run's id, the item's id and its position in the suite |
| direction, delta | regressed (the candidate scored lower) or improved; candidate − primary |
| tags, scorer | the item's tags (space separated) and its scorer |
| prompt, references | the prompt (or the last user message) and the references (JSON list) |
| candidate_<f>, primary_<f> | each side's pool, score, reason, extracted, text, error |

Text cells a spreadsheet would run as a formula (an answer starting with "=", "+", "-" or
"@") start with a quote (fleetctl/core/csvcells.py); numbers are left alone.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from django.db.models import QuerySet

from fleetctl.core.csvcells import spreadsheet_safe
from fleetctl.core.errors import DomainError
from fleetctl.evals import selectors
from fleetctl.evals.models import EvalResult, EvalRun, EvalRunPool

SIDE_FIELDS = ("pool", "score", "reason", "extracted", "text", "error")
CSV_COLUMNS = ["run", "item", "position", "direction", "delta", "tags", "scorer", "prompt",
               "references", *(f"{side}_{f}" for side in ("candidate", "primary")
                               for f in SIDE_FIELDS)]
BATCH = 500


def require_primary(run: EvalRun) -> None:
    """A run without a primary has nothing to diff: a 400 saying what to do."""
    if selectors.role_pool(run, EvalRunPool.Role.PRIMARY) is None:
        raise DomainError(f"Eval run {run.pk} has no primary pool, so there is nothing to "
                          "compare its candidate with; start a run with a primary (or a "
                          "plan) to get an item diff.")


def _batches(results: Iterable[EvalResult]) -> Iterator[list[EvalResult]]:
    batch: list[EvalResult] = []
    for result in results:
        batch.append(result)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def csv_row(run_id: int, row: dict[str, Any]) -> list[Any]:
    cells: list[Any] = [run_id, row["item"], row["position"], row["direction"], row["delta"],
                        " ".join(row["tags"]), row["scorer"], row["prompt"],
                        json.dumps(row["references"], ensure_ascii=False)]
    cells += [row[side][f] for side in ("candidate", "primary") for f in SIDE_FIELDS]
    return [spreadsheet_safe(cell) for cell in cells]


def csv_lines(run: EvalRun, results: QuerySet[EvalResult]) -> Iterator[str]:
    """The header, then a chunk of rows per batch of items."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    for batch in _batches(results.iterator(chunk_size=2000)):
        buffer.seek(0)
        buffer.truncate()
        writer.writerows(csv_row(run.pk, row) for row in selectors.diff_rows(run, batch))
        yield buffer.getvalue()


def json_chunks(run: EvalRun, head: dict[str, Any], results: QuerySet[EvalResult]
                ) -> Iterator[str]:
    """{"run": head, "diff": [...]}, a batch of rows per chunk."""
    opening = json.dumps({"run": head}, default=str, ensure_ascii=False)
    yield opening[:-1] + ', "diff": ['
    for n, batch in enumerate(_batches(results.iterator(chunk_size=2000))):
        text = ",".join(json.dumps(row, default=str, ensure_ascii=False)
                        for row in selectors.diff_rows(run, batch))
        yield ("," if n else "") + text
    yield "]}\n"
