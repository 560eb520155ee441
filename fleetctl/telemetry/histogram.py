"""Latency histograms with fixed log buckets, in milliseconds, that merge by adding.

Bucket i covers [B^i, B^(i+1)) ms with B = 2^(1/8): every value in a bucket is within a factor
B^(1/2) (4.4 %) of the bucket's geometric middle, whatever the scale. Values below 1 ms go
to bucket 0 and values above the last bucket's start (2^(MAX_BUCKET/8) ms, about 64 minutes:
longer than any answer a gateway lets run) are capped into it.

Because the buckets are the same everywhere, two histograms of the same thing merge exactly
by adding counts: a window flushed in pieces, six 10 s windows downsampled into one minute,
and the windows of several gateways in front of one pool all merge without losing anything
more than the bucket width. A histogram is a sparse `dict[str, int]` ({bucket index: count},
string keys so it is stored as JSON as is).

A Prometheus histogram (a pool's /metrics) has its own few buckets; `from_cumulative` spreads
each of them linearly over the log buckets it covers, as Prometheus' histogram_quantile
interpolates inside a bucket, so pool figures merge and read like gateway figures (their
resolution is still the pool's buckets: the Figure says where it comes from).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

B = 2.0 ** (1.0 / 8.0)
_LOG2_SCALE = 8.0  # log_B(x) = 8 · log2(x)
MAX_BUCKET = 175
RELATIVE_ERROR = math.sqrt(B) - 1.0  # the most a geometric middle is off inside a bucket

Histogram = dict[str, int]
# EDGES[i] = 2^(i/8): where bucket i starts. bucket_of checks against these so that a value
# and the edges quantile_interval reports never disagree by a rounding.
EDGES = [2.0 ** (i / _LOG2_SCALE) for i in range(MAX_BUCKET + 2)]


def bucket_of(ms: float) -> int:
    """The bucket of a duration in ms (below 1 ms: 0; NaN: 0; beyond the last: the last)."""
    if not ms >= 1.0:  # also catches NaN
        return 0
    if ms == math.inf:
        return MAX_BUCKET
    index = int(math.log2(ms) * _LOG2_SCALE)
    if index >= MAX_BUCKET:
        return MAX_BUCKET
    if ms < EDGES[index]:
        return index - 1
    if ms >= EDGES[index + 1]:
        return index + 1
    return index


def value_of(i: int) -> float:
    """The bucket's geometric middle, in ms: the value every sample in it is read as."""
    return float(2.0 ** ((i + 0.5) / _LOG2_SCALE))


def lower_edge(i: int) -> float:
    """Smallest value bucket i can hold (0 for bucket 0, which takes everything below 1 ms)."""
    return 0.0 if i <= 0 else EDGES[i]


def upper_edge(i: int) -> float:
    """Where bucket i ends. The last bucket also holds what was capped into it, so its edge
    is a floor on those values, not a bound."""
    return EDGES[i + 1]


def add(h: Histogram, ms: float, n: int = 1) -> None:
    """Count `n` samples of `ms` into `h` in place."""
    key = str(bucket_of(ms))
    h[key] = h.get(key, 0) + n


def merge(a: Mapping[str, int], b: Mapping[str, int]) -> Histogram:
    """A new histogram holding both (exact: the buckets are the same everywhere)."""
    out = dict(a)
    for key, n in b.items():
        out[key] = out.get(key, 0) + n
    return out


def merge_all(histograms: Iterable[Mapping[str, int]]) -> Histogram:
    out: Histogram = {}
    for h in histograms:
        for key, n in h.items():
            out[key] = out.get(key, 0) + n
    return out


def count(h: Mapping[str, int]) -> int:
    return sum(h.values())


def _sorted(h: Mapping[str, int]) -> list[tuple[int, int]]:
    return sorted((int(key), n) for key, n in h.items() if n > 0)


def _bucket_at(buckets: Sequence[tuple[int, int]], rank: int) -> int:
    """The bucket holding the rank-th smallest sample (0-based)."""
    seen = 0
    for index, n in buckets:
        seen += n
        if rank < seen:
            return index
    return buckets[-1][0]


