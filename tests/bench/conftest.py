"""Fixtures for the benchmark runner: one simulator process (real, `python -m fleetctl.sim`)
with ground truth recorded, and a trace row type that needs nothing from `traces.py`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES

# "paced": known timing (tests/support/profiles.py).
BENCH_POOLS = {"paced": "paced", "faulty": "paced", "flaky": "paced"}


@dataclass(frozen=True)
class Row:
    """A trace row as the runner reads it (the shape of `traces.TraceRequest`)."""

    prompt_tokens: int
    completion_tokens: int
    arrival_s: float = 0.0
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prefix_group: str | None = None
    prefix_tokens: int = 0
    latency_class: str | None = None


@pytest.fixture(scope="session")
def bench_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("bench-sim"), TEST_PROFILES, BENCH_POOLS,
                            args=["--record-ground-truth"])
    yield sim
    sim.stop()
