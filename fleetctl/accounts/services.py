from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.accounts.models import ApiToken
from fleetctl.accounts.selectors import login_locked_until, secret_hash
from fleetctl.audit.services import audit_auth_refused, audit_record, snapshot
from fleetctl.core.errors import ConflictError, NotFoundError

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


def _issue(actor: Actor, action: str, *, name: str, scopes: list[str],
           expires_at: datetime | None, **fields: object) -> IssuedToken:
    """A new token (its secret is shown this once), audited as `action`; the name, scopes
    and expiry are checked first."""
    _validate_token_input(name=name, scopes=scopes, expires_at=expires_at)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            prefix=secret[: len(TOKEN_PREFIX) + 6], secret_sha256=secret_hash(secret),
            name=name.strip(), created_by=actor.user, scopes=sorted(set(scopes)),
            expires_at=expires_at, **fields,
        )
        audit_record(actor=actor, action=action, target=token,
                     after=snapshot(token, _SNAPSHOT_FIELDS))
    return IssuedToken(token=token, secret=secret)


def token_create_personal(
    *, actor: Actor, name: str, scopes: list[str], expires_at: datetime | None = None
) -> IssuedToken:
    actor.require(roles.TOKENS_OWN, action="token.create")
    return _issue(actor, "token.create", name=name, scopes=scopes, expires_at=expires_at,
                  kind=ApiToken.Kind.PERSONAL, user=actor.user)


def token_create_service(
    *, actor: Actor, name: str, scopes: list[str], expires_at: datetime | None = None
) -> IssuedToken:
    actor.require(roles.ADMIN_MANAGE, action="token.create_service")
    return _issue(actor, "token.create_service", name=name, scopes=scopes,
                  expires_at=expires_at, kind=ApiToken.Kind.SERVICE, user=None)


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


NO_CURRENT_TOKEN = (
    "This request was not made with an API token, so there is no current token. Send "
    "`Authorization: Bearer <token>`, or revoke one of your tokens by id "
    "(DELETE /api/v1/tokens/{id}/) or on the Tokens page."
)


