"""A simulated fleet and one HAProxy process per module; each test applies its own state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetctl.demo.haproxy_process import HAProxyProcess
from fleetctl.traffic.gateways.haproxy.adapter import HAProxyAdapter
from tests.sim.simproc import SimProcess
from tests.traffic.scenarios import Harness


@pytest.fixture(scope="module")
def haproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HAProxyProcess]:
    process = HAProxyProcess(tmp_path_factory.mktemp("haproxy")).start(timeout_s=60)
    yield process
    process.stop()


@pytest.fixture
def harness(sim_fleet: SimProcess, haproxy: HAProxyProcess) -> Harness:
    return Harness(url=haproxy.url, adapter=HAProxyAdapter(haproxy.gateway), sim=sim_fleet)
