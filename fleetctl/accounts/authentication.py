from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from axes.helpers import get_client_user_agent
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from fleetctl.accounts import throttle
from fleetctl.accounts.models import ApiToken
from fleetctl.accounts.selectors import token_find_by_secret
from fleetctl.accounts.services import token_auth_refused, token_auth_throttled, token_touch


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


def _refusal(token: ApiToken | None) -> str:
    """Why this token may not authenticate ('' when it may)."""
    if token is None:
        return "Unknown API token."
    if token.revoked_at is not None:
        return "This API token was revoked."
    if not token.is_usable():
        return "This API token has expired."
    if token.kind == ApiToken.Kind.PERSONAL and (token.user is None or not token.user.is_active):
        return "The owner of this token is inactive."
    return ""


class TokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        parts = header.split()
        if not parts or parts[0].lower() not in ("bearer", "token"):
            return None
        ip = throttle.client_ip(request)
        # Decide only after the same work for every bearer request: hash what was presented,
        # look the hash up (one indexed query), read the address's block (one cache read).
        # A blocked address then still lets a valid token through (someone else's guesses
        # from a shared NAT must not lock an on-call out of a drain), and timing does not say
        # which tokens exist: there is no early 429 that skips the lookup for blocked
        # addresses, and a lookup by SHA-256 of the whole secret says nothing about a
        # neighbouring guess. An invalid token from a blocked address is answered 429, not
        # counted or audited again (the block was audited when it began).
        token = token_find_by_secret(secret=parts[1]) if len(parts) == 2 else None
        refusal = _refusal(token)
        wait = throttle.blocked_for(ip)
        if refusal or token is None:
            if wait:
                raise exceptions.Throttled(wait=wait, detail=(
                    f"Too many invalid API tokens from {ip}; invalid bearer tokens from this "
                    f"address are refused for {wait} more seconds."))
            if len(parts) != 2:
                raise exceptions.AuthenticationFailed(
                    "Malformed Authorization header; send 'Authorization: Bearer <token>'."
                )
            self._count_failure(request, ip=ip, presented=parts[1], token=token, reason=refusal)
            raise exceptions.AuthenticationFailed(refusal)
        token_touch(token=token)
        if token.kind == ApiToken.Kind.PERSONAL:
            return token.user, token
        return ServicePrincipal(token), token

    def _count_failure(self, request: Request, *, ip: str, presented: str,
                       token: ApiToken | None, reason: str) -> None:
        failures, blocked_until = throttle.failure_count(ip)
        user_agent = get_client_user_agent(request)
        token_auth_refused(presented=presented, token=token, reason=reason, ip_address=ip,
                           user_agent=user_agent, failures=failures)
        if blocked_until is not None:
            token_auth_throttled(ip_address=ip, user_agent=user_agent, failures=failures,
                                 until=datetime.fromtimestamp(blocked_until, tz=UTC))

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Declares bearer tokens in the OpenAPI schema (and Swagger UI's Authorize button)."""

    target_class = TokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer",
                "description": "An API token (fct_…) from the Tokens page or /api/v1/tokens/."}
