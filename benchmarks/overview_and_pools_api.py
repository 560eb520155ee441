"""Server time of the fleet overview page and the pools API with 1,000 pools and 100,000
health rows (issue: p95 under 150 ms on this machine).

Runs in one process against PostgreSQL (DATABASE_URL, default the local `fleetctl_bench`
database, created if missing), through Django's full request stack (middleware, auth,
session, template or serializer): what gunicorn would spend, minus the socket.

    .venv/bin/python benchmarks/overview_and_pools_api.py [--runs 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/fleetctl_bench"


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def populate(pools: int, health_rows: int) -> None:
    from datetime import timedelta
    from decimal import Decimal

    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from fleetctl.fleet.models import HealthCheck, Pool, PoolModel, Region

    if Pool.objects.count() == pools and HealthCheck.objects.count() == health_rows:
        return
    print(f"populating {pools} pools and {health_rows} health rows…", flush=True)
    HealthCheck.objects.all().delete()
    PoolModel.objects.all().delete()
    Pool.objects.all().delete()
    Region.objects.all().delete()
    regions = Region.objects.bulk_create([
        Region(code=f"region-{i}", name=f"Region {i}", jurisdiction=j)
        for i, j in enumerate(["US", "EU", "IN", "UK", "JP", "SG", "EU", "US"])
    ])
    runtimes = ["cuda", "rocm", "tpu", "gaudi", "other"]
    states = ["healthy"] * 8 + ["unhealthy", "unknown"]
    now = timezone.now()
    created = Pool.objects.bulk_create([
        Pool(name=f"pool-{i:04d}", runtime=runtimes[i % 5], accelerator="H200",
             region=regions[i % len(regions)], base_urls=[f"http://10.0.{i // 250}.{i % 250}:8000"],
             max_context_tokens=32768, node_hourly_rate=Decimal("12.5"),
             health_state=states[i % 10], last_probe_at=now, last_probe_latency_ms=4.2,
             cost_per_1m_output_tokens=Decimal("0.42") if i % 3 == 0 else None)
        for i in range(pools)
    ])
    PoolModel.objects.bulk_create([
        PoolModel(pool=p, model_id=m, max_context_tokens=8192)
        for p in created for m in ("llama-3.1-8b-instruct", "qwen2.5-7b-instruct")
    ])
    per_pool = health_rows // pools
    batch: list[HealthCheck] = []
    for p in created:
        for k in range(per_pool):
            batch.append(HealthCheck(pool=p, checked_at=now - timedelta(seconds=15 * k),
                                     ok=k % 17 != 0, status_code=200, latency_ms=3.0 + k % 7))
        if len(batch) >= 20000:
            HealthCheck.objects.bulk_create(batch)
            batch.clear()
    HealthCheck.objects.bulk_create(batch)
    user, _ = User.objects.get_or_create(username="bench")
    user.groups.set([Group.objects.get_or_create(name="viewer")[0]])


def django_in_process(default_db: str, redis_url: str | None = None) -> None:
    """Django set up in this process as a server runs it (DEBUG off), on PostgreSQL
    (DATABASE_URL, else `default_db`, created if missing) with every migration applied."""
    os.environ.setdefault("DATABASE_URL", default_db)
    if redis_url is not None:
        os.environ.setdefault("REDIS_URL", redis_url)
        from fleetctl.demo.devstack import local_destinations
        local_destinations(os.environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    ensure_database(os.environ["DATABASE_URL"])

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)


def measure(client: object, url: str, runs: int, headers: dict[str, str]) -> list[float]:
    timings = []
    for i in range(runs + 5):
        started = time.perf_counter()
        response = client.get(url, headers=headers)  # type: ignore[attr-defined]
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}")
        if i >= 5:  # warm-up: first requests fill caches and connections
            timings.append(elapsed)
    return timings


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[94]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--health-rows", type=int, default=100_000)
    args = parser.parse_args()
    django_in_process(DEFAULT_DB)
    from django.contrib.auth.models import User
    from django.test import Client

    populate(args.pools, args.health_rows)
    client = Client()
    client.force_login(User.objects.get(username="bench"))
    print(f"{args.pools} pools, {args.health_rows} health rows, {args.runs} runs each "
          "(after 5 warm-up), DEBUG=0, PostgreSQL")
    print(f"{'endpoint':48} {'median ms':>10} {'p95 ms':>8}")
    htmx_tiles = {"HX-Request": "true", "HX-Target": "summary-tiles"}
    htmx_pools = {"HX-Request": "true", "HX-Target": "pool-groups"}
    for label, url, headers in [
        ("overview page /", "/", {}),
        ("overview tiles partial (htmx poll)", "/", htmx_tiles),
        ("overview pool list partial (htmx poll)", "/", htmx_pools),
        ("pools API /api/v1/pools/ (page of 50)", "/api/v1/pools/", {}),
        ("pools API page_size=500", "/api/v1/pools/?page_size=500", {}),
        ("pool detail /pools/pool-0001/", "/pools/pool-0001/", {}),
        ("health API /api/v1/health-checks/?pool=…", "/api/v1/health-checks/?pool=pool-0001",
         {}),
    ]:
        timings = measure(client, url, args.runs, headers)
        print(f"{label:48} {statistics.median(timings):10.1f} {p95(timings):8.1f}", flush=True)


if __name__ == "__main__":
    main()
