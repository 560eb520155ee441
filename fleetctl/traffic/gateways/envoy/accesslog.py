"""Envoy's access log: one JSON object per request, written by the file access logger that the
bootstrap renders (render.render_bootstrap(access_log_path=...)), read back into LogRecords.

Envoy's json_format writes a command that stands alone as a value with its type: numbers as
numbers, and a value Envoy does not have (no upstream, no body byte yet) as null. Older
Envoys and text formats write "-" instead; both read as "none" here.

`ttft_ms` is %COMMON_DURATION(DS_RX_BEG:US_RX_BODY_BEG:ms)%: from the first byte of the
request to the first byte of the upstream's *body*. For a streamed answer that is the first
token, not the response headers (an OpenAI-compatible server sends its headers as soon as it
accepts a request, long before the prefill ends); %RESPONSE_DURATION% would time the headers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fleetctl.traffic.gateways.base import LogRecord

# Internal routes (error answers, /v1/models) are named `fleetctl:<what>`: no fleetctl route.
INTERNAL_ROUTE_PREFIX = "fleetctl:"
STREAM_TYPE = "text/event-stream"

LOG_FORMAT: dict[str, str] = {
    "start": "%START_TIME(%s.%3f)%",
    "route": "%ROUTE_NAME%",
    "pool": "%UPSTREAM_CLUSTER%",
    "status": "%RESPONSE_CODE%",
    "duration_ms": "%DURATION%",
    "ttft_ms": "%COMMON_DURATION(DS_RX_BEG:US_RX_BODY_BEG:ms)%",
    "bytes": "%BYTES_SENT%",
    "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
    "ctype": "%RESP(CONTENT-TYPE)%",
    "flags": "%RESPONSE_FLAGS%",
}

_loads = json.loads


def parse_line(line: bytes, endpoints: Mapping[str, str]) -> LogRecord | None:
    """One line of the log as a LogRecord; None for a blank line; ValueError for a line that
    is not one of ours. `endpoints` is not needed: Envoy names the cluster, which is the pool."""
    if not line.strip():
        return None
    try:
        entry = _loads(line)
        route = _text(entry["route"])
        ctype = _text(entry.get("ctype"))
        return LogRecord(
            start=float(entry["start"]),
            route="" if route.startswith(INTERNAL_ROUTE_PREFIX) else route,
            pool=_text(entry["pool"]),
            status=_number(entry["status"]),
            duration_ms=float(_number(entry["duration_ms"])),
            ttft_ms=_optional_ms(entry.get("ttft_ms")),
            bytes_out=_number(entry.get("bytes")),
            attempts=_number(entry.get("attempts")),
            streamed=ctype.startswith(STREAM_TYPE),
            flags=_text(entry.get("flags")),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not an Envoy access log line of fleetctl's format: {exc!r}") from exc


def _text(value: Any) -> str:
    if value is None or value == "-":
        return ""
    return str(value)


def _number(value: Any) -> int:
    if value is None or value == "-" or value == "":
        return 0
    return int(value)


def _optional_ms(value: Any) -> float | None:
    if value is None or value == "-" or value == "":
        return None
    return float(value)
