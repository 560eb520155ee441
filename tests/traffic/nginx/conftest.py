"""A simulated fleet and one nginx per module; each test applies its own state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetctl.demo.nginx_process import NginxProcess
from fleetctl.traffic.gateways.nginx.adapter import NginxAdapter
from tests.sim.simproc import SimProcess
from tests.traffic.scenarios import Harness


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxProcess]:
    process = NginxProcess(tmp_path_factory.mktemp("nginx")).start(timeout_s=60)
    yield process
    process.stop()


@pytest.fixture
def harness(sim_fleet: SimProcess, nginx: NginxProcess) -> Harness:
    return Harness(url=nginx.url, adapter=NginxAdapter(nginx.gateway), sim=sim_fleet)
