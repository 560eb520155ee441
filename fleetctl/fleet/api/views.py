from __future__ import annotations

from rest_framework import viewsets

from fleetctl.accounts.api.viewsets import ServiceModelViewSet
from fleetctl.fleet import filters, selectors, services
from fleetctl.fleet.api import serializers


class RegionViewSet(ServiceModelViewSet):
    """Regions and their jurisdictions. Residency pins match jurisdictions, not region names."""

    queryset = selectors.region_list()
    serializer_class = serializers.RegionSerializer
    filterset_fields = ["jurisdiction", "code"]
    lookup_field = "code"
    instance_kwarg = "region"
    create_service = services.region_create
    update_service = services.region_update
    delete_service = services.region_delete


class PoolViewSet(ServiceModelViewSet):
    """Serving pools. Cost per 1M output tokens and health are derived and read-only."""

    queryset = selectors.pool_list()
    serializer_class = serializers.PoolSerializer
    filterset_class = filters.PoolFilter
    ordering_fields = ["name", "health_state", "cost_per_1m_output_tokens", "created_at"]
    lookup_field = "name"
    instance_kwarg = "pool"
    create_service = services.pool_create
    update_service = services.pool_update
    delete_service = services.pool_delete


class PoolModelViewSet(ServiceModelViewSet):
    """Which model each pool serves, at which revision and quantisation."""

    queryset = selectors.pool_model_list()
    serializer_class = serializers.PoolModelSerializer
    filterset_class = filters.PoolModelFilter
    instance_kwarg = "entry"
    create_service = services.pool_model_create
    update_service = services.pool_model_update
    delete_service = services.pool_model_delete


class HealthCheckViewSet(viewsets.ReadOnlyModelViewSet):
    """Every health probe: status, latency and the error when it failed."""

    queryset = selectors.health_check_list()
    serializer_class = serializers.HealthCheckSerializer
    filterset_class = filters.HealthCheckFilter
    ordering_fields = ["checked_at"]


class HealthTransitionViewSet(viewsets.ReadOnlyModelViewSet):
    """Every flip of a pool between healthy and unhealthy, with the reason."""

    queryset = selectors.health_transition_list()
    serializer_class = serializers.HealthTransitionSerializer
    filterset_class = filters.HealthTransitionFilter


class CurrencyRateViewSet(ServiceModelViewSet):
    """Dated exchange rates: 1 from_currency = rate to_currency as of a day. Costs of pools
    in different currencies are compared only through these (platform leads and admins
    write; everyone reads)."""

    queryset = selectors.currency_rate_list()
    serializer_class = serializers.CurrencyRateSerializer
    filterset_fields = ["from_currency", "to_currency", "as_of"]
    ordering_fields = ["as_of", "created_at"]
    instance_kwarg = "currency_rate"
    create_service = services.currency_rate_create
    update_service = services.currency_rate_update
    delete_service = services.currency_rate_delete
