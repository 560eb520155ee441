from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.accounts.models import ApiToken
from fleetctl.accounts.selectors import login_locked_until, secret_hash
from fleetctl.audit.services import audit_auth_refused, audit_record, snapshot
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


# --- refused credentials: audited with who was tried and from where, never the password or a
# --- token's secret (only the short prefix every token already shows) -----------------------

def _client(username: str | None, ip_address: str, user_agent: str) -> dict[str, str]:
    shown = {"ip_address": ip_address, "user_agent": user_agent[:255]}
    return shown if username is None else {"username": username[:150], **shown}


def _login_target(username: str) -> object:
    return get_user_model().objects.filter(username=username).first() or username


def login_failure_record(*, username: str, ip_address: str, user_agent: str,
                         while_locked: bool) -> None:
    """A sign-in that failed: a wrong username or password, or any attempt while locked out."""
    if while_locked:
        until = login_locked_until(username=username, ip_address=ip_address)
        message = (f"Sign-in as {username!r} from {ip_address} refused: locked out"
                   + (f" until {until:%Y-%m-%d %H:%M:%S} UTC." if until else "."))
    else:
        message = f"Wrong username or password for {username!r} from {ip_address}."
    audit_auth_refused(action="auth.login_failed", target=_login_target(username),
                       message=message, details=_client(username, ip_address, user_agent))


def login_lockout_record(*, username: str, ip_address: str, user_agent: str) -> None:
    """The failure that locked a username out from one address."""
    until = login_locked_until(username=username, ip_address=ip_address)
    message = (f"{username!r} locked out from {ip_address} after "
               f"{settings.AXES_FAILURE_LIMIT} failed sign-ins"
               + (f" until {until:%Y-%m-%d %H:%M:%S} UTC" if until else "")
               + f"; an admin can unlock it: manage.py axes_reset_ip_username {ip_address} "
                 f"{username}")
    audit_auth_refused(action="auth.lockout", target=_login_target(username), message=message,
                       details=_client(username, ip_address, user_agent))


def _visible_prefix(presented: str) -> str:
    """What of a presented secret may be recorded: the prefix our tokens show anyway, and only
    for something shaped like one of our tokens (not, say, a password pasted by mistake)."""
    if not presented.startswith(TOKEN_PREFIX):
        return ""
    return presented[: len(TOKEN_PREFIX) + 6]


def token_auth_refused(*, presented: str, token: ApiToken | None, reason: str,
                       ip_address: str, user_agent: str, failures: int) -> None:
    prefix = token.prefix if token is not None else _visible_prefix(presented)
    target: object = token if token is not None else (
        f"unknown token {prefix}…" if prefix else "a credential that is not a fleetctl token")
    audit_auth_refused(action="auth.token_failed", target=target, token_prefix=prefix,
                       message=f"{reason} (from {ip_address})",
                       details={**_client(None, ip_address, user_agent),
                                "failures_in_window": failures})


def token_auth_throttled(*, ip_address: str, user_agent: str, failures: int,
                         until: datetime) -> None:
    audit_auth_refused(
        action="auth.token_throttled", target=ip_address,
        message=(f"{failures} invalid API tokens from {ip_address} within "
                 f"{settings.API_AUTH_FAILURE_WINDOW_S} s: bearer tokens from it are refused "
                 f"(429) until {until:%Y-%m-%d %H:%M:%S} UTC."),
        details={**_client(None, ip_address, user_agent), "failures": failures})


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
