"""Fixtures shared by the gateway adapters' tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import services
from fleetctl.traffic.models import Gateway, Route
from tests.conftest import SYSTEM
from tests.sim.simproc import SimProcess
from tests.traffic.scenarios import start_fleet


@pytest.fixture(scope="module")
def sim_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    """One simulator process with the scenario pools, per test module."""
    sim = start_fleet(tmp_path_factory.mktemp("fleet"))
    yield sim
    sim.stop()


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[EnvoyProcess]:
    """A real Envoy of the test's own, nothing behind it until a gateway row pushes to it."""
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    yield process
    process.stop()


# --- a two-pool route and a file gateway (the fake kind), for tests of the traffic records ---

MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
def file_kind(settings) -> None:
    settings.FLEETCTL_GATEWAY_KINDS = ["tests.traffic.fake_kind"]


@pytest.fixture
def route(make_pool) -> Route:
    """`llama`: 80 % on its primary `primary`, 20 % on `cand`, both healthy."""
    pools = [make_pool(name="primary"), make_pool(name="cand")]
    for pool in pools:
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return services.route_create(actor=SYSTEM, name="llama", model_id=MODEL,
                                 primary_pool=pools[0], weights={"primary": 80, "cand": 20})


@pytest.fixture
def gateway(route: Route, tmp_path: Path, file_kind: None) -> Gateway:
    """`gw-1`, a file gateway carrying `route`."""
    return services.gateway_create(actor=SYSTEM, name="gw-1", kind="file",
                                   admin_address=str(tmp_path),
                                   options={"file_name": "weights.json"}, routes=[route])