def quantile(h: Mapping[str, int], q: float) -> float | None:
    """The q-quantile (0..1) in ms, None for an empty histogram.

    Defined as numpy's default (linear) quantile of the samples, each sample read as its
    bucket's geometric middle: so it is within RELATIVE_ERROR of the exact sample quantile
    for values from 1 ms up to the last bucket."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"a quantile is between 0 and 1, not {q!r}")
    buckets = _sorted(h)
    n = sum(c for _, c in buckets)
    if n == 0:
        return None
    rank = q * (n - 1)
    below = math.floor(rank)
    fraction = rank - below
    low = value_of(_bucket_at(buckets, below))
    if fraction == 0.0:
        return low
    high = value_of(_bucket_at(buckets, min(n - 1, below + 1)))
    return low + (high - low) * fraction


def quantile_interval(h: Mapping[str, int], q: float,
                      confidence: float = 0.99) -> tuple[float, float] | None:
    """Bounds on the q-quantile of what the samples were drawn from, in ms; None when empty.

    The ranks come from `inference.confidence.quantile_rank_interval` (binomial order statistics,
    distribution-free); each bound is the outer edge of the bucket that rank falls in, so
    the bucketing never narrows the interval. With few samples the ranks reach the smallest
    and largest sample and the interval is wide rather than wrong."""
    from fleetctl.inference.confidence import quantile_rank_interval

    buckets = _sorted(h)
    n = sum(c for _, c in buckets)
    if n == 0:
        return None
    lo_rank, hi_rank = quantile_rank_interval(n, q, confidence)
    return lower_edge(_bucket_at(buckets, lo_rank)), upper_edge(_bucket_at(buckets, hi_rank))


def from_cumulative(buckets: Sequence[tuple[float, float]],
                    previous: Sequence[tuple[float, float]] | None = None) -> Histogram:
    """What a Prometheus histogram counted since `previous` (both: [(le in seconds,
    cumulative count)], "+Inf" as math.inf), in log buckets.

    Each Prometheus bucket (le_prev, le] is spread over the log buckets it overlaps in
    proportion to the overlap's length (histogram_quantile's linear interpolation), counts
    kept whole by largest remainder so the total is exact. The first bucket starts at 0;
    the +Inf bucket's samples are put at the highest finite bound, as histogram_quantile
    does. A count lower than before means the server restarted: the new counts are the
    delta."""
    current = _normalised(buckets)
    before = dict(_normalised(previous)) if previous else {}
    if before and any(cum < before.get(le, 0.0) for le, cum in current):
        before = {}
    out: Histogram = {}
    lower_s = 0.0
    cumulative_before = 0.0
    highest_finite = max((le for le, _ in current if le != math.inf), default=0.0)
    for le, cum in current:
        delta = cum - before.get(le, 0.0)
        in_bucket = round(delta - cumulative_before)
        cumulative_before = delta
        if in_bucket > 0:
            if le == math.inf:
                add(out, highest_finite * 1000.0, in_bucket)
            else:
                _spread(out, lower_s * 1000.0, le * 1000.0, in_bucket)
        if le != math.inf:
            lower_s = le
    return out


def _normalised(buckets: Sequence[tuple[float, float]] | None) -> list[tuple[float, float]]:
    out = []
    for le, cum in buckets or ():
        bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
        out.append((bound, float(cum)))
    out.sort()
    return out


def _spread(h: Histogram, low_ms: float, high_ms: float, n: int) -> None:
    first, last = bucket_of(low_ms), bucket_of(high_ms)
    if high_ms <= low_ms or first == last:
        add(h, high_ms if high_ms <= low_ms else (low_ms + high_ms) / 2, n)
        return
    width = high_ms - low_ms
    shares = []
    for i in range(first, last + 1):
        top = high_ms if i == last else upper_edge(i)
        bottom = low_ms if i == first else lower_edge(i)
        shares.append((i, max(0.0, top - bottom) / width * n))
    whole = {i: int(share) for i, share in shares}
    left = n - sum(whole.values())
    for i, _ in sorted(shares, key=lambda item: (whole[item[0]] - item[1], item[0]))[:left]:
        whole[i] += 1
    for i, k in whole.items():
        if k:
            key = str(i)
            h[key] = h.get(key, 0) + k
