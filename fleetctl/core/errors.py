"""Domain errors. Services raise these; the API, views and CLI turn them into clear answers."""

from __future__ import annotations


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


class ConflictError(DomainError):
    """`extra`: facts about the current state a client acts on (e.g. `current_revision`),
    answered at the top level of the error body beside `error`."""

    status_code = 409
    code = "conflict"

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None,
                 extra: dict[str, object] | None = None) -> None:
        super().__init__(message, fields=fields)
        self.extra = extra or {}
