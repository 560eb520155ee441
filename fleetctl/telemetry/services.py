"""Writing telemetry: adding to windows (the ingester), downsampling and pruning (beat).

Every write adds: a window row is read under select_for_update, its counts and histograms
summed with what came in, and written back, so pieces of one window flushed at different
times, late lines and downsampled windows all land exactly once. The callers choose the
transaction: the ingester moves its cursor in the same one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from fleetctl.telemetry import histogram
from fleetctl.telemetry.models import Window

COUNT_FIELDS = ("requests", "errors", "client_errors", "client_disconnects", "retries",
                "fallbacks", "fell_over", "streamed", "bytes_out", "output_tokens", "metered_ms",
                "running_sum", "running_samples")
HISTOGRAM_FIELDS = ("ttft", "duration", "tpot", "flags", "tiers")
_WRITTEN = (*COUNT_FIELDS, *HISTOGRAM_FIELDS, "updated_at")
_KEY_FIELDS = ("source", "source_name", "route", "pool", "resolution_s", "start")
_EMPTY = dict.fromkeys(COUNT_FIELDS, 0)

# Resolution (s) -> (merged into, after). 10 s windows older than an hour become minutes;
# minutes older than a day become ten minutes.
DOWNSAMPLE: dict[int, tuple[int, timedelta]] = {
    10: (60, timedelta(hours=1)),
    60: (600, timedelta(days=1)),
}
# Resolution (s) -> how long its windows are kept.
RETENTION: dict[int, timedelta] = {
    10: timedelta(hours=6),
    60: timedelta(days=2),
    600: timedelta(days=30),
}

Key = tuple[str, str, str, str, int, datetime]
DOWNSAMPLE_BATCH = 5000


@dataclass
class WindowDelta:
    """What to add to one window (its key, then counts and histograms)."""

    source: str
    source_name: str
    route: str
    pool: str
    resolution_s: int
    start: datetime
    counts: dict[str, int] = field(default_factory=dict)
    histograms: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.source, self.source_name, self.route, self.pool, self.resolution_s,
                self.start)


def _absorb(row: dict[str, Any], counts: dict[str, int], histograms: dict[str, Any]) -> None:
    for name, value in counts.items():
        if value:
            row[name] += value
    for name, h in histograms.items():
        if h:
            row[name] = histogram.merge(row[name] or {}, h)


def windows_add(deltas: Iterable[WindowDelta], *, now: datetime | None = None) -> int:
    """Add each delta into its window row (created when missing); returns the rows touched.

    Existing rows are read in one locked query per (source, resolution) and written back with
    bulk_update; missing ones are bulk-created. If another writer created one of them in the
    meantime the whole batch is retried once from a savepoint (the adds are not lost)."""
    merged: dict[Key, WindowDelta] = {}
    for delta in deltas:
        have = merged.get(delta.key)
        if have is None:
            merged[delta.key] = WindowDelta(*delta.key, counts=dict(delta.counts),
                                            histograms={k: dict(v) for k, v
                                                        in delta.histograms.items()})
            continue
        for name, value in delta.counts.items():
            have.counts[name] = have.counts.get(name, 0) + value
        for name, h in delta.histograms.items():
            have.histograms[name] = histogram.merge(have.histograms.get(name, {}), h)
    if not merged:
        return 0
    now = now or timezone.now()
    for attempt in (1, 2):
        try:
            with transaction.atomic():
                _add_batch(list(merged.values()), now)
            return len(merged)
        except IntegrityError:
            if attempt == 2:
                raise
    return len(merged)


def _add_batch(deltas: list[WindowDelta], now: datetime) -> None:
    # One locked read per window start, naming every key column, so the unique index is
    # searched (a read by gateway alone scanned every window that gateway ever had). Rows as
    # dicts, not model instances: building ~3,000 Window objects per flush cost more than the
    # SQL.
    groups: dict[tuple[str, int, datetime], list[WindowDelta]] = {}
    for delta in deltas:
        groups.setdefault((delta.source, delta.resolution_s, delta.start), []).append(delta)
    changed: list[dict[str, Any]] = []
    created: list[dict[str, Any]] = []
    for (source, resolution_s, start), group in groups.items():
        existing = {
            (row["source"], row["source_name"], row["route"], row["pool"],
             row["resolution_s"], row["start"]): row
            for row in Window.objects.select_for_update().filter(
                source=source, resolution_s=resolution_s, start=start,
                source_name__in={d.source_name for d in group},
                route__in={d.route for d in group}, pool__in={d.pool for d in group},
            ).values("id", *_KEY_FIELDS, *_WRITTEN)}
        for delta in group:
            row = existing.get(delta.key)
            if row is None:
                row = dict(zip(_KEY_FIELDS, delta.key, strict=True))
                row.update(_EMPTY)
                row.update({name: {} for name in HISTOGRAM_FIELDS})
                created.append(row)
            else:
                changed.append(row)
            _absorb(row, delta.counts, delta.histograms)
            row["updated_at"] = now
    if changed:
        _update_rows(changed)
    if created:
        _insert_rows(created)


def _prepared(rows: list[dict[str, Any]],
              names: tuple[str, ...]) -> tuple[list[str], list[list[Any]]]:
    """Columns and values by hand: Django's per-value preparation costs more than the SQL."""
    ops = connection.ops
    json_cast = "::jsonb" if connection.vendor == "postgresql" else ""
    kinds = ["json" if name in HISTOGRAM_FIELDS else "time" if name in ("start", "updated_at")
             else "plain" for name in names]
    columns = [f"{ops.quote_name(name)} = %s{json_cast if kind == 'json' else ''}"
               for name, kind in zip(names, kinds, strict=True)]
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    adapt_time = ops.adapt_datetimefield_value
    params = []
    for row in rows:
        values: list[Any] = []
        for name, kind in zip(names, kinds, strict=True):
            value = row[name]
            values.append(dumps(value) if kind == "json" else adapt_time(value)
                          if kind == "time" else value)
        params.append(values)
    return columns, params


