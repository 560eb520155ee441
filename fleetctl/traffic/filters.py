"""The traffic app's FilterSets, in one place for the API and any page listing the same rows.
The gateway kinds come from the kind registry."""

from __future__ import annotations

from typing import Any

from django_filters import rest_framework as filters

from fleetctl.traffic.gateways import registry
from fleetctl.traffic.models import Gateway


class GatewayFilter(filters.FilterSet):
    # The kinds known when the schema is built; each request asks the registry again.
    kind = filters.ChoiceFilter(choices=registry.choices())

    class Meta:
        model = Gateway
        fields = ["kind", "state"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.filters["kind"].extra["choices"] = registry.choices()
