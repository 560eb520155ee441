"""One FilterSet for the conformance runs list, shared by the API and the dashboard."""

import django_filters

from fleetctl.conformance.models import ConformanceRun
from fleetctl.core.filters import FilterSet


class RunFilter(FilterSet):
    status = django_filters.ChoiceFilter(choices=ConformanceRun.Status.choices)
    verdict = django_filters.ChoiceFilter(choices=ConformanceRun.Verdict.choices)
    pool = django_filters.CharFilter(field_name="pool__name", label="pool name")
    plan = django_filters.CharFilter(field_name="plan__name", label="plan name")

    class Meta:
        model = ConformanceRun
        fields = ["status", "verdict", "pool", "plan"]
