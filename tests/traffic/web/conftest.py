"""Fixtures for the traffic dashboard tests: people with roles, pools that serve one model in
two jurisdictions, and routes made through the services (the path the dashboard, API and CLI
share)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from fleetctl.accounts.actor import Actor
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create, region_create
from fleetctl.traffic import services
from fleetctl.traffic.models import Route

MODEL = "llama-3.1-8b-instruct"
SYSTEM = Actor.for_system("test")


@pytest.fixture
def login_as(make_user: Callable[..., User]) -> Callable[..., Client]:
    """A browser-like client signed in as a new person holding `role`."""

    def client_for(role: str, username: str | None = None) -> Client:
        client = Client()
        client.force_login(make_user(username or f"{role}-person", role))
        return client

    return client_for


@pytest.fixture
def viewer(login_as: Callable[..., Client]) -> Client:
    return login_as("viewer", "vera")


@pytest.fixture
def oncall(login_as: Callable[..., Client]) -> Client:
    return login_as("on-call", "olga")


@pytest.fixture
def pools(make_pool: Callable[..., Pool]) -> dict[str, Pool]:
    """Two US pools and two EU pools, all healthy and serving MODEL."""
    eu = region_create(actor=SYSTEM, code="eu-west", name="EU West", jurisdiction="EU")
    made = {
        "primary": make_pool(name="h200-us"),
        "cand": make_pool(name="mi300x-us", runtime="rocm"),
        "eu": make_pool(name="h200-eu", region=eu),
        "eu2": make_pool(name="mi300x-eu", runtime="rocm", region=eu),
    }
    for pool in made.values():
        healthy(pool)
    return made


def healthy(pool: Pool, model: str = MODEL) -> Pool:
    pool_model_create(actor=SYSTEM, pool=pool, model_id=model, max_context_tokens=8192)
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return pool


def make_route(name: str = "llama", *, primary: str = "h200-us", weights: Any = None,
               **extra: Any) -> Route:
    return services.route_create(actor=SYSTEM, name=name, model_id=extra.pop("model_id", MODEL),
                                 primary_pool=Pool.objects.get(name=primary), weights=weights,
                                 **extra)


def ramp(route: Route, weights: dict[str, float], reason: str = "ramp") -> None:
    route.refresh_from_db()
    services.revision_create(actor=SYSTEM, route=route, weights=weights,
                             base_revision=route.revision_number, reason=reason)


@pytest.fixture
def route(pools: dict[str, Pool]) -> Route:
    """Route `llama`: 95 % on its primary h200-us, 5 % on mi300x-us (revision 2)."""
    made = make_route()
    ramp(made, {"h200-us": 95, "mi300x-us": 5}, reason="first 5 %")
    made.refresh_from_db()
    return made
