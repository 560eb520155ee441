from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

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


class ApiTrailingSlashMiddleware:
    """Under /api/, a path without its trailing slash is the same endpoint: `POST
    /api/v1/drains` is `POST /api/v1/drains/`, for every route and method. Django's
    APPEND_SLASH would answer a redirect that drops the body (a debug page in DEBUG); a
    client that forgot the slash gets the endpoint's own answer instead. A path that is no
    endpoint either way answers the API's JSON 404 — in DEBUG too, where Django would answer
    its HTML debug page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        path = request.path_info
        if path.startswith("/api/") and not path.endswith("/"):
            from django.urls import get_urlconf, is_valid_path

            urlconf = getattr(request, "urlconf", None) or get_urlconf()
            if not is_valid_path(path, urlconf) and is_valid_path(path + "/", urlconf):
                request.path_info = path + "/"
                request.path = request.path + "/"
        response = self.get_response(request)
        if (response.status_code == 404 and path.startswith("/api/")
                and not response.get("Content-Type", "").startswith("application/json")):
            from fleetctl.core.views import not_found

            return not_found(request, Exception(path))
        return response
