"""Reads for benchmarks: the lists, one run's progress and results, the points the charts
draw and the per-request rows the exports stream. Views, the API and exports call these."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Prefetch, QuerySet

from fleetctl.bench import services
from fleetctl.bench.models import Level, Run, Sample, Trace
from fleetctl.fleet.models import Pool

# Levels that were measured and judged against the SLO; the others did not count.
COUNTED = (Level.Verdict.PASS, Level.Verdict.FAIL)


def trace_list() -> QuerySet[Trace]:
    return Trace.objects.all()


def trace_get(*, name: str) -> Trace | None:
    return Trace.objects.filter(name=name).first()


def trace_exists() -> bool:
    return Trace.objects.exists()


def trace_path(trace: Trace) -> Path:
    """Where the trace's normalised JSONL file lives (it may be missing on this machine)."""
    return Path(settings.DATA_DIR) / "traces" / trace.path


def run_list() -> QuerySet[Run]:
    return Run.objects.select_related("trace").prefetch_related(
        Prefetch("pools", queryset=Pool.objects.order_by("name")))


def run_get(*, run_id: int) -> Run | None:
    return run_list().filter(pk=run_id).first()


def trace_runs(*, trace: Trace, limit: int) -> QuerySet[Run]:
    """The newest runs of one trace."""
    return run_list().filter(trace=trace)[:limit]


def run_levels(*, run: Run) -> QuerySet[Level]:
    return (Level.objects.filter(run=run).select_related("pool")
            .order_by("pool__name", "concurrency", "speed", "attempt"))


@dataclass(frozen=True)
class Progress:
    """How far a run is: what it measures now and how many levels are done."""

    status: str
    doing: str
    levels_done: int
    levels_planned: int | None  # None in search mode: the search decides how many

    @property
    def percent(self) -> int | None:
        if not self.levels_planned:
            return None
        return min(100, round(100 * self.levels_done / self.levels_planned))

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "doing": self.doing, "levels_done": self.levels_done,
                "levels_planned": self.levels_planned, "percent": self.percent}


def run_progress(*, run: Run, levels: list[Level] | None = None) -> Progress:
    rows = levels if levels is not None else list(run_levels(run=run))
    done = sum(1 for level in rows if level.verdict != Level.Verdict.RUNNING)
    planned = None
    if run.timing == Run.Timing.TRACE:
        planned = len(run.speeds) * len(run.pools.all())
    elif run.mode == Run.Mode.LEVELS:
        planned = len(run.levels) * len(run.pools.all())
    doing = (run.progress or {}).get("doing", "")
    if run.status == Run.Status.QUEUED:
        doing = "waiting for a worker on the bench queue"
    elif run.status not in Run.ACTIVE:
        doing = ""
    return Progress(status=run.status, doing=doing, levels_done=done, levels_planned=planned)


@dataclass(frozen=True)
class PoolOutcome:
    """One pool's answer: its highest SLO-passing level and what that costs."""

    pool: Pool
    best: Level | None
    client_bound: bool
    note: str
    levels: list[Level]

    @property
    def cost_formula(self) -> str:
        """The arithmetic behind the cost, in the pool's currency."""
        if self.best is None or not self.best.output_tokens_per_s:
            return ""
        return (f"{self.hourly_rate} {self.currency}/h ÷ "
                f"{self.best.output_tokens_per_s:,.1f} tok/s × 1e6 ÷ 3600")

    @property
    def hourly_rate(self) -> Decimal:
        """The rate the cost was computed with (the pool's own may have changed since)."""
        if self.best is not None and self.best.hourly_rate is not None:
            return self.best.hourly_rate
        return self.pool.node_hourly_rate

    @property
    def currency(self) -> str:
        return (self.best.currency if self.best is not None and self.best.currency
                else self.pool.currency)

    @property
    def cost_stale_reason(self) -> str | None:
        """Why this run's cost no longer holds for the pool (its rate or currency changed)."""
        from fleetctl.fleet.models import cost_stale_reason

        if self.best is None:
            return None
        return cost_stale_reason(cost=self.best.cost_per_1m, rate_then=self.hourly_rate,
                                 currency_then=self.currency,
                                 rate_now=self.pool.node_hourly_rate,
                                 currency_now=self.pool.currency,
                                 source=f"run #{self.best.run_id}")

    def as_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "pool": self.pool.name, "currency": self.currency,
            "node_hourly_rate": str(self.hourly_rate),
            "best_concurrency": best.concurrency if best and best.speed is None else None,
            "best_speed": best.speed if best else None,
            "output_tokens_per_s": best.output_tokens_per_s if best else None,
            "ttft_p95_ms": best.ttft_p95_ms if best else None,
            "tpot_p95_ms": best.tpot_p95_ms if best else None,
            "error_rate": best.error_rate if best else None,
            "binding": best.binding if best else None,
            "cost_per_1m": _decimal_text(best.cost_per_1m) if best else None,
            "cost_formula": self.cost_formula,
            "client_bound": self.client_bound, "note": self.note,
        }


def _decimal_text(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


def run_outcomes(*, run: Run) -> list[PoolOutcome]:
    """Per pool, side by side (by name): the service's reading of the best level."""
    return [PoolOutcome(pool=r.pool, best=r.best, client_bound=r.client_bound, note=r.note,
                        levels=r.levels) for r in services.run_results(run)]


def chart_points(*, levels: list[Level]) -> dict[str, list[dict[str, Any]]]:
    """Per pool name, every finished level as a plain point for `charts.py`."""
    points: dict[str, list[dict[str, Any]]] = {}
    for level in levels:
        if level.verdict == Level.Verdict.RUNNING:
            continue
        points.setdefault(level.pool.name, []).append({
            "concurrency": level.concurrency, "speed": level.speed,
            "x": level.speed if level.speed is not None else level.concurrency,
            "attempt": level.attempt,
            "verdict": level.verdict, "note": level.note,
            "output_tokens_per_s": level.output_tokens_per_s,
            "ttft_p95_ms": level.ttft_p95_ms, "tpot_p95_ms": level.tpot_p95_ms,
            "error_rate": level.error_rate,
            "cost_per_1m": float(level.cost_per_1m) if level.cost_per_1m is not None else None,
            "currency": level.currency or level.pool.currency,
        })
    return points


def run_samples(*, run: Run) -> QuerySet[Sample]:
    return (Sample.objects.filter(level__run=run).select_related("level__pool")
            .order_by("level__pool__name", "level__concurrency", "level__speed",
                      "level__attempt", "shard",
                      "index"))


def run_samples_iter(*, run: Run, chunk_size: int = 2000) -> Iterator[Sample]:
    """Every per-request row of a run, read in chunks (exports never hold them all)."""
    return run_samples(run=run).iterator(chunk_size=chunk_size)
