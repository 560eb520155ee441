"""Throttling of failed API authentication, counted per client address in the Django cache
(Redis). After API_AUTH_FAILURE_LIMIT invalid bearer tokens from one address within
API_AUTH_FAILURE_WINDOW_S, every invalid bearer token from that address is answered 429 for
API_AUTH_BLOCK_S. A valid token from it still works: addresses are shared (an office NAT, a
CI runner pool), and someone else's guesses must not lock an on-call out of a drain. Tokens
are 256 random bits, so a guess that gets through is not what the block prevents; it makes
guessing loud (the block is audited) and keeps the counters and the audit log from filling
up. Whether a token is valid is decided after the same hash, lookup and cache read either
way (authentication.py), so answer timing does not say which tokens exist. A valid request
never touches the counters.

If the cache cannot be reached the throttle steps aside (and logs it): an on-call draining a
pool during an incident must not be locked out by a Redis outage."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

from axes.helpers import get_client_ip_address
from django.conf import settings
from django.core.cache import cache
from redis.exceptions import RedisError

log = logging.getLogger(__name__)
T = TypeVar("T")


def client_ip(request: Any) -> str:
    """The caller's address, resolved the way sign-in lockout resolves it (AXES_IPWARE_*)."""
    django_request = getattr(request, "_request", request)
    return get_client_ip_address(django_request) or "unknown"


def _failures_key(ip: str) -> str:
    return f"api-auth-failures:{ip}"


def _blocked_key(ip: str) -> str:
    return f"api-auth-blocked:{ip}"


def _cache(call: Callable[[], T], fallback: T) -> T:
    try:
        return call()
    except (RedisError, OSError) as exc:
        log.warning("API auth throttle skipped: the cache is unreachable (%s)", exc)
        return fallback


def blocked_for(ip: str) -> int:
    """Seconds until bearer tokens from this address are accepted again (0: they are now)."""
    until = _cache(lambda: cache.get(_blocked_key(ip)), None)
    if until is None:
        return 0
    return max(0, math.ceil(float(until) - time.time()))


def failure_count(ip: str) -> tuple[int, float | None]:
    """Count one invalid token from this address. Returns the failures in the current window
    and, when this failure starts a block, the epoch second the block ends (else None)."""
    nothing: tuple[int, float | None] = (0, None)
    return _cache(lambda: _count(ip), nothing)


def _count(ip: str) -> tuple[int, float | None]:
    window = settings.API_AUTH_FAILURE_WINDOW_S
    cache.add(_failures_key(ip), 0, timeout=window)
    try:
        failures = cache.incr(_failures_key(ip))
    except ValueError:  # the window expired between add and incr: this failure opens a new one
        cache.set(_failures_key(ip), 1, timeout=window)
        failures = 1
    if failures < settings.API_AUTH_FAILURE_LIMIT:
        return failures, None
    until = time.time() + settings.API_AUTH_BLOCK_S
    # add, not set: of concurrent failures exactly one starts (and reports) the block.
    if not cache.add(_blocked_key(ip), until, timeout=settings.API_AUTH_BLOCK_S):
        return failures, None
    cache.delete(_failures_key(ip))
    return failures, until


def reset(ip: str) -> None:
    """Lift a block and forget the failures counted for this address."""
    _cache(lambda: cache.delete_many([_failures_key(ip), _blocked_key(ip)]), None)
