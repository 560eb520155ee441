from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from axes.helpers import get_cool_off
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Count, Max, Prefetch, Q, QuerySet
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.models import ApiToken


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def token_find_by_secret(*, secret: str) -> ApiToken | None:
    return (
        ApiToken.objects.select_related("user")
        .filter(secret_sha256=secret_hash(secret))
        .first()
    )


def token_list_for_user(*, user: Any) -> QuerySet[ApiToken]:
    """A person's personal tokens; none for a caller who is no person (a service token)."""
    if user is None:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(kind=ApiToken.Kind.PERSONAL, user=user)


def token_list_service() -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(kind=ApiToken.Kind.SERVICE).select_related("created_by")


def login_locked_until(*, username: str, ip_address: str) -> datetime | None:
    """When a username's sign-in lockout from an address ends: its last counted failure plus
    the cool-off (None when nothing is counted). Failures from several browsers are counted
    together and expire one by one, so this is the latest the lockout can last."""
    last = AccessAttempt.objects.filter(username=username, ip_address=ip_address).aggregate(
        last=Max("attempt_time"))["last"]
    cool_off = get_cool_off()
    return last + cool_off if last is not None and cool_off is not None else None


def person_list() -> QuerySet[Any]:
    """Everyone, with their fleetctl roles (prefetched as `role_groups`) and how many of
    their personal tokens work now (`tokens_active`), in two queries."""
    now = timezone.now()
    usable = Q(api_tokens__revoked_at__isnull=True) & (
        Q(api_tokens__expires_at__isnull=True) | Q(api_tokens__expires_at__gt=now))
    return (
        get_user_model().objects
        .annotate(tokens_active=Count("api_tokens", filter=usable, distinct=True))
        .prefetch_related(Prefetch(
            "groups", queryset=Group.objects.filter(name__in=roles.ROLES).order_by("name"),
            to_attr="role_groups"))
        .order_by("username")
    )


def person_get(*, username: str) -> Any | None:
    return person_list().filter(username=username).first()


def person_roles(user: Any) -> list[str]:
    """A person's roles as stored (groups), in the order roles.ROLES lists them."""
    groups = getattr(user, "role_groups", None)
    if groups is None:
        groups = user.groups.filter(name__in=roles.ROLES)
    held = {group.name for group in groups}
    return [name for name in roles.ROLES if name in held]


def row_as_listed(rows: QuerySet[Any], *, pk: object) -> Any:
    """One row of a list's queryset, as the list shows it (with what the queryset adds, e.g.
    a region's pool_count): the answer to an API write reads its row this way."""
    return rows.get(pk=pk)
