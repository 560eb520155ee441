from __future__ import annotations

import hashlib
from typing import Any

from django.db.models import QuerySet

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
