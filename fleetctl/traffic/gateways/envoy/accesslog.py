"""Envoy's access log: one JSON object per request, written by the file access logger that the
bootstrap renders (render.render_bootstrap(access_log_path=...)), read back into LogRecords.

Envoy's json_format writes a command that stands alone as a value with its type: numbers as
numbers, and a value Envoy does not have (no upstream, no body byte yet) as null. Older
Envoys and text formats write "-" instead; both read as "none" here.

`ttft_ms` is %COMMON_DURATION(DS_RX_BEG:US_RX_BODY_BEG:ms)%: from the first byte of the
request to the first byte of the upstream's *body*. For a streamed answer that is the first
token, not the response headers (an OpenAI-compatible server sends its headers as soon as it
accepts a request, long before the prefill ends); %RESPONSE_DURATION% would time the headers.

Who ended a request (`ended_by`), from %RESPONSE_FLAGS% (Envoy's access log docs,
"Format rules"; measured with a real Envoy in tests/traffic/envoy/test_access_log.py):
- a client that hangs up is logged with the flag DC ("downstream connection termination")
  and nothing else: status 0 when it left before the pool's response headers (%RESPONSE_CODE%
  0: "the server never sent the beginning of a response ... generally means the
  (downstream) client disconnected"), the status sent when it left mid-answer. DC alone, on
  an answer that is not a 5xx, is the client's (ENDED_BY_CLIENT);
- a flag of POOL_FAILURE_FLAGS is the pool's failure (ENDED_BY_POOL), whatever the status:
  a pool that breaks off a streamed answer leaves status 200 (and UPE, measured). DC *with*
  one of them is the pool's too: a hang-up alone never adds one (measured), so no client
  can produce it by hanging up, while calling it a disconnect would let a client hide a
  failing pool by hanging up on it. Any other flag next to DC (unknown to us) leaves the
  status to decide, as before: nothing is set apart on a guess;
- UO alone on a 429 is a `queue` tier's full queue (the gateway's limit, not the pool's).

`pool` is the pool whose endpoint answered (each endpoint's metadata names it), and
`fallback_from` the pool the split chose when that was another one (a context tier's
per-request fallback, fallback.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fleetctl.traffic.gateways.base import (
    ENDED_BY_CLIENT,
    ENDED_BY_POOL,
    PROMPT_TOKENS_UNKNOWN,
    LogRecord,
)
from fleetctl.traffic.gateways.envoy.fallback import pool_of
from fleetctl.traffic.gateways.envoy.names import ANSWERED_BY

# Internal routes (error answers, /v1/models) are named `fleetctl:<what>`: no fleetctl route.
INTERNAL_ROUTE_PREFIX = "fleetctl:"
STREAM_TYPE = "text/event-stream"
CLIENT_GONE_FLAG = "DC"  # downstream connection termination
# The flags that say the pool (the upstream) failed: no healthy host (UH), connect failure
# (UF), circuit breaker open (UO), retries exhausted (URX), timed out (UT), reset by the pool
# (UR), its connection closed (UC), a broken answer (UPE), its max stream duration (UMSDR),
# the stream idle past its timeout (SI: nothing came from the pool).
# A `queue` tier's full queue: its circuit breaker refused (UO) and the Lua script answered
# 429 (fallback.py); the tier's limit, not the pool failing: a client error, like any 429.
QUEUE_FULL_FLAG, QUEUE_FULL_STATUS = "UO", 429
POOL_FAILURE_FLAGS = frozenset({"UH", "UF", "UO", "URX", "UT", "UR", "UC", "UPE", "UMSDR",
                                "SI"})

LOG_FORMAT: dict[str, str] = {
    "start": "%START_TIME(%s.%3f)%",
    "route": "%ROUTE_NAME%",
    "pool": "%UPSTREAM_CLUSTER%",
    "answered": ANSWERED_BY,
    "status": "%RESPONSE_CODE%",
    "duration_ms": "%DURATION%",
    "ttft_ms": "%COMMON_DURATION(DS_RX_BEG:US_RX_BODY_BEG:ms)%",
    "bytes": "%BYTES_SENT%",
    "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
    "ctype": "%RESP(CONTENT-TYPE)%",
    "flags": "%RESPONSE_FLAGS%",
    # The context tier whose entry routed the request (routes.py: the entry's metadata
    # {"fleetctl": {"tier": index, "unknown": bool}}); null for a route without tiers, an
    # error answer, or a request without the prompt-size header (the route's own entry).
    # json_format keeps the metadata's types: the index a number, `unknown` a boolean.
    "tier": "%METADATA(ROUTE:fleetctl:tier)%",
    "tier_unknown": "%METADATA(ROUTE:fleetctl:unknown)%",
}

_loads = json.loads


def parse_line(line: bytes, endpoints: Mapping[str, str]) -> LogRecord | None:
    """One line of the log as a LogRecord; None for a blank line; ValueError for a line that
    is not one of ours. `endpoints` is not needed: each endpoint's metadata names its pool
    (`answered`), and the cluster names the pool the split chose (`pool`; a line written
    before `answered` was logged has only that). They differ when a tier's fallback
    (fallback.py) took the request to another pool: `fallback_from` names the chosen one."""
    if not line.strip():
        return None
    try:
        entry = _loads(line)
        route = _text(entry["route"])
        # The cluster the split chose names its pool (a tier's fallback or queue cluster
        # too: fallback.pool_of); the endpoint that answered names the pool that did.
        chosen = pool_of(_text(entry["pool"]))
        answered = _text(entry.get("answered"))
        ctype = _text(entry.get("ctype"))
        status = _number(entry["status"])
        flags = _text(entry.get("flags"))
        return LogRecord(
            start=float(entry["start"]),
            route="" if route.startswith(INTERNAL_ROUTE_PREFIX) else route,
            pool=answered or chosen,
            status=status,
            duration_ms=float(_number(entry["duration_ms"])),
            ttft_ms=_optional_ms(entry.get("ttft_ms")),
            bytes_out=_number(entry.get("bytes")),
            attempts=_number(entry.get("attempts")),
            streamed=ctype.startswith(STREAM_TYPE),
            flags=flags,
            ended_by=ended_by(status, flags),
            fallback_from=chosen if answered and chosen and answered != chosen else "",
            tier=tier_of(entry.get("tier"), entry.get("tier_unknown")),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not an Envoy access log line of fleetctl's format: {exc!r}") from exc


def ended_by(status: int, flags: str) -> str:
    """Who cut the request short, from its status and %RESPONSE_FLAGS% (the module's rule)."""
    names = {flag for flag in flags.split(",") if flag and flag != "-"}
    if status == QUEUE_FULL_STATUS and names == {QUEUE_FULL_FLAG}:
        return ""  # a queue tier's full queue (fallback.py): the gateway's limit, no failure
    if names & POOL_FAILURE_FLAGS:
        return ENDED_BY_POOL
    if names == {CLIENT_GONE_FLAG} and status < 500:
        return ENDED_BY_CLIENT
    return ""


def tier_of(tier: Any, unknown: Any) -> str:
    """The tier a request was routed by, as telemetry counts it: its index ("0", "1", ...),
    "unknown" when the gateway could not size the prompt (it went where the last tier goes),
    "" when no tier entry routed it. A value that is not what routes.py writes reads as ""."""
    if unknown is True or unknown == "true":
        return PROMPT_TOKENS_UNKNOWN
    if isinstance(tier, bool) or tier is None or tier == "-":
        return ""
    try:
        index = int(float(tier))
    except (TypeError, ValueError):
        return ""
    return str(index) if 0 <= index < 64 else ""


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