def token_revoke_current(*, actor: Actor) -> ApiToken:
    """Revoke the token this request was made with. Needs no permission beyond holding the
    token: whoever can use it may end it (a leaked token should be easy to kill), personal
    or service alike."""
    if actor.token is None:
        raise ValidationError(NO_CURRENT_TOKEN)
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().get(pk=actor.token.pk)
        before = snapshot(token, _SNAPSHOT_FIELDS)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
        audit_record(
            actor=actor, action="token.revoke", target=token, before=before,
            after=snapshot(token, _SNAPSHOT_FIELDS), message="revoked with itself",
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
    target = _login_target(username)
    if not while_locked and getattr(target, "is_active", True) is False:
        # Django refuses a disabled person whatever the password; say so, not "wrong".
        message = f"Sign-in as {username!r} from {ip_address} refused: the account is disabled."
    audit_auth_refused(action="auth.login_failed", target=target,
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


def user_set_roles(*, actor: Actor, username: str, role_names: list[str]) -> Any:
    actor.require(roles.ADMIN_MANAGE, action="user.set_roles", target=username)
    _check_roles(role_names)
    user = _person(username)
    with transaction.atomic():
        _lock_admin_count()
        before = sorted(user.groups.filter(name__in=roles.ROLES).values_list("name", flat=True))
        if roles.ADMIN in before and roles.ADMIN not in role_names and not user.is_superuser:
            _refuse_last_admin(user, losing="taking their admin role away")
        keep = user.groups.exclude(name__in=roles.ROLES)
        user.groups.set([*keep, *Group.objects.filter(name__in=role_names)])
        user._fleetctl_roles = None  # the Actor's cached roles are stale now
        after = sorted(set(role_names))
        if before != after:
            audit_record(
                actor=actor, action="user.set_roles", target=user,
                before={"roles": before}, after={"roles": after},
            )
    return user


# --- people: invite, disable / enable, roles (admins only, audited) ---------------------------

_PERSON_FIELDS = ["id", "username", "email", "is_active", "is_superuser"]
_EMAIL_MAX = 254


@dataclass(frozen=True)
class InvitedPerson:
    user: Any
    set_password_path: str  # shown once; it stops working once a password is set


def _person_snapshot(user: Any) -> dict[str, Any]:
    picture = snapshot(user, _PERSON_FIELDS)
    picture["roles"] = sorted(
        user.groups.filter(name__in=roles.ROLES).values_list("name", flat=True))
    return picture


def _check_roles(role_names: list[str]) -> None:
    unknown = sorted(set(role_names) - set(roles.ROLES))
    if unknown:
        raise ValidationError(
            {"roles": [f"Unknown role(s) {', '.join(unknown)}; roles: {', '.join(roles.ROLES)}."]}
        )


def _person(username: str) -> Any:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFoundError(f"No person named {username!r}.")
    return user


def _active_admin_ids() -> set[int]:
    """People who may act as admin now: active, and in the admin role or superusers. Called
    with the admin group's row locked, so two admins demoting each other cannot both pass."""
    model = get_user_model()
    return set(
        model.objects.filter(is_active=True)
        .filter(Q(groups__name=roles.ADMIN) | Q(is_superuser=True))
        .values_list("pk", flat=True)
    )


def _lock_admin_count() -> None:
    roles_ensure_groups()
    Group.objects.select_for_update().get(name=roles.ADMIN)


def _refuse_last_admin(user: Any, *, losing: str) -> None:
    admins = _active_admin_ids()
    if user.pk in admins and admins == {user.pk}:
        raise ConflictError(
            f"{user.get_username()} is the last active admin; {losing} would leave nobody "
            f"who can manage people. Make someone else an admin first."
        )


def set_password_path(user: Any) -> str:
    """The one-time link that lets a person choose their password. It is derived from the
    person's current password hash and last sign-in, so it stops working once used (and after
    settings.PASSWORD_RESET_TIMEOUT); nothing about it is stored."""
    from django.contrib.auth.tokens import default_token_generator
    from django.urls import reverse
    from django.utils.encoding import force_bytes
    from django.utils.http import urlsafe_base64_encode

    return reverse("accounts:set-password", kwargs={
        "uidb64": urlsafe_base64_encode(force_bytes(user.pk)),
        "token": default_token_generator.make_token(user),
    })


def _validate_invite(*, username: str, email: str, role_names: list[str]) -> None:
    from django.contrib.auth.validators import UnicodeUsernameValidator
    from django.core.validators import validate_email

    errors: dict[str, list[str]] = {}
    model = get_user_model()
    if not username:
        errors["username"] = ["Give the person a username to sign in with."]
    elif len(username) > 150:
        errors["username"] = ["Keep the username to 150 characters or fewer."]
    else:
        try:
            UnicodeUsernameValidator()(username)
        except ValidationError:
            errors["username"] = ["Use letters, digits and @ . + - _ only (no spaces)."]
        else:
            if model.objects.filter(username__iexact=username).exists():
                errors["username"] = [f"Someone is already called {username!r}."]
    if not email:
        errors["email"] = ["Give an email address, so people can tell who this is."]
    else:
        try:
            validate_email(email)
        except ValidationError:
            errors["email"] = [f"{email!r} is not an email address."]
        else:
            if len(email) > _EMAIL_MAX:
                errors["email"] = [f"Keep the email to {_EMAIL_MAX} characters or fewer."]
            elif model.objects.filter(email__iexact=email).exists():
                errors["email"] = [f"{email} already belongs to someone."]
    try:
        _check_roles(role_names)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    else:
        if not role_names:
            errors["roles"] = [f"Pick at least one role of: {', '.join(roles.ROLES)}."]
    if errors:
        raise ValidationError(errors)


def person_invite(*, actor: Actor, username: str, email: str,
                  role_names: list[str]) -> InvitedPerson:
    """Create a person with the given roles and no password yet. The answer carries a
    one-time set-password link for the admin to hand over (fleetctl sends no email)."""
    actor.require(roles.ADMIN_MANAGE, action="person.invite", target=username)
    username, email = username.strip(), email.strip()
    _validate_invite(username=username, email=email, role_names=role_names)
    with transaction.atomic():
        roles_ensure_groups()
        user = get_user_model().objects.create_user(username=username, email=email)
        user.set_unusable_password()
        user.save(update_fields=["password"])
        user.groups.set(Group.objects.filter(name__in=role_names))
        audit_record(actor=actor, action="person.invite", target=user,
                     after=_person_snapshot(user),
                     message="invited; a one-time set-password link was shown to the inviter")
    return InvitedPerson(user=user, set_password_path=set_password_path(user))


def person_set_password_link(*, actor: Actor, username: str) -> InvitedPerson:
    """A fresh one-time set-password link (for someone who lost theirs or forgot their
    password). Their current password keeps working until they use it."""
    actor.require(roles.ADMIN_MANAGE, action="person.set_password_link", target=username)
    user = _person(username)
    if not user.is_active:
        raise ConflictError(f"{username} is disabled; enable them before sending a link.")
    audit_record(actor=actor, action="person.set_password_link", target=user,
                 message="a one-time set-password link was shown to the admin")
    return InvitedPerson(user=user, set_password_path=set_password_path(user))


def person_set_active(*, actor: Actor, username: str, active: bool) -> Any:
    """Disable (cannot sign in, sessions end, personal tokens answer 401) or enable a person.
    Their rows, tokens and history stay."""
    action = "person.enable" if active else "person.disable"
    actor.require(roles.ADMIN_MANAGE, action=action, target=username)
    user = _person(username)
    if not active and user.pk == getattr(actor.user, "pk", None):
        raise ConflictError("You cannot disable yourself; ask another admin.")
    with transaction.atomic():
        _lock_admin_count()
        user = get_user_model().objects.select_for_update().get(pk=user.pk)
        if user.is_active == active:
            return user
        if not active:
            _refuse_last_admin(user, losing="disabling them")
        before = _person_snapshot(user)
        user.is_active = active
        user.save(update_fields=["is_active"])
        audit_record(actor=actor, action=action, target=user,
                     before=before, after=_person_snapshot(user))
    return user


def person_update(*, actor: Actor, username: str, role_names: list[str] | None = None,
                  active: bool | None = None) -> Any:
    """Set roles and/or active in one go: both change or neither does."""
    actor.require(roles.ADMIN_MANAGE, action="person.update", target=username)
    if role_names is None and active is None:
        raise ValidationError("Send `roles`, `active` or both.")
    with transaction.atomic():
        user: Any = _person(username)
        if role_names is not None:
            user = user_set_roles(actor=actor, username=username, role_names=role_names)
        if active is not None:
            user = person_set_active(actor=actor, username=username, active=active)
    return user
