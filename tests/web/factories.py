"""Test data for the dashboard tests: people with roles, and a fleet made through the services
(the same path the dashboard and the API use), with probe history so charts have data."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import Group, User
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.fleet import services
from fleetctl.fleet.models import HealthCheck, Pool, Region

PASSWORD = "correct-horse-battery-staple"
SYSTEM = Actor.for_system("test")

RUNTIMES = ["cuda", "rocm", "tpu"]
ACCELERATORS = {"cuda": "H200", "rocm": "MI300X", "tpu": "TPU v5e"}


def make_user(username: str, role: str | None) -> User:
    user = User.objects.create_user(username=username, password=PASSWORD)
    if role:
        # get_or_create: a transactional test's flush empties the groups the migration made.
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def make_region(code: str = "eu-west-1", jurisdiction: str = "EU", name: str = "") -> Region:
    return services.region_create(
        actor=SYSTEM, code=code, name=name or code.title(), jurisdiction=jurisdiction
    )


def make_pool(name: str, region: Region, *, runtime: str = "cuda", **extra: Any) -> Pool:
    fields: dict[str, Any] = {
        "runtime": runtime,
        "accelerator": ACCELERATORS.get(runtime, "X1"),
        "region": region,
        "base_urls": [f"http://{name}.pools.internal:8000/v1"],
        "max_context_tokens": 32768,
        "node_hourly_rate": Decimal("9.5000"),
        "currency": "USD",
        "labels": {"team": "serving"},
    }
    fields.update(extra)
    pool = services.pool_create(actor=SYSTEM, name=name, **fields)
    services.pool_model_create(
        actor=SYSTEM, pool=pool, model_id="llama-3.1-70b-instruct", quantisation="fp8",
        max_context_tokens=32768,
    )
    services.pool_model_create(
        actor=SYSTEM, pool=pool, model_id="qwen2.5-7b-instruct", quantisation="bf16",
        max_context_tokens=16384,
    )
    return pool


def seed_fleet(count: int, *, prefix: str = "pool") -> list[Pool]:
    """`count` pools spread over runtimes and two regions (made on first use)."""
    regions = list(Region.objects.filter(code__in=["eu-west-1", "ap-south-1"])) or [
        make_region("eu-west-1", "EU"), make_region("ap-south-1", "IN"),
    ]
    return [
        make_pool(f"{prefix}-{i:03d}", regions[i % len(regions)],
                  runtime=RUNTIMES[i % len(RUNTIMES)])
        for i in range(count)
    ]


def seed_probe_history(pool: Pool, *, hours: int = 24, every_minutes: int = 20) -> None:
    """Back-dated probes for the chart (every 9th one fails), then two live probes through
    the service so the pool's own state is `healthy` the way the prober would set it."""
    now = timezone.now()
    checks = []
    for step in range(hours * 60 // every_minutes):
        failed = step % 9 == 4
        checks.append(HealthCheck(
            pool=pool, checked_at=now - timedelta(minutes=every_minutes * step + 5),
            ok=not failed, status_code=None if failed else 200,
            latency_ms=None if failed else 40.0 + (step * 7) % 35,
            error="connect timeout after 5 s" if failed else "",
        ))
    HealthCheck.objects.bulk_create(checks)
    for _ in range(2):
        services.pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=42.0)
