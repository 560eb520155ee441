"""Live cost per 1M output tokens at a fixed simulated load against the benchmark's figure for
the same pool and SLO (issue 29: target within ±5 %).

One simulated pool (fleetctl.sim, the `fast` profile of benchmarks/pooled_efficiency.py:
per-sequence decode cost raised so the SLO binds at a few streams this 2-core machine's
client can drive), priced at RATE per hour.

1. The benchmark figure: the product's concurrency search (fleetctl/bench/sweep.py through
   pooled_efficiency.best_level: the product's load generator and verdict) finds the most
   streams S meeting the SLO and the output tokens/s they gave; cost per 1M =
   fleet.costs.cost_per_1m(RATE, tokens/s), as a benchmark run records it.
2. The live figure, each repeat: the same trace at S streams (the product's run_level, a
   long window) while the product's scraper (fleetctl/telemetry/scrape.py) reads the pool's
   /metrics — once when the load is steady (S requests running), again STEADY_S later — and
   fleetctl/telemetry/cost.py `live_cost` prices what the counter counted between the two.

Prints both, each repeat's ratio live / benchmark and their median. The database is a fresh
SQLite file under a temporary folder (migrated), so nothing else is touched.

    .venv/bin/python benchmarks/live_cost.py [--repeats 3] [--steady 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.telemetry.cost import LiveCost

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RATE = "36.00"
POOL = "fast"


def running(url: str) -> float:
    """The pool's vllm:num_requests_running now (its /metrics, the scraper's parser)."""
    import httpx

    from fleetctl.telemetry.scrape import RUNNING_NOW, parse_histograms

    return float(parse_histograms(httpx.get(f"{url}/metrics", timeout=5).text)
                 .get(RUNNING_NOW, 0.0))


def live_once(url: str, streams: int, steady_s: float) -> tuple[float, LiveCost]:
    """One live measurement at `streams`: (live cost per 1M, the LiveCost)."""
    from django.utils import timezone

    from benchmarks.pooled_efficiency import MODEL, TRACE
    from fleetctl.bench.runner import Endpoint, LevelPlan, run_level
    from fleetctl.telemetry.cost import live_cost
    from fleetctl.telemetry.scrape import Scraper

    load_plan = LevelPlan(warmup_s=3.0, window_s=steady_s + 15.0, min_samples=1,
                          max_duration_s=steady_s + 60.0, request_timeout_s=30.0, ramp_s=1.0)
    load = threading.Thread(target=lambda: asyncio.run(run_level(
        Endpoint(url, MODEL), TRACE, load_plan, concurrency=streams)), daemon=True)
    scraper = Scraper(timeout_s=5)
    load.start()
    deadline = time.monotonic() + 30
    while running(url) < streams:  # steady: every stream has a request in flight
        if time.monotonic() > deadline:
            raise SystemExit(f"the load never reached {streams} running requests")
        time.sleep(0.05)
    began = timezone.now()
    scraper.scrape_all()
    time.sleep(steady_s)  # the measured interval (a benchmark: its length is the point)
    scraper.scrape_all()
    ended = timezone.now()
    load.join(timeout=steady_s + 90)
    live = live_cost(pool=POOL, since=began - timedelta(seconds=1),
                     until=ended + timedelta(seconds=1))
    if live.cost_per_1m is None:
        raise SystemExit(f"live cost {live.not_measured}")
    return float(live.cost_per_1m), live


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steady", type=float, default=20.0,
                        help="seconds between the two scrapes of each live repeat")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-live-cost-"))
    from benchmarks.pooled_efficiency import MAX_STREAMS_OWN, PROFILES, best_level, plan, start_pool
    from benchmarks.telemetry_ingest import setup_django
    from fleetctl.demo.devstack import LOOPBACK

    # The simulated pool is on this host: allow pools to reach loopback, as the demo does.
    os.environ.setdefault("OUTBOUND_ALLOW_POOLS", LOOPBACK)
    print(f"database: {setup_django(None, folder)}")
    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet import services as fleet_services
    from fleetctl.fleet.costs import cost_per_1m
    from fleetctl.telemetry.models import Cursor, Window

    system = Actor.for_system("benchmark")

    (folder / "profiles.toml").write_text(PROFILES)
    proc, url = start_pool(folder, POOL)
    started = time.perf_counter()
    try:
        region = fleet_services.region_create(actor=system, code="bench", name="Bench",
                                              jurisdiction="US")
        fleet_services.pool_create(actor=system, name=POOL, runtime="cuda",
                                   accelerator="H200", region=region, base_urls=[url + "/v1"],
                                   max_context_tokens=32768, node_hourly_rate=RATE)
        found = asyncio.run(best_level(url, plan(), MAX_STREAMS_OWN, start=8))
        if not found.streams:
            raise SystemExit(f"no level met the SLO: {found.levels}")
        bench = float(cost_per_1m(RATE, found.tokens_per_s))
        print(f"benchmark: {found.tokens_per_s:,.0f} output tok/s at {found.streams} streams "
              f"(levels {found.levels}) -> {bench:.4f} USD per 1M at {RATE} USD/h")
        ratios = []
        for repeat in range(1, args.repeats + 1):
            Window.objects.all().delete()
            Cursor.objects.all().delete()
            live, row = live_once(url, found.streams, args.steady)
            ratios.append(live / bench)
            print(f"[{repeat}] live: {row.output_tokens or 0:,} output tokens in "
                  f"{(row.hours or 0) * 3600:.1f} s ({row.output_tokens_per_s or 0:,.0f} "
                  f"tok/s, mean {row.mean_running or 0:.1f} running) -> {live:.4f} USD per "
                  f"1M; "
                  f"live / benchmark {live / bench:.3f}")
        median = statistics.median(ratios)
        print(f"\nlive / benchmark cost per 1M, median of {len(ratios)}: {median:.3f} "
              f"({(median - 1) * 100:+.1f} %; target within ±5 %: "
              f"{'met' if abs(median - 1) <= 0.05 else 'NOT met'})")
        print(f"wall time {time.perf_counter() - started:.0f} s")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
