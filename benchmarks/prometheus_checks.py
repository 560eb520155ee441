"""What a query check costs fleetctl: one measurement (fleetctl/prometheus/query.py: the
outbound rules, the HTTP call to Prometheus, reading and judging the answer) against a real
Prometheus (Debian's package) scraping one simulated pool, paced at 100 checks per minute.

Each round runs `--checks` measurements spread evenly over a minute's pace (60/100 s apart,
so 100 per minute), cycling through four queries of the kinds gates and guards use: a
histogram p95 over 5 minutes, a gauge sum, a ratio and `up`. Reported: per round the p50 and
p95 wall latency of one measurement and the CPU this process spent per measurement
(`time.process_time`, which is what a Celery worker would spend); the median over rounds is
printed. The Prometheus's own CPU is not fleetctl's and is printed apart, per query.

    .venv/bin/python benchmarks/prometheus_checks.py [--rounds 5] [--checks 100]
        [--pace-per-minute 100]

Needs /usr/bin/prometheus (apt-get install prometheus) and a migrated database (DATABASE_URL:
the outbound rules read the registered gateways, fleetctl's own services); the source itself is
an unsaved row. The pool gets no traffic, so the TTFT p95 query answers NaN: insufficient, as
it should (the statuses are printed); it costs the same to ask.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
from fleetctl.demo.devstack import local_destinations  # noqa: E402

local_destinations(os.environ)

import django  # noqa: E402

django.setup()

from benchmarks._sim import start_simulator  # noqa: E402
from fleetctl.demo.prometheus_process import (  # noqa: E402
    INSTALL_HINT,
    PrometheusProcess,
    ScrapeJob,
    prometheus_binary,
)
from fleetctl.prometheus.models import MetricSource  # noqa: E402
from fleetctl.prometheus.query import QuerySpec, measure  # noqa: E402
from tests.support.profiles import TEST_PROFILES  # noqa: E402

POOL = "bench"
QUERIES = [
    QuerySpec("prom", 'histogram_quantile(0.95, sum by (le) (rate('
                      'vllm:time_to_first_token_seconds_bucket{pool="$pool"}[5m]))) * 1000',
              failure="result > 800"),
    QuerySpec("prom", 'sum(vllm:num_requests_waiting{pool="$pool"})', success="result < 32"),
    QuerySpec("prom", 'sum(vllm:num_requests_running{pool="$pool"}) / '
                      'clamp_min(sum(vllm:num_requests_waiting{pool="$pool"}) + 1, 1)',
              success="result >= 0"),
    QuerySpec("prom", 'up{pool="$pool"}', success="result == 1"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--checks", type=int, default=100)
    parser.add_argument("--pace-per-minute", type=float, default=100.0)
    args = parser.parse_args()
    if prometheus_binary() is None:
        raise SystemExit(INSTALL_HINT)
    with tempfile.TemporaryDirectory() as tmp:
        profiles = Path(tmp) / "profiles.toml"
        profiles.write_text(TEST_PROFILES)
        sim, url = start_simulator(profiles, "--pool", f"{POOL}=quick@0")
        prom = PrometheusProcess(Path(tmp) / "prom", jobs=[
            ScrapeJob("pool", f"{url}/metrics", {"pool": POOL})]).start()
        try:
            source = MetricSource(name="prom", base_url=prom.url, timeout_s=5.0)
            deadline = time.monotonic() + 30
            while measure(source, QUERIES[3], pool=POOL).status != "pass":
                if time.monotonic() > deadline:
                    raise SystemExit(f"prometheus never scraped the pool:\n{prom.log()}")
                time.sleep(0.2)
            gap = 60.0 / args.pace_per_minute
            p50s, p95s, cpus = [], [], []
            statuses: dict[str, int] = {}
            for round_ in range(args.rounds):
                latencies = []
                cpu_started = time.process_time()
                start = time.monotonic()
                for i in range(args.checks):
                    due = start + i * gap
                    pause = due - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)  # pacing the load, not synchronising a result
                    began = time.perf_counter()
                    result = measure(source, QUERIES[i % len(QUERIES)], pool=POOL)
                    latencies.append((time.perf_counter() - began) * 1000)
                    statuses[result.status] = statuses.get(result.status, 0) + 1
                cpu_ms = (time.process_time() - cpu_started) * 1000 / args.checks
                latencies.sort()
                p50s.append(statistics.median(latencies))
                p95s.append(latencies[int(0.95 * (len(latencies) - 1))])
                cpus.append(cpu_ms)
                print(f"round {round_ + 1}: p50 {p50s[-1]:.2f} ms, p95 {p95s[-1]:.2f} ms, "
                      f"CPU {cpu_ms:.2f} ms per check", flush=True)
            print(f"statuses: {statuses}")
            print(f"median over {args.rounds} rounds at {args.pace_per_minute:g} checks/min: "
                  f"p50 {statistics.median(p50s):.2f} ms, p95 {statistics.median(p95s):.2f} "
                  f"ms, CPU {statistics.median(cpus):.2f} ms per check "
                  f"({statistics.median(cpus) * args.pace_per_minute / 60000 * 100:.3f} % of "
                  f"one core at that pace)")
        finally:
            prom.stop()
            sim.terminate()
            sim.wait()


if __name__ == "__main__":
    main()
