"""A small world for migration plans: a primary and a candidate serving one model, a route
carried by a gateway, an author and two other platform leads, an on-call and a viewer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User

from fleetctl.accounts.actor import Actor
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Route
from migrations_plan import services
from migrations_plan.models import Plan

MODEL = "llama-3.1-8b-instruct"


@dataclass
class World:
    primary: Pool
    candidate: Pool
    route: Route
    author: User
    lead: User
    lead2: User
    oncall: User
    viewer: User
    admin: User

    def actor(self, who: str) -> Actor:
        return Actor(user=getattr(self, who))

    def plan(self, name: str = "mi300x-llama", **overrides: Any) -> Plan:
        fields: dict[str, Any] = {
            "name": name, "candidate_pool": self.candidate, "primary_pool": self.primary,
            "routes": [self.route], "slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60,
            "slo_error_rate": 0.01,
        }
        fields.update(overrides)
        return services.plan_create(actor=self.actor("author"), **fields)


@pytest.fixture
def world(make_pool, make_user, system) -> World:
    primary = make_pool(name="h200-us")
    candidate = make_pool(name="mi300x-us", runtime="rocm", runtime_version="rocm-6.4",
                          labels={"driver": "6.4.1"})
    for pool in (primary, candidate):
        pool_model_create(actor=system, pool=pool, model_id=MODEL, revision="abc123",
                          max_context_tokens=8192)
        for _ in range(2):
            pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = traffic.route_create(actor=system, name="llama", model_id=MODEL,
                                 primary_pool=primary)
    traffic.gateway_create(actor=system, name="envoy-a", kind="envoy",
                           admin_address="http://127.0.0.1:1", options={"config_dir": "/tmp/x"},
                           routes=[route])
    return World(
        primary=Pool.objects.get(pk=primary.pk), candidate=Pool.objects.get(pk=candidate.pk),
        route=route, author=make_user("alice", "platform-lead"),
        lead=make_user("bob", "platform-lead"), lead2=make_user("carol", "platform-lead"),
        oncall=make_user("olga", "on-call"), viewer=make_user("vic", "viewer"),
        admin=make_user("ada", "admin"),
    )
