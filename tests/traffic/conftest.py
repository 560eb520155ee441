"""Fixtures shared by the gateway adapters' tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
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
