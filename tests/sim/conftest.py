"""Fixtures: one long-lived simulator process (`fleet`) serving the pools most tests need,
and `start_sim` for short-lived ones (CLI and shutdown tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.profiles import TEST_PROFILES

from .simproc import FLEET_POOLS, SimProcess


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so --strict-markers holds under any ini file.
    config.addinivalue_line("markers", "slow: end-to-end tests that start real processes")


@pytest.fixture(scope="session")
def profiles_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "profiles.toml"
    path.write_text(TEST_PROFILES)
    return path


@pytest.fixture(scope="session")
def fleet(
    profiles_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimProcess]:
    args = ["--profiles", str(profiles_file), "--log-level", "WARNING"]
    for name, profile in FLEET_POOLS.items():
        args += ["--pool", f"{name}={profile}@0"]
    sim = SimProcess(args, len(FLEET_POOLS), tmp_path_factory.mktemp("sim") / "fleet.log")
    yield sim
    assert sim.stop() == 0, sim.log()


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., SimProcess]]:
    started: list[SimProcess] = []

    def start(*args: str, pools: int = 1) -> SimProcess:
        sim = SimProcess(list(args), pools, tmp_path / f"sim{len(started)}.log")
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()
