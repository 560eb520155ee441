import django_filters

from migrations_plan.models import Evidence, Plan


class PlanFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=Plan.State.choices)
    candidate_pool = django_filters.CharFilter(field_name="candidate_pool__name",
                                               label="candidate pool name")
    primary_pool = django_filters.CharFilter(field_name="primary_pool__name",
                                             label="primary pool name")
    route = django_filters.CharFilter(field_name="routes__name", distinct=True,
                                      label="route name")
    owner = django_filters.CharFilter(field_name="owner__username", label="owner's username")

    class Meta:
        model = Plan
        fields = ["state", "candidate_pool", "primary_pool", "route", "owner"]


class EvidenceFilter(django_filters.FilterSet):
    pool = django_filters.CharFilter(field_name="pool__name", label="pool name")
    route = django_filters.CharFilter(field_name="route__name", label="route name")
    since = django_filters.IsoDateTimeFilter(field_name="observed_at", lookup_expr="gte")

    class Meta:
        model = Evidence
        fields = ["kind", "pool", "route", "verdict", "model_id", "since", "about",
                  "reported_by"]
