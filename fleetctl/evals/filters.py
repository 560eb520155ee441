"""FilterSets for eval suites, runs, a suite's items and a run's results. The filters a page
also has (a tag, the item diff's direction and text) apply the selectors' own, so the API and
the dashboard filter alike on PostgreSQL and on the demo's SQLite; the true/false filters
refuse anything else, since a typo that filtered nothing would look like a filter that
matched every row."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from fleetctl.evals import selectors
from fleetctl.evals.models import EvalItem, EvalResult, EvalRun, EvalSuite

YES_NO = [("true", "true"), ("false", "false")]


def _has_tag(field: str) -> django_filters.CharFilter:
    def apply(queryset: QuerySet, name: str, value: str) -> QuerySet:  # type: ignore[type-arg]
        return selectors.has_tag(queryset, field, value)

    return django_filters.CharFilter(method=apply, max_length=64,
                                     label="only rows with this tag (exact)")


class SuiteFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(field_name="name", label="suite name (every version)")
    source = django_filters.ChoiceFilter(choices=EvalSuite.Source.choices)
    retired = django_filters.ChoiceFilter(
        choices=YES_NO, method="_retired",
        label="true: retired suites only; false: suites that can still start runs")

    class Meta:
        model = EvalSuite
        fields = ["name", "source", "retired"]

    def _retired(self, queryset: QuerySet[EvalSuite], name: str, value: str
                 ) -> QuerySet[EvalSuite]:
        return queryset.filter(retired_at__isnull=value != "true")


class ItemFilter(django_filters.FilterSet):
    tag = _has_tag("tags")
    scorer = django_filters.CharFilter(field_name="scorer", max_length=32)

    class Meta:
        model = EvalItem
        fields = ["tag", "scorer"]


class RunFilter(django_filters.FilterSet):
    plan = django_filters.CharFilter(field_name="plan__name", label="plan name")
    status = django_filters.ChoiceFilter(choices=EvalRun.Status.choices)
    verdict = django_filters.ChoiceFilter(choices=EvalRun.Verdict.choices)
    suite = django_filters.CharFilter(field_name="suite__name",
                                      label="suite name (any version)")
    pool = django_filters.CharFilter(field_name="run_pools__pool__name", distinct=True,
                                     label="a pool the run scores (any role)")

    class Meta:
        model = EvalRun
        fields = ["plan", "status", "verdict", "suite", "pool"]


class ResultFilter(django_filters.FilterSet):
    pool = django_filters.CharFilter(field_name="run_pool__pool__name", label="pool name")
    status = django_filters.ChoiceFilter(choices=EvalResult.Status.choices)
    tag = _has_tag("item__tags")
    item = django_filters.CharFilter(field_name="item__item_id", max_length=200,
                                     label="the item's id in its suite")
    score = django_filters.NumberFilter(field_name="score", label="exactly this score")
    max_score = django_filters.NumberFilter(field_name="score", lookup_expr="lte",
                                            label="scores at most this (0 for the misses)")
    min_score = django_filters.NumberFilter(field_name="score", lookup_expr="gte",
                                            label="scores at least this")

    class Meta:
        model = EvalResult
        fields = ["pool", "status", "tag", "item", "score", "max_score", "min_score"]


class DiffFilter(django_filters.FilterSet):
    """On selectors.diff(run): the candidate's results annotated with the primary's."""

    direction = django_filters.ChoiceFilter(
        choices=[("regressed", "regressed"), ("improved", "improved")], method="_direction",
        label="regressed: the candidate scored lower than the primary; improved: higher")
    tag = _has_tag("item__tags")
    q = django_filters.CharFilter(method="_search", max_length=200,
                                  label="text in the item id, its prompt or either answer")

    class Meta:
        model = EvalResult
        fields = ["direction", "tag", "q"]

    def _direction(self, queryset: QuerySet[EvalResult], name: str, value: str
                   ) -> QuerySet[EvalResult]:
        return selectors.diff_direction(queryset, value)

    def _search(self, queryset: QuerySet[EvalResult], name: str, value: str
                ) -> QuerySet[EvalResult]:
        return selectors.diff_search(queryset, value)
