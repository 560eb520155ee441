"""False rollbacks of A/A ramps: the candidate is the primary's twin (same simulator profile,
no replica noise), so every rollback, warn or failing check is a false alarm. Target 0.

Four routes (one model each) through two Envoy gateways, each route carrying streamed chat
traffic (the `openai` client, `--rps` per route); on each route, one guarded ramp of the twin
after another (20 % then 50 %, short holds), four routes in parallel, until `--ramps` ramps have
finished. Reported: how many completed, rolled back, paused on a warn, or ended otherwise; how
many FAIL checks and WARN decisions were written along the way; the wall time and the settings.

The real path, as benchmarks/ramp_fault_to_drained.py (whose World it uses): Envoy's access
log → the ingester process → windows → a Celery worker ticking the ramps (`ramps.tick` sent
every RAMP_TICK_INTERVAL_S, as beat does) and pushing each step to the gateways.

With `--prometheus` (needs /usr/bin/prometheus), a real Prometheus scrapes both simulated
pools every second and every ramp's guard also lists two query checks against it
(`metric_checks`, fleetctl/prometheus/query.py): the twin's TTFT p95 over the last 30 s
against the SLO, and its ratio to the primary's (at most 2×, the guard's own latency
margin). The same Prometheus is a telemetry source too (`telemetry_selector`), so the
ingester writes its windows beside the access logs'; reported at the end: the measurements'
statuses, every rollback's reason, and each pool's TTFT p95 from the gateways and from
Prometheus over the run.

    .venv/bin/python benchmarks/ramp_aa_false_rollbacks.py [--ramps 20] [--routes 4]
        [--prometheus]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = ["llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "mistral-7b-instruct",
          "gemma-2-9b-it"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ramps", type=int, default=20)
    parser.add_argument("--routes", type=int, default=4, choices=range(1, len(MODELS) + 1))
    parser.add_argument("--rps", type=float, default=5.0, help="per route")
    parser.add_argument("--hold-s", type=float, default=12.0)
    parser.add_argument("--window-s", type=int, default=10)
    parser.add_argument("--min-samples", type=int, default=8)
    parser.add_argument("--prometheus", action="store_true",
                        help="guard every ramp with query checks against a real Prometheus")
    args = parser.parse_args()
    from benchmarks.ramp_fault_to_drained import World, settings_line, setup_env

    setup_env("fleetctl_bench_ramp_aa")
    from fleetctl.ramps.models import Ramp, RampEvent
    from fleetctl.ramps.services import ramp_abort, ramp_create
    from fleetctl.traffic.services import revision_create
    from tests.ramps import e2e

    models = MODELS[:args.routes]
    routes = {f"aa-{i + 1}": (model, "primary") for i, model in enumerate(models)}
    work = Path(tempfile.mkdtemp(prefix="ramp-aa-"))
    began = time.monotonic()
    from django.utils import timezone

    began_at = timezone.now()
    world = World(work, pools=["primary", "twin"], routes=routes, models=models)
    steps = [{"percent": 20, "hold_s": args.hold_s}, {"percent": 50, "hold_s": args.hold_s}]
    outcomes: Counter[str] = Counter()
    ramps: list[int] = []
    checks = _prometheus(world, work) if args.prometheus else []
    try:
        for model in models:
            world.traffic(args.rps, model=model)
        print(f"{args.routes} routes × {args.rps:g} streamed requests/s through 2 Envoys; "
              f"steps {steps}; window {args.window_s} s, min_samples {args.min_samples}, "
              f"failure_threshold 2; thresholds {e2e.THRESHOLDS}; {settings_line()}",
              flush=True)
        active: dict[str, int] = {}
        while len(ramps) < args.ramps or active:
            for name, route in world.routes.items():
                if name in active:
                    ramp = Ramp.objects.get(pk=active[name])
                    if ramp.state == "paused":  # a warn: a false alarm too; end it
                        outcomes["paused (warn)"] += 1
                        print(f"ramp {ramp.pk} on {name}: paused ({ramp.state_reason})",
                              flush=True)
                        ramp_abort(actor=world.actor, ramp=ramp, reason="benchmark: A/A warn")
                        del active[name]
                    elif not ramp.active:
                        outcomes[ramp.state] += 1
                        print(f"ramp {ramp.pk} on {name}: {ramp.state} "
                              f"({time.monotonic() - began:.0f} s)", flush=True)
                        del active[name]
                    continue
                if len(ramps) >= args.ramps:
                    continue
                route.refresh_from_db()
                revision_create(actor=world.actor, route=route, weights={"primary": 100},
                                base_revision=route.revision_number,
                                reason="benchmark: back to the primary before the next ramp")
                route.refresh_from_db()
                ramp = ramp_create(actor=world.actor, route=route, pool=world.pools["twin"],
                                   steps=steps, min_samples=args.min_samples,
                                   window_s=args.window_s, reason="benchmark A/A",
                                   metric_checks=checks, **e2e.THRESHOLDS)
                active[name] = ramp.pk
                ramps.append(ramp.pk)
            time.sleep(1.0)
    finally:
        world.close()
    events = Counter(RampEvent.objects.filter(ramp_id__in=ramps)
                     .values_list("kind", flat=True))
    elapsed = time.monotonic() - began
    print(f"\n{len(ramps)} A/A ramps in {elapsed:.0f} s ({elapsed / 60:.1f} min): "
          + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    print(f"rollbacks: {outcomes['rolled-back']} (target 0); FAIL checks written: "
          f"{events['fail']}; WARN decisions: {events['warn']}; PASS: {events['pass']}; "
          f"WAIT notes: {events['wait']}")
    if checks:
        _prometheus_report(ramps, began_at)
    print(f"logs: {work}")


# The guard's extra metrics: the twin's TTFT p95 over the last 30 s (ms) against the SLO
# (e2e.THRESHOLDS: 250 ms), and its ratio to the primary's (the guard's own margin: 100 %).
TTFT_P95 = ('histogram_quantile(0.95, sum by (le) (rate('
            'vllm:time_to_first_token_seconds_bucket{{pool="{pool}"}}[30s])))')


def _prometheus(world: object, work: Path) -> list[dict[str, str]]:
    """Start a Prometheus scraping both pools, register it (also as a telemetry source) and
    give the ramps' query checks."""
    from fleetctl.core.http import http_get
    from fleetctl.demo.prometheus_process import (
        INSTALL_HINT,
        PrometheusProcess,
        ScrapeJob,
        prometheus_binary,
    )
    from fleetctl.prometheus.models import MetricSource
    from tests.support.waiting import wait_until

    if prometheus_binary() is None:
        raise SystemExit(INSTALL_HINT)
    sim = world.sim  # type: ignore[attr-defined]
    prometheus = PrometheusProcess(work / "prometheus", jobs=[
        ScrapeJob(f"pool-{p}", f"{sim.url(p)}/metrics", {"pool": p})
        for p in ("primary", "twin")], scrape_interval_s=1.0).start()
    world._closers.append(prometheus.stop)  # type: ignore[attr-defined]

    def up() -> bool:
        answer = http_get(f"{prometheus.url}/api/v1/query?query=up", timeout_s=5).json()
        return sum(1 for s in answer["data"]["result"] if s["value"][1] == "1") == 2

    wait_until(up, timeout_s=60, what="Prometheus to scrape both pools",
               explain=prometheus.log)
    MetricSource.objects.create(name="prom", base_url=prometheus.url, created_by="bench",
                                telemetry_selector='pool="$pool"')
    twin = TTFT_P95.format(pool="$pool")
    return [
        {"source": "prom", "name": "twin TTFT p95 (Prometheus)", "query": f"{twin} * 1000",
         "failure": "result > 250"},
        {"source": "prom", "name": "twin/primary TTFT p95 (Prometheus)",
         "query": f"{twin} / {TTFT_P95.format(pool='primary')}", "failure": "result > 2"},
    ]