def _update_rows(rows: list[dict[str, Any]]) -> None:
    """Write back rows read under the lock: one UPDATE by primary key, executemany.
    (bulk_update builds a CASE per field over every row: 20x slower at 3,000 windows.)"""
    assignments, params = _prepared(rows, _WRITTEN)
    table = connection.ops.quote_name(Window._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(f"UPDATE {table} SET {', '.join(assignments)} WHERE id = %s",
                           [[*values, row["id"]] for values, row in zip(params, rows, strict=True)])


def _insert_rows(rows: list[dict[str, Any]]) -> None:
    """New windows, executemany (bulk_create spends most of its time preparing SQL)."""
    assignments, params = _prepared(rows, (*_KEY_FIELDS, *_WRITTEN))
    columns = [a.split(" = ", 1)[0] for a in assignments]
    marks = [a.split(" = ", 1)[1] for a in assignments]
    table = connection.ops.quote_name(Window._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} ({', '.join(columns)}) "
                           f"VALUES ({', '.join(marks)})", params)


def window_add(*, source: str, source_name: str, route: str, pool: str, resolution_s: int,
               start: datetime, counts: dict[str, int] | None = None,
               histograms: dict[str, dict[str, int]] | None = None,
               now: datetime | None = None) -> None:
    """Add counts and histograms into one window (see windows_add)."""
    windows_add([WindowDelta(source, source_name, route, pool, resolution_s, start,
                             counts or {}, histograms or {})], now=now)


def window_start(epoch_s: float, resolution_s: int) -> datetime:
    """The start of the window holding `epoch_s` (windows are aligned on the epoch)."""
    from datetime import UTC

    return datetime.fromtimestamp(epoch_s - epoch_s % resolution_s, tz=UTC)


def downsample(now: datetime | None = None) -> dict[str, int]:
    """Merge 10 s windows older than an hour into 60 s ones, 60 s older than a day into 600 s.

    Exact: counts add and histograms share their buckets. Each resolution is done in one
    transaction that adds the finer windows into the coarser ones and deletes them, so a
    second run finds nothing to do, and a late line that recreated an old 10 s window is
    merged by the next run. Only whole target windows are merged (a 60 s window starts an
    hour ago or earlier), so a window still being written is never taken apart."""
    now = now or timezone.now()
    done: dict[str, int] = {}
    for finer, (coarser, after) in DOWNSAMPLE.items():
        cutoff = window_start((now - after).timestamp(), coarser)
        merged = 0
        while True:  # in batches: an hour of 1,000 pools is a few hundred thousand rows
            with transaction.atomic():
                rows = list(Window.objects.select_for_update()
                            .filter(resolution_s=finer, start__lt=cutoff)
                            .order_by("pk")[:DOWNSAMPLE_BATCH])
                if rows:
                    windows_add([_as_delta(row, coarser) for row in rows],
                                now=max(row.updated_at for row in rows))
                    Window.objects.filter(pk__in=[row.pk for row in rows]).delete()
            merged += len(rows)
            if len(rows) < DOWNSAMPLE_BATCH:
                break
        done[f"{finer}s"] = merged
    return done


def _as_delta(row: Window, resolution_s: int) -> WindowDelta:
    return WindowDelta(row.source, row.source_name, row.route, row.pool, resolution_s,
                       window_start(row.start.timestamp(), resolution_s),
                       counts={name: getattr(row, name) for name in COUNT_FIELDS},
                       histograms={name: getattr(row, name) or {} for name in HISTOGRAM_FIELDS})


def prune(now: datetime | None = None) -> int:
    """Delete windows past their resolution's retention; returns how many."""
    now = now or timezone.now()
    deleted = 0
    for resolution_s, keep in RETENTION.items():
        count, _ = Window.objects.filter(resolution_s=resolution_s,
                                         start__lt=now - keep).delete()
        deleted += count
    return deleted
