"""`manage.py demo_prometheus --url URL --rules-dir DIR`: the demo's Prometheus, once it runs
(fleetctl/demo/devstack.py starts it when /usr/bin/prometheus exists): every pool's generated
alerting rules written where its `rule_files` glob reads them and reloaded, the source
registered (by the demo's administrator), and the MI300X plan's stage-2 dashboards check made
measured against it (by a platform lead), so it reads "measured: 6 rules loaded"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand

from fleetctl.accounts.actor import Actor
from fleetctl.core.http import shared_client
from fleetctl.fleet.models import Pool
from fleetctl.prometheus import generate, selectors, services
from fleetctl.prometheus.models import MetricSource
from migrations_plan.models import Plan

PLAN = "mi300x-llama-8b"


class Command(BaseCommand):
    help = "Register the demo's Prometheus, load the generated rules, measure the MI300X plan."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--url", required=True)
        parser.add_argument("--rules-dir", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        url, folder = options["url"], Path(options["rules_dir"])
        folder.mkdir(parents=True, exist_ok=True)
        for pool in Pool.objects.order_by("name"):
            (folder / f"{generate.group_name(pool.name)}.rules.yml").write_text(
                selectors.pool_rules_yaml(pool))
        reloaded = shared_client().post(f"{url}/-/reload", timeout_s=30.0)
        if reloaded.status_code != 200:
            raise SystemExit(f"prometheus reload: HTTP {reloaded.status_code}: "
                             f"{reloaded.text[:300]}")
        admin = Actor(user=User.objects.get(username="admin"))
        source = MetricSource.objects.filter(name="prometheus").first()
        if source is None:
            source = services.source_create(actor=admin, name="prometheus", base_url=url)
        elif source.base_url != url:
            source = services.source_update(actor=admin, source=source, base_url=url)
        plan = Plan.objects.filter(name=PLAN).first()
        if plan is not None and plan.stage == 2:
            lead = Actor(user=User.objects.get(username="lead"))
            check = services.dashboards_measured(actor=lead, plan=plan, source=source)
            self.stdout.write(f"{PLAN}: stage 2 '{check.title}' reads from {source.name}")
        self.stdout.write(f"prometheus at {url}: rules of "
                          f"{Pool.objects.count()} pools loaded")
