"""The mirror secret: how the shadow collector knows a copy was mirrored by a gateway that
carries the copy's route, and not POSTed to its port by anyone else.

Every gateway row holds a secret fleetctl generated (Gateway.mirror_secret: never typed in,
never shown, in no form, API answer or audit event). A gateway's copy of route R carries

    x-fleetctl-mirror-auth: <gateway id>.<hex HMAC-SHA256(secret, "fleetctl-mirror-v1" NUL R)>

(base.MIRROR_AUTH_HEADER), set by the gateway on the copy alone — Envoy: the mirror policy's
request_headers_mutations; nginx: the mirror location's proxy_set_header — overwriting
whatever the client sent. The gateway holds per-route tokens, never the secret.

The collector never reads the database: fleetctl publishes, per route, which gateways carry
it and a SHA-256 of each token they may present, in the Redis hash MIRROR_AUTH_KEY (field =
route name, value = {"<gateway id>": [["<sha256 hex>", <accepted until, epoch s, or null>]]}).
It is re-read with the routes hash (every 0.5 s), so a token another route's gateway holds,
a token of a route its gateway does not carry, or a made-up one is refused. Digests, not the
tokens: a reader of Redis cannot present what it reads there.

After a rotation the previous secret's tokens stay accepted for MIRROR_SECRET_GRACE_S, while
the gateways are pushed their new configuration. Publishing writes the whole hash at once
(MULTI): after every gateway change (on commit), when a shadow run is published, and on the
traffic reconcile beat, so a Redis that restarted empty is refilled within a beat.

This module is imported by the collector, which has no Django apps loaded: it imports the
models inside `publish` only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

log = logging.getLogger("fleetctl.traffic")

MIRROR_AUTH_KEY = "fleetctl:shadow:mirror-auth"
# How long a rotated-out secret's tokens are still accepted: the gateways' pushes carrying the
# new tokens are retried well within it.
MIRROR_SECRET_GRACE_S = 600
# A header longer than this is not one fleetctl renders (an id, a dot and 64 hex digits).
HEADER_MAX = 100
_CONTEXT = b"fleetctl-mirror-v1\x00"
# A secret or a token, wherever a gateway's error message might quote its configuration.
_HEX_64 = re.compile(r"[0-9a-fA-F]{64}")
_SECRET = re.compile(r"[0-9a-f]{64}")


def new_secret() -> str:
    """A fresh secret: 32 random bytes, hex."""
    return secrets.token_hex(32)


def route_token(secret: str, route: str) -> str:
    """What a gateway holding `secret` presents for the copies of `route`."""
    return hmac.new(bytes.fromhex(secret), _CONTEXT + route.encode(), hashlib.sha256).hexdigest()


def _usable(secret: str) -> bool:
    """A secret as new_secret() makes them. Anything else (a row edited by hand) signs
    nothing — its gateway's copies are refused — rather than break the push or drain that
    renders it."""
    return bool(_SECRET.fullmatch(secret or ""))


def header_value(gateway_id: int, secret: str, route: str) -> str:
    """The header a gateway puts on its copies of `route` ("" without a usable secret: its
    copies carry none and are refused)."""
    if not _usable(secret):
        return ""
    return f"{int(gateway_id)}.{route_token(secret, route)}"


def redact(text: str) -> str:
    """`text` with anything shaped like a secret or a token cut out: a gateway's error
    (nginx -t, an API server's validation message) may quote the config that holds one, and
    push attempts are shown to viewers."""
    return _HEX_64.sub("[redacted]", text) if text else text


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True, slots=True)
class Accepted:
    """One token a gateway may present for a route: its SHA-256, until when (epoch s)."""

    digest: bytes
    until: float = math.inf


# route name -> gateway id (as in the header) -> the tokens it may present
AcceptedTokens = dict[str, dict[str, tuple[Accepted, ...]]]


def check(accepted: Mapping[str, tuple[Accepted, ...]] | None, header: str,
          now: float) -> bool:
    """Does `header` carry a token that one of the route's gateways may present now?
    `accepted`: the route's entry (None: no gateway may mirror it). Every accepted token of
    the gateway is compared, in constant time, whatever matched before."""
    if not accepted or not header or len(header) > HEADER_MAX:
        return False
    gateway, dot, token = header.partition(".")
    keys = accepted.get(gateway) if dot else None
    if not keys:
        return False
    presented = _digest(token)
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(presented, key.digest) & (now < key.until)
    return ok


# --- the Redis hash ----------------------------------------------------------------------------

def encode(by_gateway: Mapping[int, Iterable[tuple[str, float | None]]]) -> str:
    """One route's value: gateway id -> (token, accepted until or None) pairs, as digests."""
    return json.dumps({str(gateway): [[_digest(token).hex(), until] for token, until in tokens]
                       for gateway, tokens in sorted(by_gateway.items())},
                      separators=(",", ":"))


def decode(raw: str | bytes) -> dict[str, tuple[Accepted, ...]] | None:
    """One route's value as the collector checks it; None for a value fleetctl did not write
    (the route's copies are then refused: fails closed)."""
    try:
        data = json.loads(raw)
        return {str(gateway): tuple(
            Accepted(bytes.fromhex(digest), math.inf if until is None else float(until))
            for digest, until in tokens) for gateway, tokens in data.items()}
    except (ValueError, TypeError, AttributeError):
        return None


def parse(raw: Mapping[Any, Any]) -> AcceptedTokens:
    """The whole hash (HGETALL) as the collector checks it."""
    found: AcceptedTokens = {}
    for name, value in raw.items():
        entry = decode(value)
        if entry is not None:
            found[name.decode() if isinstance(name, bytes) else str(name)] = entry
    return found


_clients: dict[str, redis.Redis] = {}


def client() -> redis.Redis:
    """One client per Redis URL for the process (the URL is read at each call, as
    fleetctl.shadow.live does, so tests that override REDIS_URL get their own)."""
    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    return _clients[url]


def write(routes: Mapping[str, str]) -> None:
    """Replace the whole hash with `routes` (route name -> encoded value) in one MULTI, so a
    collector never reads it half written or empty in between."""
    with client().pipeline(transaction=True) as pipe:
        pipe.delete(MIRROR_AUTH_KEY)
        if routes:
            mapping: dict[Any, Any] = dict(routes)
            pipe.hset(MIRROR_AUTH_KEY, mapping=mapping)
        pipe.execute()


def published() -> AcceptedTokens:
    return parse(client().hgetall(MIRROR_AUTH_KEY))


# --- publishing (web, workers) -----------------------------------------------------------------

def tokens_of(gateway: Any, route: str, now: float) -> list[tuple[str, float | None]]:
    """(token, accepted until) a gateway row may present for `route`: its secret's, and the
    previous secret's while the grace after a rotation lasts."""
    tokens: list[tuple[str, float | None]] = []
    if _usable(gateway.mirror_secret):
        tokens.append((route_token(gateway.mirror_secret, route), None))
    rotated = gateway.mirror_secret_rotated_at
    if _usable(gateway.mirror_secret_previous) and rotated is not None:
        until = rotated.timestamp() + MIRROR_SECRET_GRACE_S
        if until > now:
            tokens.append((route_token(gateway.mirror_secret_previous, route), until))
    return tokens


def publish() -> int:
    """Write what every collector accepts, from the gateway rows: for each route, the
    gateways of a kind that mirrors which carry it, and their tokens. Returns the number of
    routes written."""
    from fleetctl.traffic.models import Gateway

    now = time.time()
    by_route: dict[str, dict[int, list[tuple[str, float | None]]]] = {}
    for gateway in Gateway.objects.prefetch_related("routes").order_by("pk"):
        if not gateway.supports_mirror:
            continue
        for route in gateway.routes.all():
            tokens = tokens_of(gateway, route.name, now)
            if tokens:
                by_route.setdefault(route.name, {})[gateway.pk] = tokens
    write({name: encode(by_gateway) for name, by_gateway in by_route.items()})
    return len(by_route)


def publish_quietly() -> None:
    """publish(), for an on-commit hook: the change is committed already, so Redis being
    away is logged, not raised (the reconcile beat publishes again)."""
    try:
        publish()
    except Exception as exc:
        log.warning("the gateways' mirror tokens were not published to Redis (%s); the "
                    "reconcile beat tries again", type(exc).__name__)
