"""The request id that ties an audit event to the HTTP request (or task) that caused it."""

from __future__ import annotations

import contextvars
import re
import uuid

_current: contextvars.ContextVar[str] = contextvars.ContextVar("fleetctl_request_id", default="")
_VALID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def new_request_id() -> str:
    return uuid.uuid4().hex


def accept_request_id(incoming: str | None) -> str:
    """Keep a caller's id (so their logs join ours) only when it is short and plain."""
    if incoming and _VALID.match(incoming):
        return incoming
    return new_request_id()


def set_request_id(value: str) -> contextvars.Token[str]:
    return _current.set(value)


def reset_request_id(token: contextvars.Token[str]) -> None:
    _current.reset(token)


def current_request_id() -> str:
    return _current.get()
