"""False drains of the standing live watch over A/A hours: after a ramp completes, the watch
judges the candidate (policy drain) against the SLO and the primary, window after window; the
candidate is the primary's twin, so every drain, alert or failed window is a false alarm.
Target: 0 drains in 20 A/A hours.

What is simulated: the traffic. Each pool's 10-s telemetry windows are written as the
ingester writes them (`Window` rows with TTFT histograms), `--rps` streamed requests a second
per pool, first bytes from one lognormal (median 120 ms, shape 0.35), every 10-s window of
each pool scaled by its own load factor (±15 %: replicas and batches differ from window to
window) and 0.5 % errors on both (tests/ramps/watch_aa.py). What is real: the ramp that
completes and hands over, the watch's own tick (`watch_tick(now=…)`, beat's
`ramps.watch_tick`) judging each window through the guard's statistics, its streak rule and
its drain path, on PostgreSQL (`DATABASE_URL`, default a local `fleetctl_bench_watch`,
recreated empty). The clock is moved, not waited for: 20 hours take about 100 s.

    .venv/bin/python benchmarks/watch_aa_false_drains.py [--hours 20] [--seeds 2]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "llama-3.1-8b-instruct"
THRESHOLDS = {"slo_ttft_p95_ms": 500.0, "slo_tpot_p95_ms": 100.0, "slo_error_rate": 0.05,
              "latency_margin_pct": 10.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=20.0)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--rps", type=float, default=8.0)
    args = parser.parse_args()
    from benchmarks.ramp_fault_to_drained import setup_env

    setup_env("fleetctl_bench_watch")
    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet.services import (
        pool_create,
        pool_health_record,
        pool_model_create,
        region_create,
    )
    from fleetctl.ramps.models import Watch
    from fleetctl.ramps.services import ramp_create, ramps_tick
    from fleetctl.traffic.services import route_create
    from tests.ramps.watch_aa import run_aa
    from tests.ramps.windows import boundary, traffic

    system = Actor.for_system("bench")
    region = region_create(actor=system, code="us-east", name="US East", jurisdiction="US")
    oncall = User.objects.create_user(username="bench-oncall")
    oncall.groups.set([Group.objects.get_or_create(name="on-call")[0]])
    totals: Counter[str] = Counter()
    drains = alerts = 0
    began = time.monotonic()
    for seed in range(1, args.seeds + 1):
        pools = {}
        for name in (f"prim-{seed}", f"cand-{seed}"):
            pool = pool_create(actor=system, name=name, runtime="cuda", accelerator="H200",
                               region=region, base_urls=["http://127.0.0.1:9"],
                               max_context_tokens=4096, node_hourly_rate="10.00")
            pool_model_create(actor=system, pool=pool, model_id=f"{MODEL}-{seed}",
                              max_context_tokens=4096)
            pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
            pools[name] = pool
        route = route_create(actor=system, name=f"llama-{seed}", model_id=f"{MODEL}-{seed}",
                             primary_pool=pools[f"prim-{seed}"], reason="benchmark")
        ramp = ramp_create(actor=Actor(user=oncall), route=route, pool=pools[f"cand-{seed}"],
                           steps=[{"percent": 50, "hold_s": 30}], reason="benchmark",
                           **THRESHOLDS)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        good = [100.0] * 60
        traffic(since=t0, until=t0 + timedelta(seconds=31), route=route.name,
                per_window={f"cand-{seed}": good, f"prim-{seed}": good})
        ramps_tick(now=t0 + timedelta(seconds=31))
        ramp.refresh_from_db()
        if ramp.state != "complete":
            raise SystemExit(f"seed {seed}: the ramp ended {ramp.state}: {ramp.state_reason}")
        watch = Watch.objects.get(route=route, pool=pools[f"cand-{seed}"])
        epoch = watch.started_at.timestamp()
        start = watch.started_at + timedelta(seconds=math.ceil(epoch / 30) * 30 - epoch)
        lap = time.monotonic()
        result = run_aa(watch, start=start, hours=args.hours, rps=args.rps, seed=seed)
        totals.update(result["verdicts"])
        drains += int(result["drained"])
        alerts += result["fail_streaks_acted"]
        print(f"seed {seed}: {result['judged']} windows judged in {time.monotonic() - lap:.0f} s: "
              f"{result['verdicts']}; watch {result['state']}, drained {result['drained']}, "
              f"fail streaks acted on {result['fail_streaks_acted']}", flush=True)
    print(f"\n{args.seeds} × {args.hours:g} A/A hours ({sum(totals.values())} windows): "
          f"false drains {drains} (target 0), fail streaks acted on {alerts}, failed windows "
          f"{totals.get('fail', 0)}, warn {totals.get('warn', 0)}, insufficient "
          f"{totals.get('insufficient', 0)}; {time.monotonic() - began:.0f} s in all")


if __name__ == "__main__":
    main()
