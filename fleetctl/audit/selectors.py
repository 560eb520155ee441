from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import datetime

from django.db.models import QuerySet

from fleetctl.audit.models import AuditEvent
from fleetctl.core.csvcells import spreadsheet_safe

CSV_COLUMNS = [
    "id", "at", "actor", "token_prefix", "action", "outcome", "object_type", "object_id",
    "object_repr", "before", "after", "message", "request_id",
]


def audit_event_list() -> QuerySet[AuditEvent]:
    return AuditEvent.objects.all()


def object_history(*, object_type: str, object_id: object, limit: int = 200
                   ) -> list[AuditEvent]:
    """What happened to one row (its `app_label.model` and primary key), newest first: the
    history a page shows beside the row."""
    return list(AuditEvent.objects.filter(object_type=object_type, object_id=str(object_id))
                .order_by("-at", "-id")[:limit])


class _Echo:
    def write(self, value: str) -> str:
        return value


def audit_csv_rows(events: QuerySet[AuditEvent]) -> Iterator[str]:
    """Stream CSV one row at a time so a large export never sits in memory. Text cells that
    a spreadsheet would read as a formula start with a quote (core/csvcells.py)."""
    import json

    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for event in events.iterator(chunk_size=2000):
        row = [getattr(event, column) for column in CSV_COLUMNS]
        row[1] = event.at.isoformat()
        row[9] = json.dumps(event.before, sort_keys=True) if event.before is not None else ""
        row[10] = json.dumps(event.after, sort_keys=True) if event.after is not None else ""
        yield writer.writerow([spreadsheet_safe(cell) for cell in row])


def refusals_of_request(*, request_id: str, since: datetime) -> list[int]:
    """The refusals recorded for one request (its id, from `since` on: a caller may send the
    same X-Request-ID again), oldest first."""
    if not request_id:
        return []
    return list(AuditEvent.objects.filter(request_id=request_id, at__gte=since,
                                          outcome=AuditEvent.Outcome.DENIED)
                .order_by("id").values_list("id", flat=True))
