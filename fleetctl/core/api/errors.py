"""One error shape for the whole API: {"error": {"code", "message", "fields"}}.

A person reading the message should know what to change; `fields` names each bad field.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, transaction
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from fleetctl.core.errors import DomainError
from fleetctl.core.jsonl import MAX_DEPTH

log = logging.getLogger(__name__)

def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def openai_error_body(message: str, *, type: str = "invalid_request_error",
                      param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, which the official client reads: the shape of the OpenAI Batch
    API surface (/openai/v1/; fleetctl/batch/api/openai.py), not of /api/v1/."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _flatten(detail: Any) -> list[str]:
    if isinstance(detail, dict):
        return [f"{k}: {m}" for k, v in detail.items() for m in _flatten(v)]
    if isinstance(detail, list):
        return [m for item in detail for m in _flatten(item)]
    return [str(detail)]


def _fields_from_detail(detail: Any) -> dict[str, Any]:
    if isinstance(detail, dict):
        return {key: _flatten(value) for key, value in detail.items()}
    return {}


def _summary(fields: dict[str, list[str]], fallback: str) -> str:
    parts = [
        (m if k in ("non_field_errors", "__all__") else f"{k}: {m}")
        for k, msgs in fields.items()
        for m in msgs
    ]
    return "; ".join(parts) or fallback


def validation_response(fields: dict[str, list[str]], status_code: int = 400) -> Response:
    message = _summary(fields, "The request is not valid.")
    return Response(error_body("invalid", message, fields), status=status_code)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        body = error_body(exc.code, exc.message, exc.fields)
        # A conflict's facts (the current revision, …) beside the error, never over it.
        body |= {k: v for k, v in getattr(exc, "extra", {}).items() if k != "error"}
        return Response(body, status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        fields = (
            {k: [str(m) for m in v] for k, v in exc.message_dict.items()}
            if hasattr(exc, "error_dict")
            else {"non_field_errors": [str(m) for m in exc.messages]}
        )
        return validation_response(fields)
    if isinstance(exc, DataError):
        # The database refused a value from the request: PostgreSQL stores no NUL character
        # (/pools/%00/, a name looked up from the body) and no time zone offset beyond ±16 h
        # (?since=…+16:49). Nothing was changed; an enclosing transaction is unusable now and
        # is rolled back. Logged with its traceback in case a value of ours was at fault.
        log.warning("database refused a value from %s: %s", context.get("request"), exc,
                    exc_info=exc)
        if transaction.get_connection().in_atomic_block:
            transaction.set_rollback(True)
        return Response(error_body(
            "invalid", "A value in this request cannot be stored or looked up (for example it "
                       "contains a NUL character); remove it and try again."), status=400)
    if isinstance(exc, RecursionError):
        # JSON nested past what Python can follow: DRF's JSON parser lets the decoder's
        # RecursionError through (it answers only ValueError; a body some 900 levels deep),
        # as would anything walking such a value later. Uploads are held to MAX_DEPTH by
        # core/jsonl.py; a body is refused here, in one place for every endpoint. Logged
        # with its traceback, in case the recursion was ours and not the request's.
        log.warning("request %s nested too deeply to read: %s", context.get("request"), exc,
                    exc_info=exc)
        set_rollback()  # as DRF does for the errors it answers (with ATOMIC_REQUESTS)
        return Response(error_body(
            "invalid", f"The request is nested too deeply to read (arrays and objects inside "
                       f"each other); keep JSON within {MAX_DEPTH} levels."), status=400)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("No such object. Check the id or name in the URL.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _fields_from_detail(exc.detail)
        if not fields:
            fields = {"non_field_errors": _flatten(exc.detail)}
        response.data = error_body("invalid", _summary(fields, "The request is not valid."), fields)
        response.status_code = status.HTTP_400_BAD_REQUEST
        return response
    if isinstance(exc, exceptions.APIException):
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        message = " ".join(_flatten(exc.detail))
        response.data = error_body(str(code), message)
    return response
