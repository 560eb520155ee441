from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.accounts.models import ApiToken
from fleetctl.accounts.selectors import secret_hash
from fleetctl.audit.services import audit_record, snapshot
from fleetctl.core.errors import NotFoundError

TOKEN_PREFIX = "fct_"
_SNAPSHOT_FIELDS = ["id", "kind", "name", "user", "scopes", "prefix", "expires_at", "revoked_at"]


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # shown once, never stored


def _validate_token_input(*, name: str, scopes: list[str], expires_at: datetime | None) -> None:
    errors: dict[str, list[str]] = {}
    if not name.strip():
        errors["name"] = ["Give the token a name that says where it is used."]
    elif len(name) > 100:
        errors["name"] = ["Keep the name under 100 characters."]
    unknown = sorted(set(scopes) - set(roles.SCOPES))
    if not scopes:
        errors["scopes"] = [f"Pick at least one scope of: {', '.join(roles.SCOPES)}."]
    elif unknown:
        errors["scopes"] = [
            f"Unknown scope(s) {', '.join(unknown)}; valid scopes: {', '.join(roles.SCOPES)}."
        ]
    if expires_at is not None and expires_at <= timezone.now():
        errors["expires_at"] = ["The expiry must be in the future."]
    if errors:
        raise ValidationError(errors)


def _issue(**fields: object) -> IssuedToken:
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        prefix=secret[: len(TOKEN_PREFIX) + 6], secret_sha256=secret_hash(secret), **fields
    )
    return IssuedToken(token=token, secret=secret)


def token_create_personal(
    *, actor: Actor, name: str, scopes: list[str], expires_at: datetime | None = None
) -> IssuedToken:
    actor.require(roles.TOKENS_OWN, action="token.create")
    _validate_token_input(name=name, scopes=scopes, expires_at=expires_at)
    with transaction.atomic():
        issued = _issue(
            kind=ApiToken.Kind.PERSONAL, name=name.strip(), user=actor.user,
            created_by=actor.user, scopes=sorted(set(scopes)), expires_at=expires_at,
        )
        audit_record(
            actor=actor, action="token.create", target=issued.token,
            after=snapshot(issued.token, _SNAPSHOT_FIELDS),
        )
    return issued


def token_create_service(
    *, actor: Actor, name: str, scopes: list[str], expires_at: datetime | None = None
) -> IssuedToken:
    actor.require(roles.ADMIN_MANAGE, action="token.create_service")
    _validate_token_input(name=name, scopes=scopes, expires_at=expires_at)
    with transaction.atomic():
        issued = _issue(
            kind=ApiToken.Kind.SERVICE, name=name.strip(), user=None,
            created_by=actor.user, scopes=sorted(set(scopes)), expires_at=expires_at,
        )
        audit_record(
            actor=actor, action="token.create_service", target=issued.token,
            after=snapshot(issued.token, _SNAPSHOT_FIELDS),
        )
    return issued


def token_revoke(*, actor: Actor, token_id: int) -> ApiToken:
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None:
        raise NotFoundError(f"No token with id {token_id}.")
    own = token.kind == ApiToken.Kind.PERSONAL and token.user_id == getattr(actor.user, "pk", None)
    needed = roles.TOKENS_OWN if own else roles.ADMIN_MANAGE
    actor.require(needed, action="token.revoke", target=token)
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().get(pk=token_id)
        before = snapshot(token, _SNAPSHOT_FIELDS)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
        audit_record(
            actor=actor, action="token.revoke", target=token,
            before=before, after=snapshot(token, _SNAPSHOT_FIELDS),
        )
    return token


def token_touch(*, token: ApiToken) -> None:
    """Record use at most once a minute, so reads don't turn into a write per request."""
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now


def roles_ensure_groups() -> None:
    for name in roles.ROLES:
        Group.objects.get_or_create(name=name)


def user_set_roles(*, actor: Actor, username: str, role_names: list[str]) -> object:
    actor.require(roles.ADMIN_MANAGE, action="user.set_roles")
    unknown = sorted(set(role_names) - set(roles.ROLES))
    if unknown:
        raise ValidationError(
            {"roles": [f"Unknown role(s) {', '.join(unknown)}; roles: {', '.join(roles.ROLES)}."]}
        )
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFoundError(f"No user named {username!r}.")
    with transaction.atomic():
        roles_ensure_groups()
        before = sorted(user.groups.filter(name__in=roles.ROLES).values_list("name", flat=True))
        keep = user.groups.exclude(name__in=roles.ROLES)
        user.groups.set([*keep, *Group.objects.filter(name__in=role_names)])
        audit_record(
            actor=actor, action="user.set_roles", target=user,
            before={"roles": before}, after={"roles": sorted(set(role_names))},
        )
    return user
