"""People and roles over the API (admins, signed in: `admin.manage` is never granted to a
token, so a leaked token cannot make people or hand out roles), and the token that revokes
itself (any token, no scope needed)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts import roles, selectors, services
from fleetctl.accounts.api.serializers import TokenSerializer
from fleetctl.accounts.permissions import actor_from_request

ROLES_HELP = f"Any of: {', '.join(roles.ROLES)}."
ROLE_NAMES = roles.ROLES  # class bodies below have a field called `roles`


class _NoUnknownFields(serializers.Serializer):
    """Refuse fields this endpoint does not take, rather than ignore them silently."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(getattr(self, "initial_data", {}) or {}) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({
                name: [f"Unknown field; this endpoint takes: {', '.join(self.fields)}."]
                for name in unknown
            })
        return attrs


class PersonSerializer(serializers.Serializer):
    username = serializers.CharField(read_only=True)
    email = serializers.EmailField(read_only=True)
    roles = serializers.SerializerMethodField()
    active = serializers.BooleanField(source="is_active", read_only=True)
    superuser = serializers.BooleanField(
        source="is_superuser", read_only=True,
        help_text="A Django superuser acts as admin whatever `roles` says.")
    has_password = serializers.SerializerMethodField(
        help_text="False for someone invited who has not chosen a password yet.")
    last_login = serializers.DateTimeField(read_only=True, allow_null=True)
    date_joined = serializers.DateTimeField(read_only=True)
    tokens_active = serializers.IntegerField(
        read_only=True, help_text="Personal tokens that are neither revoked nor expired.")

    @extend_schema_field(serializers.ListField(child=serializers.ChoiceField(ROLE_NAMES)))
    def get_roles(self, user: Any) -> list[str]:
        return selectors.person_roles(user)

    def get_has_password(self, user: Any) -> bool:
        return bool(user.has_usable_password())


class PersonInvitedSerializer(PersonSerializer):
    set_password_url = serializers.CharField(
        read_only=True, help_text="Shown once: hand it to the person; it stops working once "
                                  "they have set a password (fleetctl sends no email).")


class PersonCreateSerializer(_NoUnknownFields):
    username = serializers.CharField(max_length=150)
    email = serializers.EmailField(max_length=254)
    roles = serializers.ListField(
        child=serializers.ChoiceField(choices=roles.ROLES), min_length=1, help_text=ROLES_HELP,
        error_messages={"min_length": f"Pick at least one role of: {', '.join(roles.ROLES)}."},
    )


class PersonUpdateSerializer(_NoUnknownFields):
    roles = serializers.ListField(
        child=serializers.ChoiceField(choices=roles.ROLES), required=False,
        help_text=f"{ROLES_HELP} Replaces the person's roles; [] removes them all.")
    active = serializers.BooleanField(
        required=False, help_text="false disables (no sign-in, tokens answer 401); true enables.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if not attrs:
            raise serializers.ValidationError("Send `roles`, `active` or both.")
        return attrs


@extend_schema_view(
    list=extend_schema(summary="Everyone who can sign in (admins)"),
    retrieve=extend_schema(summary="One person (admins)"),
)
class PersonViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """People, their roles and whether they are enabled. Admins only, signed in (a token
    never carries `admin.manage`); every change is audited."""

    serializer_class = PersonSerializer
    lookup_field = "username"
    lookup_value_regex = r"[\w.@+-]+"
    http_method_names = ["get", "post", "patch", "head", "options"]
    filterset_fields: list[str] = []
    ordering_fields = ["username", "last_login", "date_joined"]

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):
            # Building the schema reads no one and checks nothing (a refusal would be audited).
            return selectors.person_list().none()
        actor_from_request(self.request).require(roles.ADMIN_MANAGE, action="person.list")
        return selectors.person_list()

    @extend_schema(summary="Invite someone", request=PersonCreateSerializer,
                   responses={201: PersonInvitedSerializer})
    def create(self, request: Request) -> Response:
        """Create a person with roles and no password; the answer carries a one-time
        set-password link (shown once)."""
        body = PersonCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        invited = services.person_invite(
            actor=actor_from_request(request), username=body.validated_data["username"],
            email=body.validated_data["email"], role_names=body.validated_data["roles"])
        person = selectors.person_get(username=invited.user.username)
        data = PersonSerializer(person).data | {
            "set_password_url": request.build_absolute_uri(invited.set_password_path)}
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(summary="Set roles and/or enable or disable", request=PersonUpdateSerializer,
                   responses={200: PersonSerializer})
    def partial_update(self, request: Request, username: str) -> Response:
        """Both change or neither does. 409 when it would disable yourself or leave no active
        admin."""
        body = PersonUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.person_update(
            actor=actor_from_request(request), username=username,
            role_names=body.validated_data.get("roles"),
            active=body.validated_data.get("active"))
        return Response(PersonSerializer(selectors.person_get(username=username)).data)


@extend_schema(
    methods=["GET"], summary="The token this request is made with",
    responses={200: TokenSerializer},
)
@extend_schema(
    methods=["DELETE"], summary="Revoke the token this request is made with",
    request=None, responses={204: OpenApiResponse(description="Revoked; it now answers 401.")},
)
@api_view(["GET", "DELETE"])
def token_current(request: Request) -> Response:
    """DELETE revokes the token that authenticates this request (personal or service; no
    scope needed). The next request with it answers 401."""
    actor = actor_from_request(request)
    if request.method == "GET":
        if actor.token is None:
            raise DjangoValidationError(services.NO_CURRENT_TOKEN)
        return Response(TokenSerializer(actor.token).data)
    services.token_revoke_current(actor=actor)
    return Response(status=status.HTTP_204_NO_CONTENT)
