"""Renderers the API's file answers share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import renderers
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response


class PassThroughRenderer(renderers.BaseRenderer):
    """A renderer for a body the view makes itself: it only lets the media type through
    content negotiation and passes the body on as it is."""

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> Any:
        return data


class CSVRenderer(PassThroughRenderer):
    """Lets a CSV export (`…/export.csv`, `…/export/?format=csv`) through content negotiation;
    the view streams the body itself."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"


NDJSON = "application/x-ndjson"


class NDJSONRenderer(PassThroughRenderer):
    """Lets a JSONL download (an eval suite, a batch job's output and error files) through
    content negotiation for a client that asks for `application/x-ndjson`; the view answers
    the bytes itself."""

    media_type = NDJSON
    format = "jsonl"
    charset = None


class JsonDownloadErrors:
    """For a viewset with downloads or exports (CSV, JSONL): an error answer to one is the
    JSON error body, as documented — the pass-through renderers let only the view's own bytes
    through, and would answer the word "error"."""

    def finalize_response(self, request: Request, response: Any, *args: Any,
                          **kwargs: Any) -> Any:
        if (isinstance(response, Response) and response.status_code >= 400
                and isinstance(getattr(request, "accepted_renderer", None),
                               CSVRenderer | NDJSONRenderer)):
            request.accepted_renderer = renderers.JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args,  # type: ignore[misc]
                                         **kwargs)


class ExportFormatNegotiation:
    """For a viewset whose `export` action answers JSON or CSV: there `?format=` decides,
    whatever the Accept header says (a client that accepts JSON everywhere still gets the CSV
    it asked for); another value is a 400 that names the field, not DRF's bare 404 for a
    format no renderer has."""

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        wanted = request.query_params.get("format")
        if getattr(self, "action", None) != "export" or wanted is None or force:
            return super().perform_content_negotiation(request, force)  # type: ignore[misc]
        for renderer in self.get_renderers():  # type: ignore[attr-defined]
            if renderer.format == wanted:
                return renderer, renderer.media_type
        raise ValidationError({"format": [
            f"Give format as json or csv; {wanted[:40]!r} is not one."]})


class OnlyRepresentation(BaseContentNegotiation):
    """There is one representation, so Accept is not consulted: scrapers send many variants
    (Prometheus asks for OpenMetrics first), and a 406 would only turn a scrape into a
    failure."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any,
                        format_suffix: str | None = None) -> tuple[Any, str]:
        return renderers[0], renderers[0].media_type
