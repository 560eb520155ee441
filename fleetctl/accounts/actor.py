"""Who is acting. Every service call takes an Actor and checks permissions through it, so the
dashboard, the REST API and the CLI cannot disagree about what someone may do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.accounts import roles
from fleetctl.core.errors import PermissionDeniedError
from fleetctl.core.requestid import current_request_id

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from fleetctl.accounts.models import ApiToken


def user_roles(user: AbstractBaseUser | None) -> frozenset[str]:
    if user is None or not getattr(user, "is_authenticated", False):
        return frozenset()
    if getattr(user, "is_superuser", False):
        return frozenset({roles.ADMIN})
    cached = getattr(user, "_fleetctl_roles", None)
    if cached is None:
        names = user.groups.values_list("name", flat=True)  # type: ignore[attr-defined]
        cached = frozenset(name for name in names if name in roles.ROLES)
        user._fleetctl_roles = cached  # type: ignore[attr-defined]
    return cached  # type: ignore[no-any-return]


@dataclass
class Actor:
    user: Any = None  # a django User, or None for service tokens and the system
    token: ApiToken | None = None
    system: str = ""  # e.g. "health-probe" for work the platform does by itself
    request_id: str = field(default_factory=current_request_id)

    @classmethod
    def for_system(cls, name: str) -> Actor:
        return cls(system=name)

    @property
    def label(self) -> str:
        if self.system:
            return f"system:{self.system}"
        if self.token is not None and self.user is None:
            return f"service:{self.token.name}"
        if self.user is not None:
            return str(self.user.get_username())
        return "anonymous"

    @property
    def roles(self) -> frozenset[str]:
        return user_roles(self.user)

    @property
    def permissions(self) -> frozenset[str]:
        if self.system:
            return roles.ALL_PERMISSIONS
        if self.token is not None:
            scoped = roles.permissions_for_scopes(self.token.scopes)
            if self.token.kind == "service":
                return scoped
            return scoped & roles.permissions_for_roles(self.roles)
        return roles.permissions_for_roles(self.roles)

    def can(self, permission: str) -> bool:
        return permission in self.permissions

    def require(self, permission: str, *, action: str, target: object | None = None) -> None:
        """Raise PermissionDeniedError (and audit the attempt) unless this actor may do it."""
        if self.can(permission):
            return
        from fleetctl.audit.services import audit_denied

        audit_denied(actor=self, action=action, target=target, permission=permission)
        raise PermissionDeniedError(self.denial_message(permission))

    def denial_message(self, permission: str) -> str:
        if self.token is not None and permission in roles.NEVER_FOR_TOKENS:
            return f"'{permission}' cannot be done with an API token; sign in to the dashboard."
        if self.token is not None and self.token.kind == "service":
            return (
                f"This service token lacks the scope for '{permission}'. "
                f"Its scopes: {', '.join(self.token.scopes) or 'none'}."
            )
        held = ", ".join(sorted(self.roles)) or "no role"
        message = f"'{permission}' needs a role that grants it; you have {held}."
        if self.token is not None and roles.permissions_for_roles(self.roles) & {permission}:
            message = (
                f"Your role allows '{permission}' but this token's scopes "
                f"({', '.join(self.token.scopes) or 'none'}) do not."
            )
        return message
