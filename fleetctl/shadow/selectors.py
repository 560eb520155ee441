"""Reads for shadow runs: the list, one run, a plan's latest, its most divergent pairs, its
judgements (the time series), and its live counters (Redis merged over the stored ones)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from django.db.models import QuerySet

from fleetctl.shadow import live
from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun

if TYPE_CHECKING:
    from migrations_plan.models import Plan

log = logging.getLogger("fleetctl.shadow")


def run_list() -> QuerySet[ShadowRun]:
    return ShadowRun.objects.select_related("plan", "route", "candidate", "primary", "trace")


def run_get(run_id: int) -> ShadowRun | None:
    return run_list().filter(pk=run_id).first()


def run_for_plan(plan: Plan) -> ShadowRun | None:
    """The plan's latest run (running or not)."""
    return run_list().filter(plan=plan).order_by("-created_at", "-id").first()


def pairs_most_divergent(run: ShadowRun, limit: int = 20) -> QuerySet[ShadowPair]:
    """The pairs whose candidate answer is furthest from the primary's (normalised edit
    distance; 1.0 for an error on one side only), newest first among equals."""
    return ShadowPair.objects.filter(run=run).order_by(
        "-divergence_score", "-received_at", "-id")[:limit]


def judgements(run: ShadowRun) -> QuerySet[ShadowJudgement]:
    return ShadowJudgement.objects.filter(run=run).order_by("at", "id")


def judgements_picked(run: ShadowRun, pick: Callable[[list[int]], list[int]]
                      ) -> list[ShadowJudgement]:
    """The judgements whose ids `pick` keeps from all of them (oldest first): a chart reads
    a few hundred of a long run's thousands, never every row."""
    series = judgements(run)
    picked = pick(list(series.values_list("id", flat=True)))
    return list(series.filter(id__in=picked)) if picked else []


def pairs(run: ShadowRun) -> QuerySet[ShadowPair]:
    """The run's pairs, as the API's pair filters order and narrow them."""
    return ShadowPair.objects.filter(run=run)


def pairs_none() -> QuerySet[ShadowPair]:
    """No pairs: what the pair filters (and their schema) are declared on."""
    return ShadowPair.objects.none()


def pairs_for_export(run: ShadowRun, chunk_size: int = 2000) -> Iterator[ShadowPair]:
    """Every pair of the run, oldest first as a time series reads, read in chunks and
    without its content (an export never carries prompt or answer text)."""
    return (ShadowPair.objects.filter(run=run).order_by("received_at", "id").defer("content")
            .iterator(chunk_size=chunk_size))


def live_counters(run: ShadowRun) -> dict[str, int]:
    """Every counter, the larger of Redis's live value and the one the judge last folded in
    (Redis may have been flushed; the row keeps what was seen). Redis unreachable: the row's."""
    stored = {k: int(v) for k, v in (run.counters or {}).items()}
    try:
        current = live.counters(run.pk)
    except Exception:
        log.warning("shadow run %s: live counters not read from Redis", run.pk, exc_info=True)
        current = {}
    return {k: max(stored.get(k, 0), current.get(k, 0))
            for k in (*live.COUNTER_FIELDS, *sorted(set(stored) - set(live.COUNTER_FIELDS)))}
