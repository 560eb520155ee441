"""HAProxy's access log: one JSON object per request from a `log-format` (render.py puts it
in the frontend when the gateway has an `access_log`), read back into LogRecords.

HAProxy logs to syslog or a stream, never to a file of its own: the rendered config says
`log stdout format raw`, and what starts HAProxy appends its stdout to the access log file
(fleetctl/demo/haproxy_process.py; docs/gateways.md has the production equivalents).

What HAProxy can time: %Tr is the time to the pool's *response headers*, %Ta the whole
request. It has no timer for the first byte of the body, so `ttft_ms` is the header time: it
is a TTFT only for a server that sends its headers with its first token. A server that sends
headers at once and then prefills (the simulator does; so may vLLM behind some front ends)
shows a header time far below its TTFT.

Who ended a request (`ended_by`), from %tsc, the termination state (HAProxy's
configuration.txt, 8.5 "Session state at disconnection"): its first character is "the first
event which caused the session to terminate". `C` (the client aborted: CC, CQ, CH, CD, CR,
CT) and `c` (the client-side timeout: the client neither sent nor read, cD, cH, cR) are the
client's (ENDED_BY_CLIENT) unless HAProxy logged a 5xx, which stays the pool's error; `S`
(the server aborted or refused: SC, SH, SD) and `s` (the server-side timeout: sC, sH, sD)
are the pool's (ENDED_BY_POOL), also when the status is a 200 already sent (SD, sD: the
pool broke off mid-answer). Measured with a real HAProxy (tests/traffic/haproxy): without
`option abortonclose` HAProxy notices a client that left only when it writes to it, so a
hang-up before the headers is logged CD with the pool's header time, and one on an answer
that fits the socket's buffers is not seen at all (a normal end, "----").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fleetctl.traffic.gateways.base import ENDED_BY_CLIENT, ENDED_BY_POOL, LogRecord

BACKEND_PREFIX = "route-"
STREAM_TYPE = "text/event-stream"

# %Ts.%ms: the accept date in epoch seconds and its milliseconds (zero-padded); %rc: the
# retries of the request, "+N" when it was redispatched to another server (so quoted); %s:
# the server, <pool>.<n> (`<NOSRV>` when none); capture.res.hdr(0): the Content-Type
# captured by the frontend. Numbers are written bare; -1 is a timer that never ran.
LOG_FORMAT = (
    '{"start":%Ts.%ms,"backend":"%b","server":"%s","status":%ST,"tr":%Tr,"ta":%Ta,'
    '"bytes":%B,"retries":"%rc","ctype":"%[capture.res.hdr(0),json(utf8s)]","term":"%tsc"}'
)

_loads = json.loads


def parse_line(line: bytes, endpoints: Mapping[str, str]) -> LogRecord | None:
    """One line of HAProxy's stdout log as a LogRecord; None for a blank line or one that is
    not a JSON object (the stream is HAProxy's, not only ours); ValueError for a broken one."""
    line = line.strip()
    if not line.startswith(b"{"):
        return None
    try:
        entry = _loads(line)
        backend = str(entry["backend"])
        server = str(entry["server"])
        ttft = float(entry["tr"])
        retries = int(entry["retries"])
        ctype = str(entry.get("ctype", ""))
        status = max(0, int(entry["status"]))
        term = _flags(entry.get("term"))
        return LogRecord(
            start=float(entry["start"]),
            route=backend[len(BACKEND_PREFIX):] if backend.startswith(BACKEND_PREFIX) else "",
            # Pool names have no dots, so the pool is everything before the last one.
            pool=server.rpartition(".")[0] if server != "<NOSRV>" else "",
            status=status,
            duration_ms=max(0.0, float(entry["ta"])),
            ttft_ms=ttft if ttft >= 0 else None,
            bytes_out=max(0, int(entry["bytes"])),
            attempts=(1 + max(0, retries)) if server != "<NOSRV>" else 0,
            streamed=ctype.startswith(STREAM_TYPE),
            flags=term,
            ended_by=ended_by(status, term),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not an HAProxy access log line of fleetctl's format: {exc!r}") \
            from exc


def ended_by(status: int, term: str) -> str:
    """Who cut the request short, from its status and termination state (the module's
    rule)."""
    first = term[:1]
    if first in ("S", "s"):
        return ENDED_BY_POOL
    if first in ("C", "c") and status < 500:
        return ENDED_BY_CLIENT
    return ""


def _flags(value: Any) -> str:
    # %tsc: termination state and cookie states; "----" is a normal end.
    text = str(value or "")
    return "" if not text.strip("-") else text
