"""The control plane at scale: at 10 %, 30 % and 100 % of a large fleet (1,000 pools, 300
routes, 100 gateways, 50 plans), with a month of evidence, telemetry, audit and health rows,
what each periodic job, page and list endpoint costs, and how that grows with the fleet.

Seeding is bulk_create throughout (the services would take tens of minutes at full size);
the rows are what the services and jobs write: pools with their models, health probes and
transitions; routes with a month of split revisions; file-kind gateways (the test suite's
`tests.traffic.fake_kind`, weights in a JSON file: reconcile and pushes run their real code
with no live gateway, so those figures are the database's and the control plane's, plus one
small file read or write per gateway); plans at stages 1-4 with the default gates, their
advance moves and check history; evidence rows a month deep (conformance, benchmark, eval,
shadow, soak, …: the kinds `evidence.latest` reads, bound to the pools' fingerprints so they
count); pool and gateway telemetry windows (600 s windows over 30 days at one per
`--telemetry-stride-s`); audit events; a month of drains.

Then, at each size, in this process against PostgreSQL (DATABASE_URL, default the local
`fleetctl_bench_scale` database, created if missing; everything in it is replaced) and
Redis (REDIS_URL, default db 15; Celery messages the drain queues stay there unconsumed):

- plans.refresh: the beat task function, every open plan's gates evaluated (in-process);
- the plans board and one plan page (stage 4), and the API's list endpoints (bearer token),
  through Django's full request stack (middleware, auth, template or serializer);
- traffic.reconcile: the beat task function, every gateway read back and compared (all in
  sync, so no push: the steady state);
- a drain of one pool carried by 20 routes (drain_request + drain_push_now, as the API does;
  each followed by its restore, not timed).

Printed per measurement and size: median ms and the queries run in this thread (the push
threads do only the gateways' I/O, so that is every query), then the growth 100 → 1,000
pools (linear is 10×). A query count that grows is flagged: for the jobs (every plan, every
gateway) that is their work; for a page or a list it is a query per row.

    DATABASE_URL=postgres://…/scratch .venv/bin/python benchmarks/scale_rehearsal.py \
        [--sizes 0.1 0.3 1.0] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/fleetctl_bench_scale"
MODELS = ("llama-3.1-8b-instruct",)
FULL = {"pools": 1000, "routes": 300, "gateways": 100, "plans": 50}
HOT_ROUTES = 20  # routes carrying the pool the drain takes off (the same at every size)
EVIDENCE_KINDS = ("conformance", "benchmark", "eval", "shadow", "soak", "checkpoint-resume",
                  "cost-arbitrage", "ramp-slo", "live-quality")
BATCH = 5000

from overview_and_pools_api import django_in_process  # noqa: E402


def wipe() -> None:
    """Every row a previous size left (TRUNCATE … CASCADE from the roots)."""
    from django.db import connection

    from fleetctl.audit.models import AuditEvent
    from fleetctl.fleet.models import Pool, Region
    from fleetctl.telemetry.models import Window
    from fleetctl.traffic.models import Gateway, Route

    tables = [m._meta.db_table for m in (Region, Pool, Route, Gateway, AuditEvent, Window)]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


def seed(size: float, *, gateway_dir: Path, health_per_pool: int, audit_per_pool: int,
         telemetry_stride_s: int) -> dict[str, int]:
    """One fleet of `size` × FULL with a month of history, by bulk_create. Returns row
    counts."""
    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from fleetctl.audit.models import AuditEvent
    from fleetctl.fleet.models import HealthCheck, HealthTransition, Pool, PoolModel, Region
    from fleetctl.telemetry.histogram import bucket_of
    from fleetctl.telemetry.models import Window
    from fleetctl.traffic import selectors
    from fleetctl.traffic.gateways.base import adapter_for
    from fleetctl.traffic.models import Drain, Gateway, Route, SplitRevision
    from migrations_plan import evidence as ev
    from migrations_plan.gates import DEFAULT_GATES
    from migrations_plan.models import (
        CheckStatusChange,
        Evidence,
        GateCheck,
        Plan,
        StageMove,
    )

    wipe()
    n = {k: max(1, round(v * size)) for k, v in FULL.items()}
    now = timezone.now()
    month = timedelta(days=30)
    lead, _ = User.objects.get_or_create(username="scale-lead")
    lead.groups.set([Group.objects.get_or_create(name="platform-lead")[0]])
    viewer, _ = User.objects.get_or_create(username="scale-viewer")
    viewer.groups.set([Group.objects.get_or_create(name="viewer")[0]])

    regions = Region.objects.bulk_create([
        Region(code=f"region-{i}", name=f"Region {i}", jurisdiction=j)
        for i, j in enumerate(["US", "EU", "IN", "UK", "JP", "SG", "EU", "US"])])
    # Routes (one per model: a route is what callers ask for) each on its primary and two
    # other pools; the first HOT_ROUTES on pool-0001, the pool the drain takes off.
    def route_pools(i: int) -> list[int]:
        return [(2 + 3 * i) % n["pools"], (3 + 3 * i) % n["pools"],
                1 if i < HOT_ROUTES else (4 + 3 * i) % n["pools"]]

    served: dict[int, set[str]] = {i: {MODELS[0]} for i in range(n["pools"])}
    for i in range(n["routes"]):
        for index in route_pools(i):
            served[index].add(f"model-{i:03d}")
    for k in range(n["plans"]):  # each plan's candidate serves its route's model
        served[n["pools"] // 2 + k].add(f"model-{k * n['routes'] // n['plans']:03d}")
    pools = Pool.objects.bulk_create([
        Pool(name=f"pool-{i:04d}", runtime="cuda", accelerator="H200",
             region=regions[i % len(regions)],
             base_urls=[f"http://10.{i // 250}.{i % 250}.1:8000"], max_context_tokens=32768,
             node_hourly_rate=Decimal("12.5"), health_state="healthy", last_probe_at=now,
             last_probe_latency_ms=4.2, health_changed_at=now - timedelta(days=10),
             runtime_version="0.6.3",
             reported={"server_version": "0.6.3",
                       "model_revision": {m: "rev-1" for m in sorted(served[i])}},
             reported_at=now, cost_per_1m_output_tokens=Decimal("0.42"),
             cost_measured_at=now - timedelta(days=2), cost_currency="USD")
        for i in range(n["pools"])])
    PoolModel.objects.bulk_create([
        PoolModel(pool=p, model_id=m, max_context_tokens=8192, revision="rev-1")
        for i, p in enumerate(pools) for m in sorted(served[i])])
    HealthTransition.objects.bulk_create([
        HealthTransition(pool=p, at=now - timedelta(days=10), from_state="unknown",
                         to_state="healthy") for p in pools])
    batch: list[Any] = []
    for p in pools:
        batch.extend(HealthCheck(pool=p, checked_at=now - timedelta(seconds=15 * k), ok=True,
                                 status_code=200, latency_ms=3.0 + k % 7)
                     for k in range(health_per_pool))
        if len(batch) >= BATCH:
            HealthCheck.objects.bulk_create(batch)
            batch.clear()
    HealthCheck.objects.bulk_create(batch)

    # Each route has a month of revisions (one every six days), the newest current.
    routes, weights_of = [], {}
    for i in range(n["routes"]):
        primary, *others = (pools[index] for index in route_pools(i))
        weights = {primary.name: 7000, others[0].name: 2000, others[1].name: 1000}
        route = Route(name=f"route-{i:03d}", model_id=f"model-{i:03d}", primary_pool=primary,
                      revision_number=5, created_at=now - month)
        routes.append(route)
        weights_of[route.name] = (weights, {p.name: p.pk for p in (primary, *others)})
    Route.objects.bulk_create(routes)
    SplitRevision.objects.bulk_create([
        SplitRevision(route=r, number=k, kind="create" if k == 1 else "set",
                      weights=weights_of[r.name][0], pool_ids=weights_of[r.name][1],
                      reason="scale rehearsal", created_by="scale-lead",
                      created_at=now - month + timedelta(days=6 * (k - 1)))
        for r in routes for k in range(1, 6)])
    current = selectors.revisions_current(routes=routes)

    # Gateways: each route on two, each gateway ~6 routes; their files hold the current state.
    gateways = Gateway.objects.bulk_create([
        Gateway(name=f"gw-{j:03d}", kind="file", admin_address=str(gateway_dir / f"gw-{j:03d}"),
                options={"file_name": "weights.json"}, state="ok", last_verified_at=now)
        for j in range(n["gateways"])])
    through = Gateway.routes.through
    through.objects.bulk_create([
        through(gateway_id=gateways[g].pk, route_id=r.pk)
        for i, r in enumerate(routes) for g in {i % n["gateways"], (i + 1) % n["gateways"]}])
    for gateway in Gateway.objects.prefetch_related("routes"):
        (gateway_dir / gateway.name).mkdir(parents=True, exist_ok=True)
        adapter_for(selectors.gateway_spec(gateway)).apply(
            selectors.gateway_desired_state(gateway=gateway))

    # A month of drains: two per route, complete, each bound to one revision.
    drains = Drain.objects.bulk_create([
        Drain(pool=pools[(4 + 3 * i) % n["pools"]], requested_by="on-call",
              reason="scale rehearsal", requested_at=now - timedelta(days=k * 14 + 1),
              status="complete", drained_pools=[pools[(4 + 3 * i) % n["pools"]].name],
              verified_at=now - timedelta(days=k * 14 + 1),
              completed_at=now - timedelta(days=k * 14 + 1))
        for i in range(n["routes"]) for k in range(2)])
    Drain.revisions.through.objects.bulk_create([
        Drain.revisions.through(drain_id=d.pk, splitrevision_id=current[routes[i // 2].pk].pk)
        for i, d in enumerate(drains)])

    # Plans: one route each, the route's primary against a pool of the upper half; stages
    # 1-4 in turn, each passed stage with its advance move; the default gates.
    plans, plan_routes = [], []
    for k in range(n["plans"]):
        route = routes[k * n["routes"] // n["plans"]]
        stage = 1 + k % 4
        plans.append(Plan(
            name=f"plan-{k:02d}", candidate_pool=pools[n["pools"] // 2 + k],
            primary_pool=route.primary_pool, slo_ttft_p95_ms=800, slo_tpot_p95_ms=60,
            slo_error_rate=0.01, owner=lead, created_by=lead, state=f"stage-{stage}",
            stage=stage, stage_entered_at=now - timedelta(days=3),
            created_at=now - month))
        plan_routes.append(route)
    Plan.objects.bulk_create(plans)
    Plan.routes.through.objects.bulk_create([
        Plan.routes.through(plan_id=p.pk, route_id=r.pk)
        for p, r in zip(plans, plan_routes, strict=True)])
    checks = GateCheck.objects.bulk_create([
        GateCheck(plan=p, stage=stage, key=t.key, title=t.title,
                  kind="attested" if t.attest_role else "evidence", rule=t.rule,
                  params=t.params, attest_role=t.attest_role, position=pos,
                  added_by="template", added_at=now - month)
        for p in plans for stage, templates in DEFAULT_GATES.items()
        for pos, t in enumerate(templates)])
    CheckStatusChange.objects.bulk_create([
        CheckStatusChange(check_item=c, status=s, at=now - timedelta(days=d),
                          summary="scale rehearsal")
        for c in checks for d, s in ((28, "insufficient"), (20, "pass"), (12, "warn"),
                                     (6, "pass"))])
    StageMove.objects.bulk_create([
        StageMove(plan=p, kind="advance", from_state=f"stage-{s}", to_state=f"stage-{s + 1}",
                  by="scale-lead", at=now - timedelta(days=3 + 4 * (p.stage - s)),
                  gate_snapshot={"checks": [{"key": t.key, "status": "pass"}
                                            for t in DEFAULT_GATES[s]]})
        for p in plans for s in range(1, p.stage)])

    # Evidence: a month of daily rows of each kind about every candidate (the gates read
    # these), and one every third day of some kind about every pool.
    rows: list[Evidence] = []
    for plan, r in zip(plans, plan_routes, strict=True):
        print_ = ev.pool_fingerprint(plan.candidate_pool, [r.model_id])
        for kind in EVIDENCE_KINDS:
            rows.extend(Evidence(kind=kind, pool=plan.candidate_pool, model_id=r.model_id,
                                 observed_at=now - timedelta(days=d, hours=1),
                                 pool_fingerprint=print_, verdict="pass",
                                 summary=f"{kind} on day {d}", source="scale rehearsal")
                        for d in range(30))
    for i, pool in enumerate(pools):
        print_ = ev.pool_fingerprint(pool, [MODELS[0]])
        rows.extend(Evidence(kind=EVIDENCE_KINDS[(i + d) % 3], pool=pool, model_id=MODELS[0],
                             observed_at=now - timedelta(days=d, hours=2),
                             pool_fingerprint=print_, verdict="pass", summary=f"day {d}",
                             source="scale rehearsal") for d in range(0, 30, 3))
    Evidence.objects.bulk_create(rows, batch_size=BATCH)

    # Telemetry: every pool's own /metrics, and each route's pools seen by its gateways, at
    # 600 s resolution over the month (one window every telemetry_stride_s), plus the last
    # hour at 10 s (what ramps and watches read).
    histogram = {str(bucket_of(ms)): n for ms, n in ((40, 3), (90, 9), (250, 20), (600, 4))}
    starts = [now.replace(second=0, microsecond=0) - timedelta(seconds=s)
              for s in range(600, int(month.total_seconds()), telemetry_stride_s)]
    recent = [now.replace(second=0, microsecond=0) - timedelta(seconds=s)
              for s in range(10, 3601, 10)]
    series = [("pool", p.name, "", p.name) for p in pools[:n["pools"]]]
    series += [("gateway", gateways[i % n["gateways"]].name, r.name, pool)
               for i, r in enumerate(routes) for pool in weights_of[r.name][0]]

    def window(key: tuple[str, str, str, str], start: Any, resolution: int) -> Window:
        return Window(source=key[0], source_name=key[1], route=key[2], pool=key[3],
                      resolution_s=resolution, start=start, requests=120, errors=1,
                      streamed=100, output_tokens=24_000, ttft=histogram,
                      duration=histogram, tpot=histogram, updated_at=start)

    windows = 0
    batch = []
    for key in series:
        batch.extend(window(key, s, 600) for s in starts)
        if key[0] == "pool":
            batch.extend(window(key, s, 10) for s in recent[:: max(1, len(recent) // 36)])
        if len(batch) >= BATCH:
            Window.objects.bulk_create(batch)
            windows += len(batch)
            batch.clear()
    Window.objects.bulk_create(batch)
    windows += len(batch)

    # Audit: a month of events, about pools, routes and plans.
    targets = ([("fleet.pool", p.pk, p.name) for p in pools]
               + [("traffic.route", r.pk, r.name) for r in routes]
               + [("migrations_plan.plan", p.pk, p.name) for p in plans])
    total = audit_per_pool * n["pools"]
    step = month / total
    batch = []
    for k in range(total):
        kind, pk, name = targets[k % len(targets)]
        batch.append(AuditEvent(at=now - step * k, actor="scale-lead", action=f"{kind}.update",
                                object_type=kind, object_id=str(pk), object_repr=name,
                                after={"k": k}, message="scale rehearsal"))
        if len(batch) >= BATCH:
            AuditEvent.objects.bulk_create(batch)
            batch.clear()
    AuditEvent.objects.bulk_create(batch)
    return {**n, "health rows": health_per_pool * n["pools"], "evidence": len(rows),
            "telemetry windows": windows, "audit events": total, "drains": len(drains)}


class Measured:
    def __init__(self, ms: float, queries: int) -> None:
        self.ms, self.queries = ms, queries


def measure(call: Callable[[], object], runs: int, *, warm: int = 1,
            after: Callable[[object], None] | None = None) -> Measured:
    """Median wall time of `call` and its queries in this thread (the last run's)."""
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    timings, queries = [], 0
    for i in range(warm + runs):
        reset_queries()  # the log keeps 9,000: outside a request nothing empties it
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            result = call()
            elapsed = (time.perf_counter() - started) * 1000
        if after is not None:
            after(result)
        if i >= warm:
            timings.append(elapsed)
            queries = len(captured)
    return Measured(statistics.median(timings), queries)


def get(client: Any, url: str, headers: dict[str, str]) -> Callable[[], object]:
    def call() -> object:
        response = client.get(url, headers=headers)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}")
        return response
    return call


