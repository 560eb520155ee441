"""Renderers the API's file answers share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import renderers


class CSVRenderer(renderers.BaseRenderer):
    """Lets a CSV export (`…/export.csv`, `…/export/?format=csv`) through content negotiation;
    the view streams the body itself."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> Any:
        return data
