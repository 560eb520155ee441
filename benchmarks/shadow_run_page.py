"""Server time and size of a shadow run's page after a day of judging: 5,760 judgements (one
every 15 s) and 20 pairs with ~600-character answers. The page draws at most
charts.MOST_POINTS judgements; this prints what that saves against drawing them all, and
what each htmx refresh (counters every 3 s, judgement every 15 s) costs the server.

Runs in one process against PostgreSQL (DATABASE_URL, default the local
`fleetctl_bench_shadow_page` database, created if missing) and Redis (REDIS_URL, default db
6), through Django's full request stack (middleware, auth, session, template).

    .venv/bin/python benchmarks/shadow_run_page.py [--runs 30] [--judgements 5760]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/fleetctl_bench_shadow_page"

from overview_and_pools_api import django_in_process, measure, p95  # noqa: E402


def populate(judgements: int) -> int:
    from datetime import timedelta

    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet import services as fleet
    from fleetctl.fleet.models import Pool, Region
    from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic.models import Route
    from migrations_plan import services as plans
    from migrations_plan.models import Plan

    run = ShadowRun.objects.filter(created_by="bench").first()
    if run is not None and run.judgements.count() == judgements:
        return run.pk
    print(f"populating a run with {judgements} judgements and 20 pairs…", flush=True)
    ShadowRun.objects.all().delete()
    system = Actor.for_system("bench")
    lead, _ = User.objects.get_or_create(username="bench-lead")
    lead.groups.set([Group.objects.get_or_create(name="platform-lead")[0]])
    viewer, _ = User.objects.get_or_create(username="bench")
    viewer.groups.set([Group.objects.get_or_create(name="viewer")[0]])
    region = Region.objects.filter(code="bench-us").first() or fleet.region_create(
        actor=system, code="bench-us", name="US", jurisdiction="US")
    pools = []
    for i, name in enumerate(("bench-h200", "bench-mi300x")):
        pool = Pool.objects.filter(name=name).first()
        if pool is None:
            pool = fleet.pool_create(actor=system, name=name, runtime="cuda",
                                     accelerator="H200", region=region,
                                     base_urls=[f"http://127.0.0.1:{9100 + i}"],
                                     max_context_tokens=8192, node_hourly_rate="10")
            fleet.pool_model_create(actor=system, pool=pool, model_id="llama-3.1-8b-instruct",
                                    max_context_tokens=8192)
        pools.append(pool)
    route = Route.objects.filter(name="bench-llama").first()
    if route is None:
        route = traffic.route_create(actor=system, name="bench-llama",
                                     model_id="llama-3.1-8b-instruct", primary_pool=pools[0],
                                     force=True)  # never probed: health unknown
    plan = Plan.objects.filter(name="bench-shadow").first()
    if plan is None:
        plan = plans.plan_create(actor=Actor(user=lead), name="bench-shadow",
                                 candidate_pool=pools[1], primary_pool=pools[0],
                                 routes=[route], slo_ttft_p95_ms=800, slo_tpot_p95_ms=60,
                                 slo_error_rate=0.01)
    run = ShadowRun.objects.create(
        plan=plan, route=route, candidate=pools[1], primary=pools[0],
        model_id="llama-3.1-8b-instruct", content="full", margin=0.02, created_by="bench",
        verdict="pass", summary="pass", counters={"received": 1_000_000, "pairs": 50_000})
    now = timezone.now()
    answer = "The capital of France is Paris, a city on the Seine. " * 12
    ShadowPair.objects.bulk_create([
        ShadowPair(run=run, source="mirror", received_at=now - timedelta(seconds=i),
                   request_hash=f"{i:064d}", greedy=True, params={"temperature": 0},
                   sides={s: {"endpoint": "http://127.0.0.1:9100", "status": 200,
                              "finish": "stop", "completion_tokens": 130, "ttft_ms": 40.0}
                          for s in ("primary", "secondary", "candidate")},
                   content={"prompt": [{"role": "user", "content": "Tell me about Paris."}],
                            "primary": answer, "secondary": answer,
                            "candidate": answer.replace("Seine", "Loire", 1 + i % 3)},
                   noise={}, signal={}, noise_diverged=False, signal_diverged=True,
                   divergence_score=0.01 * (i + 1))
        for i in range(20)])
    metric = {"n": 0, "noise_rate": 0.011, "signal_rate": 0.018, "estimate": 0.007,
              "lower": -0.002, "upper": 0.016, "p_value": 0.2, "method": "newcombe",
              "verdict": "pass", "gated": True}
    names = ("divergence", "finish_mismatch", "error_mismatch", "validity_mismatch",
             "refusal_mismatch", "diverged_any")
    ShadowJudgement.objects.bulk_create([
        ShadowJudgement(run=run, at=now - timedelta(seconds=15 * (judgements - k)),
                        pairs=10 * k, verdict="pass",
                        metrics={name: {**metric, "n": 10 * k, "gated": name != "diverged_any"}
                                 for name in names})
        for k in range(judgements)], batch_size=2000)
    return run.pk


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--judgements", type=int, default=5760)
    args = parser.parse_args()
    django_in_process(DEFAULT_DB, "redis://127.0.0.1:6379/6")
    from django.contrib.auth.models import User
    from django.test import Client

    from fleetctl.core.charts import figure_data
    from fleetctl.shadow import charts
    from fleetctl.shadow.models import ShadowJudgement, ShadowRun

    run_id = populate(args.judgements)
    client = Client()
    client.force_login(User.objects.get(username="bench"))
    run = ShadowRun.objects.get(pk=run_id)
    every = list(ShadowJudgement.objects.filter(run=run).order_by("at", "id"))
    started = time.perf_counter()
    whole = json.dumps(figure_data(charts.divergence_figure(every, margin=run.margin)))
    whole_ms = (time.perf_counter() - started) * 1000
    print(f"{args.judgements} judgements, 20 pairs, {args.runs} runs each (after 5 warm-up), "
          "DEBUG=0, PostgreSQL")
    print(f"chart of every judgement: {len(whole) / 1024:,.0f} KiB of JSON, built in "
          f"{whole_ms:,.0f} ms; the page draws {min(args.judgements, charts.MOST_POINTS)}")
    print(f"{'request':44} {'median ms':>10} {'p95 ms':>8} {'KiB':>8}")
    url = f"/shadow/runs/{run_id}/"
    for label, headers in [
        ("run page", {}),
        ("counters block (htmx, every 3 s)", {"HX-Request": "true",
                                              "HX-Target": "shadow-counters"}),
        ("judgement block (htmx, every 15 s)", {"HX-Request": "true",
                                                "HX-Target": "shadow-judgement"}),
    ]:
        timings = measure(client, url, args.runs, headers)
        size = len(client.get(url, headers=headers).content)
        print(f"{label:44} {statistics.median(timings):10.1f} {p95(timings):8.1f} "
              f"{size / 1024:8.1f}", flush=True)


if __name__ == "__main__":
    main()
