"""The project's URLs and error handlers, plus a page and an API path whose views raise: what
a person (and an API client) sees when something breaks on fleetctl's side."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

from fleetctl.urls import handler404, handler500  # noqa: F401 - the project's handlers
from fleetctl.urls import urlpatterns as project_urls


def breaks(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug in a view")


urlpatterns = [path("breaks/", breaks), path("api/v1/breaks/", breaks), *project_urls]
