"""Fixtures shared by the gateway adapters' tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sim.simproc import SimProcess
from tests.traffic.scenarios import start_fleet


@pytest.fixture(scope="module")
def sim_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    """One simulator process with the scenario pools, per test module."""
    sim = start_fleet(tmp_path_factory.mktemp("fleet"))
    yield sim
    sim.stop()
