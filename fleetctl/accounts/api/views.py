from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts import selectors, services
from fleetctl.accounts.api.serializers import (
    MeSerializer,
    TokenCreateSerializer,
    TokenIssuedSerializer,
    TokenSerializer,
)
from fleetctl.accounts.models import ApiToken
from fleetctl.accounts.permissions import actor_from_request


class _TokenViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = TokenSerializer
    create_service: Any

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return TokenCreateSerializer if self.action == "create" else TokenSerializer

    @extend_schema(request=TokenCreateSerializer, responses={201: TokenIssuedSerializer})
    def create(self, request: Request) -> Response:
        """Create a token. The response carries the secret once; only its hash is stored."""
        serializer = TokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        issued = type(self).create_service(
            actor=actor_from_request(request), **serializer.validated_data
        )
        body = TokenSerializer(issued.token).data | {"secret": issued.secret}
        return Response(body, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: ApiToken) -> None:
        """Revoke (the row stays, marked revoked, for the audit trail)."""
        services.token_revoke(actor=actor_from_request(self.request), token_id=instance.pk)


class TokenViewSet(_TokenViewSet):
    """Your own personal tokens. They act as you, limited to their scopes."""

    create_service = services.token_create_personal

    def get_queryset(self) -> QuerySet[ApiToken]:
        return selectors.token_list_for_user(user=actor_from_request(self.request).user)


class ServiceTokenViewSet(_TokenViewSet):
    """Service tokens for automation (admin only): no person behind them, scopes decide."""

    create_service = services.token_create_service

    def get_queryset(self) -> QuerySet[ApiToken]:
        from fleetctl.accounts import roles

        actor_from_request(self.request).require(
            roles.ADMIN_MANAGE, action="token.list_service"
        )
        return selectors.token_list_service()


@extend_schema(responses=MeSerializer)
@api_view(["GET"])
def me(request: Request) -> Response:
    """Who the API thinks you are, your roles, and what you may do with these credentials."""
    actor = actor_from_request(request)
    token = actor.token
    return Response(MeSerializer({
        "username": actor.label,
        "roles": sorted(actor.roles),
        "permissions": sorted(actor.permissions),
        "token": token,
    }).data)
