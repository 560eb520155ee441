"""How many access log lines per second does the telemetry ingester take in on one core, and
how much memory does it hold?

Writes N (default 1,000,000) Envoy JSON access log lines in the format the bootstrap renders
(fleetctl/traffic/gateways/envoy/accesslog.py: start, route, pool, status, duration_ms,
ttft_ms, bytes, attempts, ctype, flags) to a temporary file: 1,000 pools x 3 routes, Poisson
arrivals at --rps (default 2,000/s, so the lines span ~8 minutes: ~50 windows of 10 s per
route and pool), 70 % streamed, lognormal TTFT and durations, 1 % 503 with retries, 0.5 %
429. Then, per run (default 3), the real ingester (Ingester.poll/flush with the kind
registry's Envoy parser) reads the whole file from its start into an empty database,
flushing every --flush-interval seconds as the process does, and the totals are checked
(windows' requests == lines).

The process pins itself to one core (sched_setaffinity; said when it cannot). The database
is a temporary SQLite file by default, or PostgreSQL with --database-url (a database of its
own, created if missing; its telemetry rows are emptied). Prints lines/s per run and the
median, the parser alone for comparison, and the peak RSS (getrusage: the largest the
process ever was, generation excluded since the lines are streamed to the file). Asserts
nothing. Usage:

    .venv/bin/python benchmarks/telemetry_ingest.py [--lines 1000000] [--pools 1000]
        [--routes 3] [--rps 2000] [--runs 3] [--flush-interval 1.0]
        [--database-url postgres://postgres@127.0.0.1:5432/fleetctl_bench_telemetry]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_LINES_PER_S = 20_000
ROUTES = ("chat", "code", "summarize", "embed", "batch")


def pin_one_core() -> str:
    try:
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError) as exc:
        return f"NOT pinned ({exc})"
    return f"pinned to core {core}"


def write_lines(path: Path, *, lines: int, pools: int, routes: int, rps: float) -> float:
    """The access log; returns its time span in seconds."""
    rng = random.Random(42)
    t = 1_800_000_000.0
    begin = t
    with path.open("wb") as fp:
        batch = []
        for _ in range(lines):
            t += rng.expovariate(rps)
            pool = rng.randrange(pools)
            route = ROUTES[rng.randrange(routes)]
            streamed = rng.random() < 0.7
            roll = rng.random()
            status, attempts, flags = 200, 1, "-"
            if roll < 0.01:
                status, attempts, flags = 503, 1 + rng.randrange(3), "URX,UF"
            elif roll < 0.015:
                status = 429
            ttft = round(rng.lognormvariate(5.5, 0.6)) if streamed and status == 200 else None
            duration = round((ttft or 0) + rng.lognormvariate(7.5, 0.8))
            entry = {"start": f"{t:.3f}", "route": route, "pool": f"pool-{pool:04d}",
                     "status": status, "duration_ms": duration, "ttft_ms": ttft,
                     "bytes": rng.randrange(200, 20_000), "attempts": attempts,
                     "ctype": "text/event-stream" if streamed else "application/json",
                     "flags": flags}
            batch.append(json.dumps(entry, separators=(",", ":")))
            if len(batch) >= 10_000:
                fp.write(("\n".join(batch) + "\n").encode())
                batch.clear()
        if batch:
            fp.write(("\n".join(batch) + "\n").encode())
    return t - begin


def setup_django(database_url: str | None, data_dir: Path) -> str:
    if database_url:
        os.environ["DATABASE_URL"] = database_url
        from benchmarks.overview_and_pools_api import ensure_database

        ensure_database(database_url)
    else:
        os.environ.pop("DATABASE_URL", None)
        os.environ["FLEETCTL_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connection

    return f"{connection.vendor} {connection.settings_dict['NAME']}"


def ingest_once(path: Path, lines: int,
                flush_interval_s: float) -> tuple[float, float, int, int]:
    """One pass over the file into empty tables: (seconds, CPU seconds of this process, lines
    read, windows' requests). The database's own CPU (PostgreSQL) is not in the CPU figure;
    SQLite's is (it runs in this process)."""
    from fleetctl.telemetry.ingest import Ingester
    from fleetctl.telemetry.models import Cursor, Window
    from fleetctl.traffic.models import Gateway

    # Raw deletes: QuerySet.delete() would load the previous run's 150,000 windows as model
    # instances, and the peak RSS would be the benchmark's, not the ingester's.
    Window.objects.all()._raw_delete(Window.objects.db)  # type: ignore[attr-defined]
    Cursor.objects.all()._raw_delete(Cursor.objects.db)  # type: ignore[attr-defined]
    Gateway.objects.filter(name="bench-gw").delete()
    Gateway.objects.create(name="bench-gw", kind="envoy", admin_address="http://127.0.0.1:1",
                           options={"access_log": str(path)})
    ingester = Ingester(window_s=10, flush_interval_s=flush_interval_s)
    ingester.refresh()
    started = time.perf_counter()
    cpu_started = time.process_time()
    next_flush = started + flush_interval_s
    read = 0
    while read < lines:
        n = ingester.poll()
        read += n
        if time.perf_counter() >= next_flush or n == 0:
            ingester.flush()
            next_flush = time.perf_counter() + flush_interval_s
        if n == 0:
            break
    ingester.flush()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    for follower in ingester.followers.values():
        follower.close()
    total = sum(Window.objects.values_list("requests", flat=True))
    return elapsed, cpu, read, total


def parse_only(path: Path) -> float:
    from fleetctl.traffic.gateways import registry

    parse = registry.get("envoy").parse_access_log
    assert parse is not None
    started = time.perf_counter()
    n = 0
    with path.open("rb") as fp:
        for line in fp:
            parse(line, {})
            n += 1
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--routes", type=int, default=3, choices=range(1, len(ROUTES) + 1))
    parser.add_argument("--rps", type=float, default=2000.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--flush-interval", type=float, default=1.0)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    pinned = pin_one_core()
    with tempfile.TemporaryDirectory(prefix="telemetry-bench-") as folder:
        path = Path(folder) / "access.log"
        span = write_lines(path, lines=args.lines, pools=args.pools, routes=args.routes,
                           rps=args.rps)
        database = setup_django(args.database_url, Path(folder))
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{args.lines:,} lines ({path.stat().st_size / 1e6:.0f} MB) over {span:.0f} s, "
              f"{args.pools:,} pools x {args.routes} routes; database {database}; {pinned}")
        rates, cpu_rates = [], []
        for run in range(1, args.runs + 1):
            elapsed, cpu, read, total = ingest_once(path, args.lines, args.flush_interval)
            rates.append(read / elapsed)
            cpu_rates.append(read / cpu)
            from fleetctl.telemetry.models import Window

            print(f"run {run}: {read:,} lines in {elapsed:.2f} s = {read / elapsed:,.0f} "
                  f"lines/s ({read / cpu:,.0f} per CPU-second); {Window.objects.count():,} "
                  f"windows; requests in windows {total:,} "
                  f"({'all counted once' if total == read else 'MISMATCH'})")
        median = statistics.median(rates)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"parser alone: {parse_only(path):,.0f} lines/s")
        print(f"median: {median:,.0f} lines/s (target {TARGET_LINES_PER_S:,}: "
              f"{median / TARGET_LINES_PER_S:.2f}x); per CPU-second of this process: "
              f"{statistics.median(cpu_rates):,.0f}")
        print(f"peak RSS: {peak:.0f} MB (after Django set-up and migrations: "
              f"{rss_before:.0f} MB)")


if __name__ == "__main__":
    main()
