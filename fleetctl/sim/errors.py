"""The HTTP edges every pool route shares: OpenAI error objects for every failure, the
JSON body and integer query parameters read or refused with a 400."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .apierror import ApiError

log = logging.getLogger("fleetctl.sim")

MAX_BODY_BYTES = 32 * 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(err: ApiError, request_id: str | None = None) -> web.Response:
    headers = dict(err.headers)
    if request_id:
        headers["x-request-id"] = request_id
    return web.json_response(err.body(), status=err.status, headers=headers or None)


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map every failure to an OpenAI error object: never a traceback, never HTML."""
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "unknown_url", 405: "method_not_allowed"}.get(exc.status)
        message = f"{exc.reason}: {request.method} {request.path}"
        return error_response(ApiError(exc.status, message, code=code))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("sim: unexpected error handling %s %s", request.method, request.path)
        return error_response(
            ApiError(500, "The simulator had an internal error.", type="server_error")
        )


async def read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, f"Request body too large (max {MAX_BODY_BYTES} bytes).") from exc
    try:
        return json.loads(raw) if raw else None
    except ValueError as exc:
        raise ApiError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly.)",
        ) from exc


def query_int(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, f"Invalid '{name}': expected an integer.", param=name) from None
