from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.api.viewsets import ServiceModelViewSet
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.webhooks import selectors, services
from fleetctl.webhooks.api import serializers


class WebhookViewSet(ServiceModelViewSet):
    """Outgoing webhooks (scope `fleet` to change them): which events go where, in which
    format; each delivery and its attempts."""

    queryset = selectors.webhook_list()
    serializer_class = serializers.WebhookSerializer
    # Not `format`: DRF reads ?format= itself (which renderer answers) before any filter.
    filterset_fields = ["active"]
    lookup_field = "name"
    instance_kwarg = "webhook"
    create_service = services.webhook_create
    update_service = services.webhook_update
    delete_service = services.webhook_delete

    @extend_schema(responses={200: serializers.DeliverySerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def deliveries(self, request: Request, name: str) -> Response:
        """This webhook's deliveries, newest first, each with its attempts."""
        hook = self.get_object()
        page = self.paginate_queryset(selectors.deliveries_for(webhook=hook))
        return self.get_paginated_response(serializers.DeliverySerializer(page, many=True).data)

    @extend_schema(request=None, responses={202: serializers.DeliverySerializer})
    @action(detail=True, methods=["post"], filter_backends=[])
    def test(self, request: Request, name: str) -> Response:
        """Send a `webhook.test` delivery to this webhook now (scope `fleet`); follow it at
        its deliveries."""
        delivery = services.webhook_test(actor=actor_from_request(request),
                                         webhook=self.get_object())
        return Response(serializers.DeliverySerializer(delivery).data,
                        status=status.HTTP_202_ACCEPTED)
