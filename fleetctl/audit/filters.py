import django_filters

from fleetctl.audit.models import AuditEvent
from fleetctl.core.filters import FilterSet


class AuditEventFilter(FilterSet):
    """One FilterSet for the API and the dashboard's audit page."""

    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")
    action = django_filters.CharFilter(lookup_expr="istartswith")
    actor = django_filters.CharFilter(lookup_expr="iexact")
    object_type = django_filters.CharFilter()
    object_id = django_filters.CharFilter()
    outcome = django_filters.ChoiceFilter(choices=AuditEvent.Outcome.choices)
    request_id = django_filters.CharFilter()

    class Meta:
        model = AuditEvent
        fields = ["since", "until", "action", "actor", "object_type", "object_id", "outcome",
                  "request_id"]
