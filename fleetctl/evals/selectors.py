"""Reads for eval suites and runs: what the API, the pages and the CLI show. Every read is a
bounded number of queries whatever the size of the run (no query per row): pools are
prefetched, progress is one aggregate, the item diff is one query over the candidate's rows
annotated with the primary's (a subquery on the unique (run_pool, item) index) and a page of
it reads the primary's rows in one more.

Tags are filtered the same on PostgreSQL (JSONB containment) and SQLite, the demo's database,
whose JSON fields have no containment lookup: there the tag is matched, quoted, in the JSON
text of the list (a tag is [A-Za-z0-9_.:/-]+, so it needs no escaping and cannot match a
part of another tag).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Avg, Count, F, OuterRef, Prefetch, Q, QuerySet, Subquery, TextField
from django.db.models.functions import Cast

from fleetctl.core.errors import NotFoundError
from fleetctl.evals.models import EvalItem, EvalResult, EvalRun, EvalRunPool, EvalSuite
from fleetctl.fleet.costs import TaskCost, task_cost
from fleetctl.fleet.models import Pool

DIRECTIONS = ("regressed", "improved")


def has_tag(queryset: QuerySet[Any], field: str, tag: str) -> QuerySet[Any]:
    """Rows whose JSON list `field` holds `tag` exactly, on PostgreSQL and SQLite."""
    if connection.vendor == "postgresql":
        return queryset.filter(**{f"{field}__contains": [tag]})
    alias = f"_{field.replace('__', '_')}_text"
    return queryset.annotate(**{alias: Cast(field, TextField())}).filter(
        **{f"{alias}__contains": json.dumps(tag)})


# --- suites -----------------------------------------------------------------------------------

def suites(*, name: str | None = None, source: str | None = None,
           retired: bool | None = None) -> QuerySet[EvalSuite]:
    out = EvalSuite.objects.all().order_by("name", "-version")
    if name:
        out = out.filter(name=name)
    if source:
        out = out.filter(source=source)
    if retired is not None:
        out = out.filter(retired_at__isnull=not retired)
    return out


def suite_get(suite_id: int) -> EvalSuite | None:
    return EvalSuite.objects.filter(pk=suite_id).first()


def suite_runs(suite: EvalSuite, *, limit: int) -> list[EvalRun]:
    """The suite's newest runs, each with its plan (a suite's page lists them)."""
    return list(suite.runs.select_related("plan").order_by("-created_at", "-id")[:limit])


def items_none() -> QuerySet[EvalItem]:
    """No items: what the item filters (and their schema) are declared on."""
    return EvalItem.objects.none()


def results_none() -> QuerySet[EvalResult]:
    """No results: what the result and diff filters (and their schema) are declared on, and
    what an unreadable diff filter lists."""
    return EvalResult.objects.none()


def suite_items(suite: EvalSuite, *, tag: str | None = None,
                scorer: str | None = None) -> QuerySet[EvalItem]:
    out = EvalItem.objects.filter(suite=suite).order_by("position")
    if tag:
        out = has_tag(out, "tags", tag)
    if scorer:
        out = out.filter(scorer=scorer)
    return out


# --- runs -------------------------------------------------------------------------------------

def _with_pools(queryset: QuerySet[EvalRun]) -> QuerySet[EvalRun]:
    return queryset.select_related("suite", "plan").prefetch_related(
        Prefetch("run_pools", queryset=EvalRunPool.objects.select_related("pool")
                 .order_by("position")))


def runs(*, plan: Any = None, status: str | None = None, suite: Any = None,
         pool: Any = None) -> QuerySet[EvalRun]:
    """Newest first, each with its suite, plan and pools (three queries for any page)."""
    out = EvalRun.objects.all()
    if plan is not None:
        out = out.filter(plan__name=plan) if isinstance(plan, str) else out.filter(plan=plan)
    if status:
        out = out.filter(status=status)
    if suite is not None:
        out = (out.filter(suite__name=suite) if isinstance(suite, str)
               else out.filter(suite=suite))
    if pool is not None:
        ids = EvalRunPool.objects.filter(
            **({"pool__name": pool} if isinstance(pool, str) else {"pool": pool})
        ).values("run_id")
        out = out.filter(pk__in=ids)
    return _with_pools(out).order_by("-created_at", "-id")


def run_get(run_id: int) -> EvalRun:
    run = _with_pools(EvalRun.objects.filter(pk=run_id)).first()
    if run is None:
        raise NotFoundError(f"No eval run with id {run_id}.")
    return run


def run_pools(run: EvalRun) -> list[EvalRunPool]:
    """The run's pools in interleaving order (candidate, primary, others): the prefetched
    ones when run_get/runs read the run."""
    return sorted(run.run_pools.all(), key=lambda rp: rp.position)


def role_pool(run: EvalRun, role: str) -> EvalRunPool | None:
    """The run's pool in `role` (candidate, primary), from the prefetched pools."""
    return next((rp for rp in run_pools(run) if rp.role == role), None)