def _prometheus_report(ramps: list[int], began_at: object) -> None:
    from datetime import datetime

    from django.utils import timezone

    from fleetctl.ramps.models import RampEvent
    from fleetctl.telemetry.models import Window
    from fleetctl.telemetry.selectors import pool_stats

    statuses: Counter[str] = Counter()
    worst: dict[str, float] = {}
    for numbers in RampEvent.objects.filter(ramp_id__in=ramps).values_list("numbers",
                                                                            flat=True):
        for m in (numbers or {}).get("metrics") or []:
            statuses[m["status"]] += 1
            for v in m.get("values") or []:
                name = m["reason"].split(" = ")[0].split(":")[0]
                worst[name] = max(worst.get(name, float("-inf")), float(v["value"]))
    print("guard metric measurements (Prometheus): "
          + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    print("highest value seen: " + "; ".join(f"{k} {v:.3g}" for k, v in sorted(worst.items())))
    for event in RampEvent.objects.filter(ramp_id__in=ramps, kind="rollback"):
        print(f"rollback of ramp {event.ramp_id}: {event.message}")
    assert isinstance(began_at, datetime)
    for pool in ("primary", "twin"):
        stats = pool_stats(pool=pool, since=began_at, until=timezone.now(), reported=True)
        prom = stats.reported[0] if stats.reported else None
        print(f"{pool}: TTFT p95 {stats.ttft_p95.value or 0:.1f} ms over {stats.requests} "
              f"requests ({stats.ttft_p95.source}); "
              + (f"{prom.label}: TTFT p95 {prom.ttft_p95.value or 0:.1f} ms over "
                 f"{prom.requests} requests{f' (error: {prom.error})' if prom.error else ''}"
                 if prom else "no Prometheus windows"))
    print("windows written: " + ", ".join(
        f"{source} {Window.objects.filter(source=source).count()}"
        for source in ("gateway", "pool", "prometheus")))


if __name__ == "__main__":
    main()
