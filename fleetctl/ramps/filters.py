"""The FilterSet of ramps, in one place for the API and the dashboard (the ramps page reads
its own form, which offers "active" as a state)."""

from __future__ import annotations

from django_filters import rest_framework as filters

from fleetctl.ramps.models import Ramp


class RampFilter(filters.FilterSet):
    route = filters.CharFilter(field_name="route__name", help_text="Route name.")
    pool = filters.CharFilter(field_name="pool__name", help_text="Candidate pool name.")
    plan = filters.CharFilter(field_name="plan__name", help_text="Plan name.")
    state = filters.ChoiceFilter(choices=Ramp.State.choices)

    class Meta:
        model = Ramp
        fields = ["route", "pool", "plan", "state"]
