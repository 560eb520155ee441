from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from fleetctl.core.requestid import accept_request_id, reset_request_id, set_request_id


class RequestIdMiddleware:
    """Give every request an id, echo it back, and make it visible to the audit log."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = accept_request_id(request.headers.get("X-Request-ID"))
        request.request_id = request_id  # type: ignore[attr-defined]
        token = set_request_id(request_id)
        try:
            response = self.get_response(request)
        finally:
            reset_request_id(token)
        response["X-Request-ID"] = request_id
        return response