def measure_all(runs: int) -> dict[str, Measured]:
    from django.contrib.auth.models import User
    from django.test import Client

    from fleetctl.accounts.actor import Actor
    from fleetctl.accounts.services import token_create_personal
    from fleetctl.accounts.throttle import reset
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic import push
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic import tasks as traffic_tasks
    from migrations_plan import tasks as plan_tasks
    from migrations_plan.models import Plan

    viewer = User.objects.get(username="scale-viewer")
    issued = token_create_personal(actor=Actor(user=viewer), name=f"scale-{time.time_ns()}",
                                   scopes=["read"])
    reset("127.0.0.1")
    api = Client()
    token = {"Authorization": f"Bearer {issued.secret}"}
    pages = Client()
    pages.force_login(viewer)
    plan = Plan.objects.filter(stage=4).order_by("name").first() or Plan.objects.first()
    assert plan is not None
    hot = Pool.objects.get(name="pool-0001")
    oncall = Actor.for_system("scale-rehearsal")

    def drain() -> object:
        record = traffic.drain_request(actor=oncall, pool=hot, force=True,
                                       reason="scale rehearsal")
        return push.drain_push_now(record)

    def restore(record: object) -> None:
        back = traffic.drain_restore(actor=oncall, drain=record,  # type: ignore[arg-type]
                                     reason="scale rehearsal over")
        push.drain_push_now(back)

    results: dict[str, Measured] = {}
    steps: list[tuple[str, Callable[[], Measured]]] = [
        ("plans.refresh (every open plan's gates)",
         lambda: measure(plan_tasks.refresh, runs)),
        ("traffic.reconcile (every gateway)",
         lambda: measure(traffic_tasks.reconcile, runs)),
        ("drain of 1 pool on 20 routes (+ push)",
         lambda: measure(drain, runs, after=restore)),
        ("page: plans board /plans/", lambda: measure(get(pages, "/plans/", {}), runs)),
        (f"page: plan /plans/{plan.name}/",
         lambda: measure(get(pages, f"/plans/{plan.name}/", {}), runs)),
    ]
    for name in ("pools", "routes", "plans", "drains", "audit-events", "telemetry/pools"):
        url = f"/api/v1/{name}/"
        steps.append((f"API {url}", partial(lambda u: measure(get(api, u, token), runs), url)))
    for label, step in steps:
        results[label] = step()
        print(f"  {label:48} {results[label].ms:9.1f} ms {results[label].queries:6} queries",
              flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.1, 0.3, 1.0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--health-per-pool", type=int, default=40)
    parser.add_argument("--audit-per-pool", type=int, default=50)
    parser.add_argument("--telemetry-stride-s", type=int, default=86_400)
    args = parser.parse_args()
    django_in_process(DEFAULT_DB, "redis://127.0.0.1:6379/15")
    from django.conf import settings

    settings.FLEETCTL_GATEWAY_KINDS = ["tests.traffic.fake_kind"]  # gateways in files

    table: dict[float, dict[str, Measured]] = {}
    with tempfile.TemporaryDirectory(prefix="scale-rehearsal-") as tmp:
        for size in args.sizes:
            started = time.perf_counter()
            counts = seed(size, gateway_dir=Path(tmp) / f"{size:g}",
                          health_per_pool=args.health_per_pool,
                          audit_per_pool=args.audit_per_pool,
                          telemetry_stride_s=args.telemetry_stride_s)
            print(f"size {size:g}: " + ", ".join(f"{v:,} {k}" for k, v in counts.items())
                  + f" (seeded in {time.perf_counter() - started:.0f} s)", flush=True)
            table[size] = measure_all(args.runs)
    first, last = args.sizes[0], args.sizes[-1]
    scale = last / first
    print(f"\nmedian ms / queries per size; growth {first:g} → {last:g} "
          f"(the fleet grows {scale:g}×); ! = time above {1.2 * scale:g}× or queries growing")
    print(f"{'measurement':48} " + " ".join(f"{f'{s:g}':>14}" for s in args.sizes)
          + f" {'time ×':>7} {'queries ×':>9}")
    for label in table[first]:
        cells = " ".join(f"{table[s][label].ms:8.1f}/{table[s][label].queries:<5}"
                         for s in args.sizes)
        time_x = table[last][label].ms / max(table[first][label].ms, 1e-9)
        query_x = table[last][label].queries / max(table[first][label].queries, 1)
        flag = "!" if time_x > 1.2 * scale or query_x > 1.05 else " "
        print(f"{label:48} {cells} {time_x:7.1f} {query_x:9.2f} {flag}")


if __name__ == "__main__":
    main()