def pool_models() -> dict[str, list[str]]:
    """Every pool's name and the model ids it serves, for the new-run form's hints."""
    return {p.name: sorted(m.model_id for m in p.models.all())
            for p in Pool.objects.prefetch_related("models").order_by("name")}


def primary_results(primary: EvalRunPool, item_ids: list[int]) -> dict[int, EvalResult]:
    """The primary's rows for these items, by item id: one query for a page of the diff."""
    return {r.item_id: r for r in EvalResult.objects.filter(run_pool=primary,
                                                             item_id__in=item_ids)}


def progress(run: EvalRun) -> dict[str, Any]:
    """Rows by status and, per pool, rows scored, the mean score so far, answers that were
    errors and rows that needed more than one attempt: one aggregate query."""
    counts = (EvalResult.objects.filter(run=run).values("run_pool", "status")
              .annotate(n=Count("id"), mean=Avg("score"),
                        errors=Count("id", filter=~Q(error=""))))
    by_pool: dict[int, dict[str, Any]] = {}
    status_totals = {s: 0 for s in EvalResult.Status.values}
    for row in counts:
        status_totals[row["status"]] += row["n"]
        entry = by_pool.setdefault(row["run_pool"], {"done": 0, "mean": None, "errors": 0,
                                                     "pending": 0, "claimed": 0})
        if row["status"] == EvalResult.Status.DONE:
            entry.update(done=row["n"], mean=row["mean"], errors=row["errors"])
        else:
            entry[row["status"]] = row["n"]
    pools = []
    for rp in run_pools(run):
        entry = by_pool.get(rp.pk, {"done": 0, "mean": None, "errors": 0, "pending": 0,
                                    "claimed": 0})
        pools.append({"pool": rp.pool.name, "role": rp.role, "endpoints": list(rp.endpoints),
                      **entry})
    total = run.total or sum(status_totals.values())
    done = status_totals[EvalResult.Status.DONE]
    return {"status": run.status, "total": total, "done": done,
            "pending": status_totals[EvalResult.Status.PENDING],
            "claimed": status_totals[EvalResult.Status.CLAIMED],
            "percent": round(100 * done / total, 1) if total else None,
            "resumed": run.resumed, "heartbeat_at": run.heartbeat_at, "pools": pools}


PASSED = 1.0  # an item passed on a pool when it scored full marks (most scorers give 0 or 1)


def run_task_costs(run: EvalRun, now: Any = None) -> list[TaskCost]:
    """Per pool of the run, its cost per item passed: the pool's hourly rate × the run's
    time (started to finished, or to now while it runs: the pools answer interleaved, so
    each is busy with the run the whole time) ÷ the items it scored full marks on. Failed:
    items scored below that (wrong, or no answer); retries: attempts beyond each row's first.
    One read of the rows' scores and attempts."""
    from django.utils import timezone

    seconds = None
    if run.started_at is not None:
        end = run.finished_at or now or timezone.now()
        seconds = max(0.0, (end - run.started_at).total_seconds())
    counts: dict[int, dict[str, int]] = {}
    rows = (EvalResult.objects.filter(run=run, status=EvalResult.Status.DONE)
            .values_list("run_pool_id", "score", "attempts").order_by())
    for run_pool_id, score, attempts in rows.iterator():
        entry = counts.setdefault(run_pool_id, {"passed": 0, "failed": 0, "attempts": 0})
        entry["passed" if score is not None and score >= PASSED else "failed"] += 1
        entry["attempts"] += max(1, len(attempts or []))
    out = []
    for rp in run_pools(run):
        entry = counts.get(rp.pk, {"passed": 0, "failed": 0, "attempts": 0})
        done = entry["passed"] + entry["failed"]
        out.append(task_cost(
            pool=rp.pool, unit="item passed", seconds=seconds, succeeded=entry["passed"],
            failed=entry["failed"], retries=entry["attempts"] - done,
            attempts=entry["attempts"], busy="run time"))
    return out


def results(run: EvalRun, *, pool: str | None = None, status: str | None = None,
            tag: str | None = None, score: float | None = None,
            item: str | None = None) -> QuerySet[EvalResult]:
    """The run's rows in interleaved order, each with its item and pool (one query)."""
    out = (EvalResult.objects.filter(run=run).select_related("item", "run_pool__pool")
           .order_by("position"))
    if pool:
        out = out.filter(run_pool__pool__name=pool)
    if status:
        out = out.filter(status=status)
    if tag:
        out = has_tag(out, "item__tags", tag)
    if score is not None:
        out = out.filter(score=score)
    if item:
        out = out.filter(item__item_id=item)
    return out


# --- the item diff ----------------------------------------------------------------------------

