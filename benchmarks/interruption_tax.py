"""What the interruption tax costs the pages that show it: the fleet overview, the pools API
(one page of every pool) and a pool's page, with no interruptible pool and with half of them
interruptible (each with a passed drill row), in server time and SQL queries.

The taxes of a page of pools are read in one drill query (fleet.interruption.effective_rates,
plus one for the drill jobs' latencies); a pool that is not interruptible costs none.
Runs in one process against PostgreSQL (DATABASE_URL, default the local `fleetctl_bench`
database, created if missing; its pools are replaced), through Django's full request stack.

    .venv/bin/python benchmarks/interruption_tax.py [--pools 200] [--runs 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.overview_and_pools_api import DEFAULT_DB, django_in_process, measure  # noqa: E402


def populate(pools: int, interruptible: bool) -> None:
    from decimal import Decimal

    from django.contrib.auth.models import Group, User

    from fleetctl.fleet.models import Pool, Region
    from migrations_plan.models import Evidence

    Evidence.objects.filter(pool__name__startswith="tax-").delete()
    Pool.objects.filter(name__startswith="tax-").delete()
    region, _ = Region.objects.get_or_create(code="tax-region",
                                             defaults={"name": "Tax", "jurisdiction": "US"})
    rows = Pool.objects.bulk_create([
        Pool(name=f"tax-{i:04d}", runtime="cuda", accelerator="A100", region=region,
             base_urls=[f"http://10.9.{i // 250}.{i % 250}:8000"], max_context_tokens=16384,
             node_hourly_rate=Decimal("14.70"), cost_per_1m_output_tokens=Decimal("12.5"),
             interruptible=interruptible and i % 2 == 0,
             reclaims_per_month=Decimal(8) if interruptible and i % 2 == 0 else None,
             standby_pct=Decimal(10) if interruptible and i % 2 == 0 else None)
        for i in range(pools)])
    Evidence.objects.bulk_create([
        Evidence(kind="checkpoint-resume", pool=pool, verdict="pass", summary="drill",
                 source=f"batch job {pool.pk}", url=f"/batch/jobs/{pool.pk}/",
                 data={"job": pool.pk, "resume_s": 12.0, "resends": 0})
        for pool in rows if pool.interruptible])
    user, _ = User.objects.get_or_create(username="bench")
    user.groups.set([Group.objects.get_or_create(name="viewer")[0]])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--pools", type=int, default=200)
    args = parser.parse_args()
    django_in_process(DEFAULT_DB)
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    print(f"{args.pools} pools, {args.runs} runs each (after 5 warm-up), DEBUG=0, PostgreSQL")
    print(f"{'endpoint':44} {'interruptible':>13} {'median ms':>10} {'queries':>8}")
    for interruptible in (False, True):
        populate(args.pools, interruptible)
        client.force_login(User.objects.get(username="bench"))
        for label, url in [("overview page /", "/?region=tax-region"),
                           ("pools API, every pool on one page",
                            f"/api/v1/pools/?page_size={args.pools}"),
                           ("pool page /pools/tax-0000/", "/pools/tax-0000/")]:
            timings = measure(client, url, args.runs, {})
            with CaptureQueriesContext(connection) as queries:
                client.get(url)
            share = "half" if interruptible else "none"
            print(f"{label:44} {share:>13} {statistics.median(timings):10.1f} "
                  f"{len(queries):8d}", flush=True)
    populate(0, False)


if __name__ == "__main__":
    main()
