from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request

from fleetctl.audit.api.serializers import AuditEventSerializer
from fleetctl.audit.filters import AuditEventFilter
from fleetctl.audit.selectors import audit_csv_rows, audit_event_list


def csv_download(rows, stem: str) -> StreamingHttpResponse:  # type: ignore[no-untyped-def]
    response = StreamingHttpResponse(rows, content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="{stem}-{stamp}.csv"'
    return response


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """Every write, who made it and with what before/after. Read-only: the log is append-only."""

    queryset = audit_event_list()
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilter
    ordering_fields = ["at", "id"]

    @extend_schema(responses={(200, "text/csv"): OpenApiResponse(
        OpenApiTypes.STR, description="CSV, one row per event")})
    @action(detail=False, methods=["get"], url_path="export")
    def export(self, request: Request) -> StreamingHttpResponse:
        """The filtered events as CSV (same filters as the list)."""
        events = self.filter_queryset(self.get_queryset())
        return csv_download(audit_csv_rows(events), "fleetctl-audit")
