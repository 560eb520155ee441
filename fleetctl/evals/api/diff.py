"""A run's item diff: the items its candidate and its primary scored differently, side by side,
and the same rows as CSV or JSON. One query over the candidate's results, each annotated with
the primary's score and text for the same item (so the filters and the page are SQL); the
page's primary rows are then read in one more query. Streamed exports read it in batches.

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
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.db.models import F, OuterRef, QuerySet, Subquery

from fleetctl.core.csvcells import spreadsheet_safe
from fleetctl.core.errors import DomainError
from fleetctl.evals.models import EvalItem, EvalResult, EvalRun, EvalRunPool

SIDE_FIELDS = ("pool", "score", "reason", "extracted", "text", "error")
CSV_COLUMNS = ["run", "item", "position", "direction", "delta", "tags", "scorer", "prompt",
               "references", *(f"{side}_{f}" for side in ("candidate", "primary")
                               for f in SIDE_FIELDS)]
BATCH = 500


def sides(run: EvalRun) -> tuple[EvalRunPool, EvalRunPool]:
    """The run's candidate and primary; a run without a primary has nothing to diff."""
    pools = {rp.role: rp for rp in run.run_pools.select_related("pool")}
    candidate = pools.get(EvalRunPool.Role.CANDIDATE)
    primary = pools.get(EvalRunPool.Role.PRIMARY)
    if candidate is None or primary is None:
        raise DomainError(f"Eval run {run.pk} has no primary pool, so there is nothing to "
                          "compare its candidate with; start a run with a primary (or a "
                          "plan) to get an item diff.")
    return candidate, primary


def queryset(run: EvalRun) -> QuerySet[EvalResult]:
    """The candidate's scored results whose item the primary scored differently, in suite
    order, annotated with primary_score and primary_text (what the filters read)."""
    candidate, primary = sides(run)
    theirs = EvalResult.objects.filter(run_pool=primary, item=OuterRef("item"))
    return (EvalResult.objects.filter(run_pool=candidate, score__isnull=False)
            .annotate(primary_score=Subquery(theirs.values("score")[:1]),
                      primary_text=Subquery(theirs.values("text")[:1]))
            .filter(primary_score__isnull=False)
            .exclude(score=F("primary_score"))
            .select_related("item").order_by("position"))


def _prompt(item: EvalItem) -> str:
    if item.prompt or not item.messages:
        return item.prompt
    users = [m for m in item.messages if isinstance(m, dict) and m.get("role") == "user"]
    last = users[-1] if users else item.messages[-1]
    content = last.get("content", "") if isinstance(last, dict) else ""
    return content if isinstance(content, str) else json.dumps(content)


def _side(pool: str, result: EvalResult | None) -> dict[str, Any]:
    if result is None:  # the primary's row went between the two queries: not possible today
        return {"pool": pool, "score": None, "reason": "", "extracted": "", "text": "",
                "error": ""}
    return {"pool": pool, "score": result.score, "reason": result.reason,
            "extracted": result.extracted, "text": result.text, "error": result.error}


def rows(run: EvalRun, results: Sequence[EvalResult]) -> list[dict[str, Any]]:
    """A page of the candidate's results as side-by-side diff rows."""
    if not results:
        return []
    candidate, primary = sides(run)
    theirs = {r.item_id: r for r in EvalResult.objects.filter(
        run_pool=primary, item_id__in=[r.item_id for r in results])}
    out = []
    for mine in results:
        other = theirs.get(mine.item_id)
        primary_score = other.score if other is not None else None
        delta = (mine.score or 0.0) - (primary_score or 0.0)
        item = mine.item
        out.append({
            "item": item.item_id, "position": item.position,
            "direction": "regressed" if delta < 0 else "improved",
            "delta": round(delta, 6), "tags": list(item.tags or []), "scorer": item.scorer,
            "prompt": _prompt(item), "references": list(item.references or []),
            "candidate": _side(candidate.pool.name, mine),
            "primary": _side(primary.pool.name, other),
        })
    return out


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
        writer.writerows(csv_row(run.pk, row) for row in rows(run, batch))
        yield buffer.getvalue()


def json_chunks(run: EvalRun, head: dict[str, Any], results: QuerySet[EvalResult]
                ) -> Iterator[str]:
    """{"run": head, "diff": [...]}, a batch of rows per chunk."""
    opening = json.dumps({"run": head}, default=str, ensure_ascii=False)
    yield opening[:-1] + ', "diff": ['
    for n, batch in enumerate(_batches(results.iterator(chunk_size=2000))):
        text = ",".join(json.dumps(row, default=str, ensure_ascii=False)
                        for row in rows(run, batch))
        yield ("," if n else "") + text
    yield "]}\n"
