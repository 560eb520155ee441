from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.accounts.models import ApiToken

# Marks the request a view is given while the API's schema is built (see
# accounts/api/viewsets.describing_request): the view is described, never run.
DESCRIBING_API = "fleetctl_describing_api"


def actor_from_request(request: Any) -> Actor:
    """The Actor behind a DRF or Django request (session user, personal or service token).
    For a view built to describe the API (schema generation), the platform itself: the
    caller's permissions are not checked and no refusal is audited, since nothing runs."""
    if getattr(request, DESCRIBING_API, False):
        return Actor.for_system("api-schema")
    token = getattr(request, "auth", None)
    token = token if isinstance(token, ApiToken) else None
    user = getattr(request, "user", None)
    is_service = token is not None and token.kind == ApiToken.Kind.SERVICE
    if is_service or not getattr(user, "is_authenticated", False):
        user = None
    return Actor(user=user, token=token, request_id=getattr(request, "request_id", ""))


class IsAuthenticatedActor(permissions.BasePermission):
    """401 without credentials; reads need the `read` permission (audited when refused).

    Writes are checked again, by name, inside the service they call.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        if request.method in permissions.SAFE_METHODS:
            actor_from_request(request).require(
                roles.READ, action=f"api.read:{request.path}"
            )
        return True
