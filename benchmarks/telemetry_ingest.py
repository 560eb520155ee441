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

Sharded (--processes 1,2,4): --logs (default 8) gateways, each with its own log of
lines / logs lines (a seed of its own), and per count of processes and run, that many real
ingester processes (`python -m fleetctl.telemetry.ingest --no-scrape`, unpinned) are started
on an empty database and left to share the shards (a lease per log, at most
ceil(logs / processes) each); once they hold them all, the logs are hard-linked into place
at once and the clock runs until the cursors have counted every line. Prints per run the
lines/s (wall clock, including up to one flush interval of latency) and the lines per
CPU-second of the ingester processes (utime + stime from /proc, between the link and the
last line: the database's own CPU is not in it; PostgreSQL's backends are measured apart
when /proc shows them), and the medians per count. On a machine with C cores the wall-clock
rate cannot grow past C processes (PostgreSQL shares them too): the rate per CPU-second is the
figure that shows whether sharding costs work, and the lines over the busiest ingester's
CPU-seconds the rate the set would reach with a core per ingester (the database aside).

    .venv/bin/python benchmarks/telemetry_ingest.py --processes 1,2,4 [--logs 8]
        [--lines 800000] [--runs 3] --database-url postgres://...
"""

from __future__ import annotations

import argparse
import contextlib
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


def write_lines(path: Path, *, lines: int, pools: int, routes: int, rps: float,
                seed: int = 42) -> float:
    """The access log; returns its time span in seconds."""
    rng = random.Random(seed)
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
    from fleetctl.telemetry.ingest import Ingester, log_shard
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
    assert ingester.claim(log_shard("bench-gw"))
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
    ingester.release()
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


def _cpu_s(pid: int) -> float:
    """utime + stime of a process so far (seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _database_cpu_s() -> dict[int, float]:
    """PostgreSQL on this machine: backend pid -> CPU seconds of every other connection to
    this database (the ingesters'); {} on SQLite or when /proc cannot see the server."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        pids = [row[0] for row in cursor.fetchall()]
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            out[pid] = _cpu_s(pid)
    return out


def sharded_once(sources: list[Path], live: list[Path], processes: int, lines: int,
                 flush_interval_s: float) -> tuple[float, list[float], float | None, int, int]:
    """`processes` real ingesters over the logs: (seconds, each one's CPU seconds, their
    database backends' CPU seconds (None when not seen), lines the cursors counted, windows'
    requests)."""
    import signal
    import subprocess
    from datetime import UTC, datetime

    from django.db import connection

    from fleetctl.telemetry.ingest import LEASE_SOURCE, SHARD_PREFIX
    from fleetctl.telemetry.models import Cursor, Window

    Window.objects.all()._raw_delete(Window.objects.db)  # type: ignore[attr-defined]
    Cursor.objects.all()._raw_delete(Cursor.objects.db)  # type: ignore[attr-defined]
    for path in live:
        path.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if connection.vendor == "sqlite":
        env.pop("DATABASE_URL", None)
    logs = [live[0].parent / f"ingester-{processes}-{k}.log" for k in range(processes)]
    procs = []
    for log in logs:  # their logs stay in the temporary folder (shown if one fails)
        with log.open("ab") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "fleetctl.telemetry.ingest", "--no-scrape",
                 "--flush-interval", str(flush_interval_s)], cwd=REPO, env=env, stdout=out,
                stderr=subprocess.STDOUT))
    try:
        quota = -(-len(live) // processes)
        deadline = time.monotonic() + 120
        while True:  # wait until the processes share every shard, at most `quota` each
            now = datetime.now(tz=UTC)
            owners = list(Cursor.objects.filter(
                source_name=LEASE_SOURCE, path__startswith=SHARD_PREFIX, updated_at__gte=now,
            ).values_list("last_counters__owner", flat=True))
            counts = [owners.count(o) for o in set(owners)]
            if len(owners) == len(live) and len(counts) == min(processes, len(live)) \
                    and max(counts) <= quota:
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"the ingesters did not share the shards: {owners}; "
                                   f"{logs[0].read_text()[-2000:]}")
            time.sleep(0.1)
        cpu_before = [_cpu_s(p.pid) for p in procs]
        db_before = _database_cpu_s()
        started = time.perf_counter()
        for source, path in zip(sources, live, strict=True):
            os.link(source, path)
        while True:
            read = sum(Cursor.objects.exclude(source_name=LEASE_SOURCE)
                       .values_list("lines", flat=True))
            if read >= lines:
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("an ingester exited")
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        cpu = [_cpu_s(p.pid) - before for p, before in zip(procs, cpu_before, strict=True)]
        db_after = _database_cpu_s()
        db_cpu = sum(db_after[pid] - db_before.get(pid, 0.0) for pid in db_after) \
            if db_after else None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    total = sum(Window.objects.values_list("requests", flat=True))
    return elapsed, cpu, db_cpu, read, total


def sharded(args: argparse.Namespace, folder: Path) -> None:
    counts = [int(n) for n in args.processes.split(",")]
    per_log = args.lines // args.logs
    sources, live = [], []
    for k in range(args.logs):
        source = folder / f"source-{k}.log"
        write_lines(source, lines=per_log, pools=args.pools, routes=args.routes,
                    rps=args.rps / args.logs, seed=42 + k)
        sources.append(source)
        live.append(folder / f"access-{k}.log")
    lines = per_log * args.logs
    database = setup_django(args.database_url, folder)
    from fleetctl.telemetry.models import Window
    from fleetctl.traffic.models import Gateway

    Gateway.objects.filter(name__startswith="bench-gw").delete()
    for k, path in enumerate(live):
        Gateway.objects.create(name=f"bench-gw-{k}", kind="envoy",
                               admin_address="http://127.0.0.1:1",
                               options={"access_log": str(path)})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{lines:,} lines in {args.logs} logs ({sum(s.stat().st_size for s in sources) / 1e6:.0f}"
          f" MB), {args.pools:,} pools x {args.routes} routes; database {database}; {cores} "
          f"cores; flush every {args.flush_interval:g} s")
    summary = []
    for processes in counts:
        rates, cpu_rates, db_shares, core_rates = [], [], [], []
        for run in range(1, args.runs + 1):
            elapsed, cpus, db_cpu, read, total = sharded_once(sources, live, processes, lines,
                                                              args.flush_interval)
            cpu = sum(cpus)
            core_rates.append(read / max(cpus))
            rates.append(read / elapsed)
            cpu_rates.append(read / cpu)
            db = "not seen"
            if db_cpu is not None:
                db_shares.append(read / (cpu + db_cpu))
                db = f"{db_cpu:.2f} (with it {read / (cpu + db_cpu):,.0f} lines per CPU-second)"
            print(f"{processes} process(es), run {run}: {read:,} lines in {elapsed:.2f} s = "
                  f"{read / elapsed:,.0f} lines/s; ingesters {cpu:.2f} CPU-s = "
                  f"{read / cpu:,.0f} lines per CPU-second (busiest "
                  f"{max(cpus):.2f}: {read / max(cpus):,.0f} lines/s with a core each); "
                  f"database CPU-s {db}; "
                  f"{Window.objects.count():,} windows; requests in windows {total:,} "
                  f"({'all counted once' if total == read == lines else 'MISMATCH'})",
                  flush=True)
        summary.append((processes, statistics.median(rates), statistics.median(cpu_rates),
                        statistics.median(db_shares) if db_shares else None,
                        statistics.median(core_rates)))
    base_rate, base_cpu = summary[0][1], summary[0][2]
    base_core = summary[0][4]
    print("| processes | lines/s | vs 1st | lines per ingester CPU-s | vs 1st | "
          "lines per CPU-s with the database's | lines / busiest ingester's CPU-s | vs 1st |")
    print("|---|---|---|---|---|---|---|---|")
    for processes, rate, cpu_rate, with_db, core_rate in summary:
        print(f"| {processes} | {rate:,.0f} | {rate / base_rate:.2f}x | {cpu_rate:,.0f} | "
              f"{cpu_rate / base_cpu:.2f}x | "
              f"{'-' if with_db is None else f'{with_db:,.0f}'} | {core_rate:,.0f} | "
              f"{core_rate / base_core:.2f}x |")
    print(f"(medians of {args.runs} runs; wall-clock lines/s cannot grow past the {cores} "
          "cores, which PostgreSQL and anything else running share; lines / the busiest "
          "ingester's CPU-s is the rate the set would reach with a core per ingester, the "
          "database aside)")
    for path in live:
        path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--routes", type=int, default=3, choices=range(1, len(ROUTES) + 1))
    parser.add_argument("--rps", type=float, default=2000.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--flush-interval", type=float, default=1.0)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--processes", default=None,
                        help="sharded: counts of ingester processes, e.g. 1,2,4")
    parser.add_argument("--logs", type=int, default=8, help="sharded: gateways' logs")
    args = parser.parse_args()
    if args.processes:
        with tempfile.TemporaryDirectory(prefix="telemetry-bench-") as folder:
            sharded(args, Path(folder))
        return
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
