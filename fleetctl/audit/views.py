"""The audit page and its CSV export: one FilterSet (shared with the API) drives both, so the
export always holds exactly the rows the page lists."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.audit.api.views import csv_download
from fleetctl.audit.filters import AuditEventFilter
from fleetctl.audit.models import AuditEvent
from fleetctl.audit.selectors import audit_csv_rows, audit_event_list
from fleetctl.core.views import filter_form_says_any

PAGE_SIZE = 50
VALUE_CHARS = 60  # a diff cell shows this much of a value; the CSV and API carry it whole
_ABSENT = object()
# A created row lists every field; these say which row it is, so they come first.
IDENTIFYING_FIELDS = ("name", "code", "model_id", "username")


@dataclass(frozen=True)
class Change:
    field: str
    before: str  # "" when the field was added (a create)
    after: str  # "" when the field was removed (a delete)
    kind: str  # "added", "removed" or "changed"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def event_changes(event: AuditEvent) -> list[Change]:
    """Only what differs between before and after, so an update reads as its diff."""
    before = event.before if isinstance(event.before, dict) else {}
    after = event.after if isinstance(event.after, dict) else {}
    changes: list[Change] = []
    keys = sorted(set(before) | set(after))
    keys.sort(key=lambda key: key not in IDENTIFYING_FIELDS)  # stable: the rest stay sorted
    for key in keys:
        old, new = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if old == new:
            continue
        if old is _ABSENT:
            changes.append(Change(key, "", _short(new), "added"))
        elif new is _ABSENT:
            changes.append(Change(key, _short(old), "", "removed"))
        else:
            changes.append(Change(key, _short(old), _short(new), "changed"))
    return changes


def changes_summary(changes: list[Change], *, shown: int = 2) -> str:
    """One line for a long change list (a create lists every field): the first few, then how
    many more are behind the fold."""
    head = ", ".join(
        f"{c.field}={c.after or c.before}" for c in changes[:shown]
    )
    rest = len(changes) - shown
    return f"{head} … +{rest} more" if rest > 0 else head


def _filter(request: HttpRequest) -> AuditEventFilter:
    event_filter = AuditEventFilter(request.GET or None, queryset=audit_event_list())
    filter_form_says_any(event_filter.form)
    # The FilterSet parses ISO 8601; the browser's datetime picker sends exactly that.
    for name in ("since", "until"):
        event_filter.form.fields[name].widget.input_type = "datetime-local"
    return event_filter


@dashboard_view
@require_GET
def event_list(request: HttpRequest) -> HttpResponse:
    event_filter = _filter(request)
    page = Paginator(event_filter.qs, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = []
    for event in page.object_list:
        changes = event_changes(event)
        rows.append((event, changes, changes_summary(changes)))
    filtered = any(value for key, value in request.GET.items() if key != "page")
    return render(
        request, "audit/event_list.html",
        {"filter": event_filter, "page": page, "rows": rows, "filtered": filtered},
    )


@dashboard_view
@require_GET
def event_export(request: HttpRequest) -> StreamingHttpResponse:
    return csv_download(audit_csv_rows(_filter(request).qs), "fleetctl-audit")
