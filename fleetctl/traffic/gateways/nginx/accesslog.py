"""nginx's access log: one JSON object per request (`log_format fleetctl escape=json`, which
render.py declares and uses when the gateway has an `access_log`), read back into LogRecords.

nginx names the server it proxied to by address ($upstream_addr), not by pool: the parser
is given the gateway's endpoints ("host:port" -> pool, from its desired state) to name it.
nginx resolves a host name when it loads its config, so $upstream_addr holds the address
(127.0.0.1:8001 for localhost:8001): give both forms.

What nginx can time: $upstream_header_time is the time to the pool's *response headers*,
$request_time the whole request. It has no timer for the first byte of the body, so
`ttft_ms` is the header time: a TTFT only for a server that sends its headers with its first
token (see docs/gateways.md).

Several upstream servers tried for one request (proxy_next_upstream after a failed connect)
are listed comma-separated in $upstream_addr and the upstream timers; the last one answered.

Who ended a request (`ended_by`): nginx logs 499 ("client closed request", its own code,
NGX_HTTP_CLIENT_CLOSED_REQUEST in ngx_http_request.h: the client closed the connection before
nginx sent it the response headers) for a client that hung up: ENDED_BY_CLIENT. A client that
leaves mid-answer keeps the status already sent (200, measured), and so does a pool that
breaks off mid-answer: nginx's log cannot tell those two apart, so neither is set apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from fleetctl.traffic.gateways.base import ENDED_BY_CLIENT, LogRecord

ROUTE_PREFIX = "route-"
STREAM_TYPE = "text/event-stream"
CLIENT_CLOSED_REQUEST = 499

# $msec is when the line is written (the end); start = msec - request_time. $fleetctl_route
# is the upstream the route map chose: route-<key>, or "!<why>" for a refusal.
LOG_FORMAT = (
    '{"msec":$msec,"request_time":$request_time,"route":"$fleetctl_route",'
    '"upstream":"$upstream_addr","status":$status,"bytes":$bytes_sent,'
    '"header_time":"$upstream_header_time","ctype":"$upstream_http_content_type"}'
)

_loads = json.loads


def parse_line(line: bytes, endpoints: Mapping[str, str]) -> LogRecord | None:
    """One line of the log as a LogRecord; None for a blank line; ValueError for a line that
    is not one of ours. A server address not in `endpoints` names no pool ("")."""
    if not line.strip():
        return None
    try:
        entry = _loads(line)
        route = str(entry["route"])
        upstream = str(entry["upstream"])
        request_s = float(entry["request_time"])
        # "a, b" for two servers tried; "a : b" after an internal redirect (error_page).
        # The refusal server is a unix socket: a refused request reached no pool.
        tried = [a for a in (a.strip() for a in upstream.replace(" : ", ", ").split(","))
                 if a and a != "-" and not a.startswith("unix:")]
        header = str(entry["header_time"]).replace(" : ", ", ").rpartition(",")[2].strip()
        ctype = str(entry.get("ctype", ""))
        status = int(entry["status"])
        return LogRecord(
            start=float(entry["msec"]) - request_s,
            route=route[len(ROUTE_PREFIX):] if route.startswith(ROUTE_PREFIX) else "",
            pool=endpoints.get(tried[-1], "") if tried else "",
            status=status,
            duration_ms=request_s * 1000.0,
            ttft_ms=float(header) * 1000.0 if header not in ("", "-") else None,
            bytes_out=int(entry["bytes"]),
            attempts=len(tried),
            streamed=ctype.rpartition(",")[2].strip().startswith(STREAM_TYPE),
            ended_by=ENDED_BY_CLIENT if status == CLIENT_CLOSED_REQUEST else "",
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not an nginx access log line of fleetctl's format: {exc!r}") \
            from exc
