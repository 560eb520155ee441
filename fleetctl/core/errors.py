"""Domain errors. Services raise these; the API, views and CLI turn them into clear answers."""

from __future__ import annotations

from django.core.exceptions import ValidationError


class DomainError(Exception):
    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields or {}


class PermissionDeniedError(DomainError):
    status_code = 403
    code = "permission_denied"


class NotFoundError(DomainError):
    status_code = 404
    code = "not_found"


class UnavailableError(DomainError):
    """Something this answer needs is not installed or not reachable here (not the request's
    fault): 503, with what to install or start."""

    status_code = 503
    code = "unavailable"


class ConflictError(DomainError):
    """`extra`: facts about the current state a client acts on (e.g. `current_revision`),
    answered at the top level of the error body beside `error`."""

    status_code = 409
    code = "conflict"

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None,
                 extra: dict[str, object] | None = None) -> None:
        super().__init__(message, fields=fields)
        self.extra = extra or {}


def required_reason(reason: str | None, message: str, *, field: str = "reason") -> str:
    """The reason a person gave for a change, stripped; a blank one is refused on `field`
    with `message` (which says what the reason is for, e.g. "it goes in the record"). The one
    check every service that records a reason makes."""
    text = (reason or "").strip()
    if not text:
        raise ValidationError({field: [message]})
    return text
