"""One FilterSet for the runs list, shared by the API and the dashboard."""

import django_filters

from fleetctl.bench.models import Run, Trace
from fleetctl.core.filters import FilterSet


class RunFilter(FilterSet):
    status = django_filters.ChoiceFilter(choices=Run.Status.choices)
    pool = django_filters.CharFilter(field_name="pools__name", distinct=True, label="pool name")
    trace = django_filters.CharFilter(field_name="trace__name", label="trace name")

    class Meta:
        model = Run
        fields = ["status", "pool", "trace"]


class TraceFilter(FilterSet):
    source = django_filters.ChoiceFilter(choices=Trace.Source.choices)

    class Meta:
        model = Trace
        fields = ["source"]
