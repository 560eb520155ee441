"""A/A traffic for the standing watch, as fast as the database writes it: twin pools' 10-s
telemetry windows (Window rows, as the ingester writes them) and a `watch_tick(now=…)` per
judged window on a moving clock. Every request's first byte is drawn from one lognormal
(median `median_ms`, shape `sigma`), and every 10-s window of each pool is scaled by its own
load factor (uniform ±`load`) — replicas and batches differ from window to window, which
makes two identical pools look less alike than their samples alone would. Errors at
`error_rate` on both. Used by tests/ramps/test_watch.py (two hours) and by a benchmark (20 A/A
hours: `run_aa(watch, hours=20)`)."""

from __future__ import annotations

import math
import random
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from tests.ramps.windows import RESOLUTION_S, window


def run_aa(watch: Any, *, start: datetime, hours: float, rps: float = 8.0, seed: int = 27,
           median_ms: float = 120.0, sigma: float = 0.35, load: float = 0.15,
           error_rate: float = 0.005, primary: str | None = None) -> dict[str, Any]:
    """Twin telemetry for `watch`'s pool and the route's primary from `start` (a boundary of
    the watch's window) for `hours`, ticking after each window. Returns the verdict counts,
    the windows judged and whether the watch drained (or ended)."""
    from fleetctl.ramps.models import Watch, WatchVerdict
    from fleetctl.ramps.services import watch_tick
    from fleetctl.ramps.services.watch import watch_span_s

    rng = random.Random(seed)
    span = watch_span_s(watch)
    per_window = round(rps * RESOLUTION_S)
    pools = [watch.pool.name, primary or watch.route.primary_pool.name]
    t = start
    judged = 0
    for _ in range(int(hours * 3600 // span)):
        for sub in range(span // RESOLUTION_S):
            at = t + timedelta(seconds=RESOLUTION_S * sub)
            for pool in pools:
                factor = rng.uniform(1 - load, 1 + load)
                window(pool=pool, start=at, route=watch.route.name,
                       ttft=[factor * rng.lognormvariate(math.log(median_ms), sigma)
                             for _ in range(per_window)],
                       errors=sum(rng.random() < error_rate for _ in range(per_window)))
        t += timedelta(seconds=span)
        judged += watch_tick(now=t + timedelta(seconds=RESOLUTION_S), only=watch.pk)
    watch = Watch.objects.get(pk=watch.pk)
    verdicts = Counter(WatchVerdict.objects.filter(watch=watch)
                       .values_list("verdict", flat=True))
    return {"verdicts": dict(verdicts), "judged": judged, "state": watch.state,
            "drained": watch.drain_id is not None,
            "fail_streaks_acted": WatchVerdict.objects.filter(
                watch=watch, action__in=["drained", "alerted"]).count()}