def diff(run: EvalRun, *, direction: str | None = None, tag: str | None = None,
         q: str | None = None) -> QuerySet[EvalResult]:
    """The candidate's scored rows whose item the primary scored differently, in suite order,
    annotated with the primary's row id, score and text; empty when the run has no primary.
    direction: "regressed" (the candidate scored lower) or "improved"; q: text in the item's
    id, prompt or messages, or in either answer."""
    candidate, primary = role_pool(run, "candidate"), role_pool(run, "primary")
    if candidate is None or primary is None:
        return EvalResult.objects.none()
    if direction is not None and direction not in DIRECTIONS:
        raise ValueError(f"direction is regressed or improved, not {direction!r}")
    theirs = EvalResult.objects.filter(run_pool=primary, item=OuterRef("item"),
                                       status=EvalResult.Status.DONE)
    mine = EvalResult.objects.filter(run_pool=candidate, status=EvalResult.Status.DONE)
    out: QuerySet[EvalResult] = (
        mine.annotate(primary_id=Subquery(theirs.values("pk")[:1]),
                      primary_score=Subquery(theirs.values("score")[:1]),
                      primary_text=Subquery(theirs.values("text")[:1]))
        .filter(primary_score__isnull=False, score__isnull=False)
        .exclude(score=F("primary_score"))
        .select_related("item").order_by("position"))
    if direction:
        out = diff_direction(out, direction)
    if tag:
        out = has_tag(out, "item__tags", tag)
    if q:
        out = diff_search(out, q)
    return out


def diff_direction(rows: QuerySet[EvalResult], direction: str) -> QuerySet[EvalResult]:
    """diff() rows the candidate lost ("regressed") or gained ("improved")."""
    lookup = "score__lt" if direction == "regressed" else "score__gt"
    return rows.filter(**{lookup: F("primary_score")})


def diff_search(rows: QuerySet[EvalResult], q: str) -> QuerySet[EvalResult]:
    """diff() rows with `q` in the item's id, prompt or messages, or in either answer.

    The messages are searched in their JSON text, so `q` is looked for as JSON writes it
    there: quotes and backslashes escaped on both databases, and on SQLite every character
    beyond ASCII too (Django stores JSON there with `ensure_ascii`, where PostgreSQL's jsonb
    prints "é" as is) -- otherwise "Straße" would be found on one database only."""
    in_json = json.dumps(q, ensure_ascii=connection.vendor != "postgresql")[1:-1]
    return rows.annotate(_messages_text=Cast("item__messages", TextField())).filter(
        Q(item__item_id__icontains=q) | Q(item__prompt__icontains=q)
        | Q(_messages_text__icontains=in_json) | Q(text__icontains=q)
        | Q(primary_text__icontains=q))


def diff_counts(run: EvalRun) -> dict[str, int]:
    """How many items regressed and improved (one query)."""
    got = diff(run).aggregate(regressed=Count("id", filter=Q(score__lt=F("primary_score"))),
                              improved=Count("id", filter=Q(score__gt=F("primary_score"))))
    return {k: int(v or 0) for k, v in got.items()}


def _prompt(item: EvalItem) -> str:
    if item.prompt or not item.messages:
        return item.prompt
    users = [m for m in item.messages if isinstance(m, dict) and m.get("role") == "user"]
    last = users[-1] if users else item.messages[-1]
    content = last.get("content", "") if isinstance(last, dict) else ""
    return content if isinstance(content, str) else json.dumps(content)


def _side(pool: str, row: EvalResult | None) -> dict[str, Any]:
    if row is None:
        return {"pool": pool, "score": None, "reason": "", "extracted": "", "text": "",
                "error": "", "endpoint": ""}
    return {"pool": pool, "score": row.score, "reason": row.reason,
            "extracted": row.extracted, "text": row.text, "error": row.error,
            "endpoint": row.endpoint}


def diff_rows(run: EvalRun, page: Sequence[EvalResult]) -> list[dict[str, Any]]:
    """A page of diff() as side-by-side rows: the primary's rows in one query."""
    if not page:
        return []
    candidate, primary = role_pool(run, "candidate"), role_pool(run, "primary")
    assert candidate is not None and primary is not None
    ids = [getattr(row, "primary_id", None) for row in page]
    theirs = {r.pk: r for r in EvalResult.objects.filter(pk__in=[i for i in ids if i])}
    out = []
    for mine, their_id in zip(page, ids, strict=True):
        other = theirs.get(their_id) if their_id else None
        delta = (mine.score or 0.0) - ((other.score if other else None) or 0.0)
        item = mine.item
        out.append({"item": item.item_id, "position": item.position,
                    "direction": "regressed" if delta < 0 else "improved",
                    "delta": round(delta, 6), "tags": list(item.tags or []),
                    "scorer": item.scorer, "prompt": _prompt(item),
                    "references": list(item.references or []),
                    "candidate": _side(candidate.pool.name, mine),
                    "primary": _side(primary.pool.name, other)})
    return out
