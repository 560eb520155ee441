"""The API's error answers in the OpenAPI schema: one component for the error body
(`fleetctl.core.api.errors`), and on every operation the error statuses it can answer.

A postprocessing hook rather than a decorator per view: every operation gets the same
treatment, including ones added later, and a view that documents an error itself (with its
own description) keeps it.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

ERROR_COMPONENT = "Error"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every error the API answers has this shape.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "Machine-readable: invalid, not_authenticated, "
                                   "authentication_failed, permission_denied, not_found, "
                                   "conflict, throttled, …",
                },
                "message": {"type": "string",
                            "description": "What went wrong and what to change, for a person."},
                "fields": {
                    "type": "object",
                    "description": "Each refused field and why (non_field_errors: the request "
                                   "as a whole). Empty when no field is at fault.",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                },
            },
            "required": ["code", "message", "fields"],
        },
        # A 409 for a stale base_revision says what the route holds now, so a client can
        # re-read nothing and decide (these three appear only there).
        "current_revision": {"type": "integer",
                             "description": "409, stale base_revision: the route's current "
                                            "revision number."},
        "current_weights": {"type": "object", "additionalProperties": {"type": "number"},
                            "description": "409, stale base_revision: its split, pool name "
                                           "→ percent."},
        "current_author": {"type": "string",
                           "description": "409, stale base_revision: who made it."},
    },
    "required": ["error"],
}

WRITE_METHODS = frozenset({"post", "put", "patch", "delete"})

DESCRIPTIONS = {
    "400": "The request is not valid: `fields` names each bad field and why.",
    "401": "No credentials, or the token is unknown, revoked or expired. Send "
           "`Authorization: Bearer <token>`.",
    "403": "These credentials may not do this (the role or the token's scopes). Refusals are "
           "audited.",
    "404": "No such object (check the id or name in the URL), or a page past the last.",
    "409": "Refused because of the current state (for example a stale `base_revision`, or "
           "rows that still rely on this one, or a request with the same Idempotency-Key "
           "still running); the message says what to do.",
    "422": "This Idempotency-Key was used for another request (another path or body); "
           "use a new key for a new request.",
    "429": "Too many invalid tokens from this address: bearer requests from it are refused "
           "until `Retry-After` seconds have passed.",
}


def _error_response(code: str) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": DESCRIPTIONS[code],
        "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}}},
    }
    if code == "429":
        response["headers"] = {"Retry-After": {
            "schema": {"type": "integer"}, "description": "Seconds until the block ends."}}
    return response


def error_codes(method: str, operation: dict[str, Any]) -> list[str]:
    """The error statuses an operation can answer."""
    parameters = operation.get("parameters", [])
    in_path = any(p.get("in") == "path" for p in parameters)
    in_query = any(p.get("in") == "query" for p in parameters)
    paginated = any(p.get("in") == "query" and p.get("name") == "page" for p in parameters)
    codes = []
    # A body, a query or an id can be refused (an id with a NUL character is a 400 too).
    if "requestBody" in operation or in_query or in_path:
        codes.append("400")
    if operation.get("security") != [{}]:
        codes += ["401", "403"]
    if in_path or paginated:
        codes.append("404")
    if method in WRITE_METHODS:
        codes.append("409")
    if any(p.get("in") == "header" and p.get("name") == "Idempotency-Key"
           for p in parameters):
        codes += ["400", "422"]
    if operation.get("security") != [{}]:
        codes.append("429")
    return codes


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _json_bodies_only(operation: dict[str, Any]) -> None:
    """A body the API takes as JSON is documented as JSON only. DRF also parses the same
    fields form-encoded, but one body under three content types makes generated clients
    guess (openapi-python-client emits code that does not import, or sends a form)."""
    content = operation.get("requestBody", {}).get("content", {})
    if "application/json" in content:
        for form in FORM_TYPES:
            content.pop(form, None)


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool,
                        **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the Error component and each operation's errors;
    request bodies as JSON."""
    result.setdefault("components", {}).setdefault("schemas", {})[ERROR_COMPONENT] = \
        ERROR_SCHEMA
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            _json_bodies_only(operation)
            responses = operation.setdefault("responses", {})
            for code in error_codes(method, operation):
                responses.setdefault(code, _error_response(code))
    return result


# --- typed JSON ------------------------------------------------------------------------------
# A model's JSONField shows in the schema as "any value"; these say what it holds.

OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}


@extend_schema_field(OBJECT_SCHEMA)
class ObjectField(serializers.JSONField):
    """A JSON object whose keys depend on the row (a summary, an audit snapshot, options)."""


@extend_schema_field({**OBJECT_SCHEMA, "nullable": True})
class NullableObjectField(serializers.JSONField):
    """A JSON object, or null."""
