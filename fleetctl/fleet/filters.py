import django_filters
from django.db.models import QuerySet

from fleetctl.core.filters import FilterSet
from fleetctl.fleet.models import JURISDICTIONS, HealthCheck, HealthTransition, Pool, PoolModel


class PoolFilter(FilterSet):
    """One FilterSet for the pools API and the dashboard overview."""

    q = django_filters.CharFilter(method="filter_q", label="name contains")
    region = django_filters.CharFilter(field_name="region__code")
    jurisdiction = django_filters.ChoiceFilter(
        field_name="region__jurisdiction", choices=sorted(JURISDICTIONS.items())
    )
    model = django_filters.CharFilter(field_name="models__model_id", distinct=True)
    accelerator = django_filters.CharFilter(lookup_expr="iexact")

    class Meta:
        model = Pool
        fields = ["q", "runtime", "region", "jurisdiction", "health_state", "latency_class",
                  "model", "accelerator"]

    def filter_q(self, queryset: QuerySet[Pool], name: str, value: str) -> QuerySet[Pool]:
        return queryset.filter(name__icontains=value)


class PoolModelFilter(FilterSet):
    pool = django_filters.CharFilter(field_name="pool__name")

    class Meta:
        model = PoolModel
        fields = ["pool", "model_id", "quantisation"]


class HealthCheckFilter(FilterSet):
    pool = django_filters.CharFilter(field_name="pool__name")
    since = django_filters.IsoDateTimeFilter(field_name="checked_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="checked_at", lookup_expr="lt")

    class Meta:
        model = HealthCheck
        fields = ["pool", "ok", "since", "until"]


class HealthTransitionFilter(FilterSet):
    pool = django_filters.CharFilter(field_name="pool__name")
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")

    class Meta:
        model = HealthTransition
        fields = ["pool", "to_state", "since"]
