"""Server time of the shadow runs' REST API on a run with many pairs: the run detail (live
counters from Redis, the latest judgement, the route's gateways), a page of pairs as stored
and filtered for the most divergent, the judgement series, and the streamed exports (pairs
per second and size, CSV and JSON).

Runs in one process against PostgreSQL (DATABASE_URL, default the local
`fleetctl_bench_shadow_api` database, created if missing) and Redis (REDIS_URL, default db 6),
through Django's full request stack (middleware, token auth, serializer).

    .venv/bin/python benchmarks/shadow_api.py [--pairs 50000] [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/fleetctl_bench_shadow_api"
MODEL = "llama-3.1-8b-instruct"

from overview_and_pools_api import django_in_process, measure, p95  # noqa: E402


def populate(pairs: int) -> int:
    """A mirror run (started through the service) with `pairs` pairs as a worker stores them
    (a tenth diverged, one in 50 a candidate error) and one judgement."""
    from datetime import timedelta

    from django.contrib.auth.models import Group, User
    from django.db import transaction
    from django.utils import timezone

    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet import services as fleet
    from fleetctl.fleet.models import Pool, Region
    from fleetctl.shadow import services as shadow
    from fleetctl.shadow.models import ShadowPair, ShadowRun
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic.models import Gateway, Route
    from migrations_plan import services as plans
    from migrations_plan.models import Plan

    run = ShadowRun.objects.filter(plan__name="bench-shadow-api").first()
    if run is not None and run.pairs.count() == pairs:
        return run.pk
    print(f"populating a run with {pairs:,} pairs…", flush=True)
    system = Actor.for_system("bench")
    ShadowRun.objects.all().delete()
    Plan.objects.all().delete()
    Gateway.objects.all().delete()
    Route.objects.all().delete()
    Pool.objects.all().delete()
    Region.objects.all().delete()
    lead, _ = User.objects.get_or_create(username="bench-lead")
    lead.groups.set([Group.objects.get_or_create(name="platform-lead")[0]])
    viewer, _ = User.objects.get_or_create(username="bench")
    viewer.groups.set([Group.objects.get_or_create(name="viewer")[0]])
    region = fleet.region_create(actor=system, code="bench-us", name="US", jurisdiction="US")
    pools = []
    for i, name in enumerate(("bench-h200", "bench-mi300x")):
        pool = fleet.pool_create(actor=system, name=name, runtime="cuda", accelerator="H200",
                                 region=region, base_urls=[f"http://127.0.0.1:{9100 + i}"],
                                 max_context_tokens=8192, node_hourly_rate="10")
        fleet.pool_model_create(actor=system, pool=pool, model_id=MODEL,
                                max_context_tokens=8192)
        pools.append(pool)
    route = traffic.route_create(actor=system, name="bench-llama", model_id=MODEL,
                                 primary_pool=pools[0], force=True)
    traffic.gateway_create(actor=system, name="bench-envoy", kind="envoy",
                           admin_address="http://127.0.0.1:1",
                           options={"config_dir": "/nonexistent/bench"}, routes=[route])
    plan = plans.plan_create(actor=Actor(user=lead), name="bench-shadow-api",
                             candidate_pool=pools[1], primary_pool=pools[0], routes=[route],
                             slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01)
    with transaction.atomic():  # published (and the gateway's push queued) on the commit
        run = shadow.run_create(actor=Actor(user=lead), plan=plan, min_pairs=200)
    now = timezone.now()
    side = {"endpoint": "http://127.0.0.1:9100", "status": 200, "error": "", "finish": "stop",
            "prompt_tokens": 180, "completion_tokens": 130, "ttft_ms": 41.5, "tpot_ms": 6.2,
            "latency_ms": 850.3, "text_sha256": "0" * 64}
    flags = {"diverged": 0, "finish_mismatch": 0, "error_mismatch": 0, "errored_a": 0,
             "errored_b": 0, "refusal_a": 0, "refusal_b": 0, "refusal_mismatch": 0,
             "exact_match": 1, "near_tie": 0, "hard_flip": 0, "first_divergence": None,
             "edit_distance": 0.0, "length_ratio": 1.0}
    batch: list[ShadowPair] = []
    for i in range(pairs):
        diverged, failed = i % 10 == 0, i % 50 == 0
        signal = {**flags, "diverged": int(diverged), "exact_match": int(not diverged),
                  "error_mismatch": int(failed), "hard_flip": int(diverged),
                  "first_divergence": 17 if diverged else None,
                  "edit_distance": 0.12 if diverged else 0.0}
        candidate = {**side, "status": 500, "error": "HTTP 500", "finish": None} if failed \
            else side
        batch.append(ShadowPair(
            run=run, source="mirror", received_at=now - timedelta(seconds=pairs - i),
            request_hash=f"{i:064x}", greedy=True,
            params={"api": "chat", "model": MODEL, "temperature": 0, "max_tokens": 256,
                    "stream": i % 5 == 0, "messages": 2, "logprobs": True},
            sides={"primary": side, "secondary": side, "candidate": candidate},
            noise=flags, signal=signal, noise_diverged=False, signal_diverged=diverged,
            candidate_error=failed, divergence_score=1.0 if failed else signal["edit_distance"]))
        if len(batch) >= 5000:
            ShadowPair.objects.bulk_create(batch)
            batch.clear()
    ShadowPair.objects.bulk_create(batch)
    shadow.run_judge(run=run)
    return run.pk


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--exports", type=int, default=3, help="export runs per format")
    args = parser.parse_args()
    django_in_process(DEFAULT_DB, "redis://127.0.0.1:6379/6")
    from django.contrib.auth.models import User
    from django.test import Client

    from fleetctl.accounts.actor import Actor
    from fleetctl.accounts.services import token_create_personal
    from fleetctl.accounts.throttle import reset

    run_id = populate(args.pairs)
    viewer = User.objects.get(username="bench")
    issued = token_create_personal(actor=Actor(user=viewer), name=f"bench-{time.time_ns()}",
                                   scopes=["read"])
    reset("127.0.0.1")
    client = Client()
    auth = {"Authorization": f"Bearer {issued.secret}"}
    base = f"/api/v1/shadow-runs/{run_id}/"
    print(f"one run, {args.pairs:,} pairs, {args.runs} runs each (after 5 warm-up), DEBUG=0, "
          "PostgreSQL, bearer token")
    print(f"{'request':52} {'median ms':>10} {'p95 ms':>8}")
    for label, url in [
        ("run detail (counters, latest judgement)", base),
        ("runs list", "/api/v1/shadow-runs/"),
        ("pairs, page of 50 (newest)", f"{base}pairs/"),
        ("pairs ?diverged=true&order=-divergence_score", f"{base}pairs/?diverged=true&"
                                                         "order=-divergence_score"),
        ("judgements", f"{base}judgements/"),
    ]:
        timings = measure(client, url, args.runs, auth)
        print(f"{label:52} {statistics.median(timings):10.1f} {p95(timings):8.1f}", flush=True)
    print(f"{'export':8} {'median s':>9} {'pairs/s':>9} {'MB':>7}")
    for fmt in ("csv", "json"):
        seconds, size = [], 0
        for _ in range(args.exports):
            started = time.perf_counter()
            response = client.get(f"{base}export/?format={fmt}", headers=auth)
            size = sum(len(chunk) for chunk in response.streaming_content)
            seconds.append(time.perf_counter() - started)
        median = statistics.median(seconds)
        print(f"{fmt:8} {median:9.2f} {args.pairs / median:9,.0f} {size / 1e6:7.1f}",
              flush=True)


if __name__ == "__main__":
    main()
