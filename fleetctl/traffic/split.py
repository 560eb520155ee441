"""Split arithmetic, in basis points (1 bp = 0.01 %), kept apart from the database so every
rule here can be read and tested on its own."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ValidationError

from fleetctl.traffic.gateways.base import TOTAL_WEIGHT


def _weights_error(message: str) -> ValidationError:
    return ValidationError({"weights": [message]})


def parse_percentages(raw: Any) -> dict[str, int]:
    """{"pool": percent} → {"pool": basis points}. Percentages take at most two decimals and
    must add up to exactly 100; pools at 0 are dropped."""
    if not isinstance(raw, dict) or not raw:
        raise _weights_error('Give weights as an object of pool name to percent, e.g. '
                             '{"h200-us-east": 99.9, "mi300x-us-east": 0.1}.')
    basis_points: dict[str, int] = {}
    for pool, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
            raise _weights_error(f"{pool}: {value!r} is not a number.")
        try:
            percent = Decimal(str(value))
        except InvalidOperation:
            raise _weights_error(f"{pool}: {value!r} is not a number.") from None
        if not percent.is_finite() or percent < 0 or percent > 100:
            raise _weights_error(f"{pool}: {value} is outside 0–100 %.")
        points = percent * 100
        if points != points.to_integral_value():
            raise _weights_error(f"{pool}: {value} % is finer than the 0.01 % step.")
        if points:
            basis_points[str(pool)] = int(points)
    total = sum(basis_points.values())
    if total == 0:
        raise _weights_error("All weights are zero: that would send this route's traffic "
                             "nowhere. To stop serving a pool, drain it instead.")
    if total != TOTAL_WEIGHT:
        raise _weights_error(f"Weights add up to {Decimal(total) / 100} %, not 100 %.")
    return basis_points


def as_percentages(weights: dict[str, int]) -> dict[str, float]:
    return {pool: bp / 100 for pool, bp in sorted(weights.items())}


def drained(weights: dict[str, int], *, remove: set[str], primary: str,
            eligible: set[str]) -> dict[str, int]:
    """The split after taking every pool in `remove` out: their share goes to the primary
    when it is eligible (serves the route, in its jurisdiction) and not itself removed,
    otherwise to the remaining eligible pools in proportion to their weight. With no eligible
    pool left the split is empty: the route answers an error rather than cross a border."""
    kept = {p: w for p, w in weights.items() if p not in remove and p in eligible and w > 0}
    freed = TOTAL_WEIGHT - sum(kept.values())
    if freed == 0:
        return kept
    if primary in eligible and primary not in remove:
        kept[primary] = kept.get(primary, 0) + freed
        return kept
    if not kept:
        return {}
    return _spread(kept, freed)


def _spread(kept: dict[str, int], freed: int) -> dict[str, int]:
    total = sum(kept.values())
    shares = {p: w + freed * w // total for p, w in kept.items()}
    # Integer division leaves a few points over; the largest pool takes them.
    shares[max(shares, key=lambda p: (shares[p], p))] += TOTAL_WEIGHT - sum(shares.values())
    return shares


def apportion(parts: dict[str, float], total: int) -> dict[str, int]:
    """`total` basis points shared in proportion to `parts` (parts of 0 or less get none);
    the largest part takes the rounding remainder. {} when nothing can take them."""
    usable = {p: v for p, v in parts.items() if v > 0}
    whole = sum(usable.values())
    if total <= 0 or not usable or whole <= 0:
        return {}
    shares = {p: int(total * v / whole) for p, v in usable.items()}
    shares[max(usable, key=lambda p: (usable[p], p))] += total - sum(shares.values())
    return {p: s for p, s in shares.items() if s > 0}


def drained_within(weights: dict[str, int], *, remove: set[str], primary: str,
                   eligible: set[str], load: float, room: dict[str, float],
                   capacity: dict[str, float], at_least: int
                   ) -> tuple[dict[str, int], dict[str, int]]:
    """A drain that gives each pool no more than it can carry. The freed share (what
    `drained` would move) carries `load` streams; each target pool in `room` (streams it can
    still take within its SLO) takes at most its room's worth of it: the primary first, then
    the others in proportion to their room. At least `at_least` basis points move now: what
    that asks beyond the room goes to the targets in proportion to their `capacity`. What
    does not move stays on the removed pools, in proportion to their weight (a later step
    moves it). Returns the split and the basis points each target was given."""
    kept = {p: w for p, w in weights.items() if p not in remove and p in eligible and w > 0}
    held = {p: w for p, w in weights.items() if p in remove and p in eligible and w > 0}
    freed = TOTAL_WEIGHT - sum(kept.values())
    given: dict[str, int] = {}
    if freed <= 0 or not room:
        return drained(weights, remove=remove, primary=primary, eligible=eligible), given
    per_stream = freed / load if load > 0 else float(freed)
    left = freed
    if primary in room:
        given[primary] = min(left, int(max(room[primary], 0.0) * per_stream))
        left -= given[primary]
    others = {p: r for p, r in room.items() if p != primary and r > 0}
    fits = min(left, int(sum(others.values()) * per_stream))
    for pool, share in apportion(others, fits).items():
        given[pool] = given.get(pool, 0) + share
    left -= fits
    # Nothing can stay on a removed pool that is no longer eligible: that much moves now.
    must = max(at_least, freed - sum(held.values()))
    extra = min(left, max(0, must - (freed - left)))
    overflow = apportion({p: capacity.get(p, 0.0) for p in room}, extra) or (
        {primary if primary in room else max(room, key=lambda p: (room[p], p)): extra}
        if extra else {})
    for pool, share in overflow.items():
        given[pool] = given.get(pool, 0) + share
    left -= extra
    after = dict(kept)
    for pool, share in given.items():
        if share:
            after[pool] = after.get(pool, 0) + share
    for pool, share in apportion({p: float(w) for p, w in held.items()}, left).items():
        after[pool] = after.get(pool, 0) + share
    return after, {p: s for p, s in given.items() if s}
