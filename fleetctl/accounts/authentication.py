from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from fleetctl.accounts.models import ApiToken
from fleetctl.accounts.selectors import token_find_by_secret
from fleetctl.accounts.services import token_touch


class ServicePrincipal:
    """The request.user of a service token: authenticated, but no person and no roles."""

    is_authenticated = True
    is_active = True
    is_anonymous = False
    is_superuser = False
    is_staff = False
    pk = None

    def __init__(self, token: ApiToken) -> None:
        self.token = token

    def get_username(self) -> str:
        return f"service:{self.token.name}"

    def __str__(self) -> str:
        return self.get_username()


class TokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if parts[0].lower() not in ("bearer", "token"):
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header; send 'Authorization: Bearer <token>'."
            )
        token = token_find_by_secret(secret=parts[1])
        if token is None:
            raise exceptions.AuthenticationFailed("Unknown API token.")
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This API token was revoked.")
        if not token.is_usable():
            raise exceptions.AuthenticationFailed("This API token has expired.")
        token_touch(token=token)
        if token.kind == ApiToken.Kind.PERSONAL:
            if token.user is None or not token.user.is_active:
                raise exceptions.AuthenticationFailed("The owner of this token is inactive.")
            return token.user, token
        return ServicePrincipal(token), token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
