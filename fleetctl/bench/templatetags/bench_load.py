"""`{% load_shape level %}`: a level's load shape on the run page — when each stream sent its
first request (a strip), when the steady-state window began, and what each endpoint of the
pool received."""

from __future__ import annotations

from typing import Any

from django import template

from fleetctl.bench.charts import POOL_PALETTE, load_strip

register = template.Library()


@register.inclusion_tag("bench/_load_shape.html")
def load_shape(level: Any) -> dict[str, Any]:
    shape = (level.summary or {}).get("load_shape") or {}
    endpoints = [dict(row, colour=POOL_PALETTE[int(row["endpoint"]) % len(POOL_PALETTE)])
                 for row in shape.get("endpoints") or []]
    return {"level": level, "shape": shape, "strip": load_strip(shape), "endpoints": endpoints}
