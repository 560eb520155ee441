"""FilterSets for shadow runs and their pairs, shared by the API and the dashboard."""

import django_filters
from django.db.models import QuerySet

from fleetctl.core.filters import FilterSet
from fleetctl.shadow.models import ShadowPair, ShadowRun

YES_NO = [("true", "true"), ("false", "false")]


def _flag(field: str, help_text: str) -> django_filters.ChoiceFilter:
    """true or false, anything else a 400: a boolean filter that ignored a typo would answer
    every pair and look like a filter that matched them all."""

    def apply(queryset: QuerySet[ShadowPair], name: str, value: str) -> QuerySet[ShadowPair]:
        return queryset.filter(**{field: value == "true"})

    return django_filters.ChoiceFilter(choices=YES_NO, method=apply, label=help_text)


class _Order(django_filters.OrderingFilter):
    """Ordered as asked, then newest id first: equal scores page in a stable order."""

    def filter(self, qs: QuerySet[ShadowPair], value: list[str] | None) -> QuerySet[ShadowPair]:
        ordered = super().filter(qs, value)
        return ordered.order_by(*ordered.query.order_by, "-id") if value else ordered


class RunFilter(FilterSet):
    plan = django_filters.CharFilter(field_name="plan__name", label="plan name")
    status = django_filters.ChoiceFilter(choices=ShadowRun.Status.choices)
    mode = django_filters.ChoiceFilter(choices=ShadowRun.Mode.choices)
    candidate = django_filters.CharFilter(field_name="candidate__name",
                                          label="candidate pool name")

    class Meta:
        model = ShadowRun
        fields = ["plan", "status", "mode", "candidate"]


class PairFilter(FilterSet):
    diverged = _flag("signal_diverged", "the candidate diverged from the primary")
    candidate_error = _flag("candidate_error", "the candidate answered an error")
    order = _Order(
        fields=["divergence_score", "received_at"],
        label="divergence_score, -divergence_score (most divergent first), received_at or "
              "-received_at (default: newest first)")

    class Meta:
        model = ShadowPair
        fields = ["diverged", "candidate_error"]
