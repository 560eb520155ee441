from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from axes.helpers import get_cool_off
from axes.models import AccessAttempt
from django.db.models import Max, QuerySet

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
