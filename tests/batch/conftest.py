"""Fixtures for the batch tests: a real simulator process serving MODEL (one for the whole
session: starting one costs a second or two) and, per test, a fleet Pool row pointing at it,
serving MODEL and healthy, so a job can target it and a worker can send to it.

    def test_x(sim_pool, tmp_path, system):
        job = make_job(system, sim_pool, n=20, tmp_path=tmp_path)

`sim_pool` works with `db` and with `transactional_db` (a worker process must see the rows):
pytest-django's `db` gives way to `transactional_db` when a test asks for both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from tests.conftest import SYSTEM
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES

from .factory import MODEL

# Two pools of one process: "batch" (the target) and "primary" (for comparisons), "quick"
# both: a few ms per answer, no noise, no divergence, MODEL served.
SIM_POOLS = {"batch": "quick", "primary": "quick"}


@pytest.fixture(scope="session")
def batch_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    """One simulator process for the session, pools "batch" and "primary" on free ports.
    Tests that fault a pool (`/admin/faults`) must clear the fault before they end."""
    sim = sim_with_profiles(tmp_path_factory.mktemp("batch-sim"), TEST_PROFILES, SIM_POOLS)
    yield sim
    sim.stop()


def _healthy_pool(make_pool: Callable[..., Pool], url: str, name: str,
                  **overrides: Any) -> Pool:
    pool = make_pool(name=name, base_urls=[url], **overrides)
    pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
    # A pool of unknown health turns healthy on its first good probe.
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0,
                       models_seen=[MODEL])
    pool.refresh_from_db()
    assert pool.health_state == Pool.Health.HEALTHY
    return pool


@pytest.fixture
def sim_pool(batch_sim: SimProcess, make_pool: Callable[..., Pool]) -> Pool:
    """A Pool row ("batch-sim") for the simulator's "batch" pool: serves MODEL, healthy."""
    return _healthy_pool(make_pool, batch_sim.url("batch"), "batch-sim")


@pytest.fixture
def sim_primary_pool(batch_sim: SimProcess, make_pool: Callable[..., Pool]) -> Pool:
    """A second Pool row ("primary-sim") for the simulator's "primary" pool (a plan's
    primary in comparisons): serves MODEL, healthy."""
    return _healthy_pool(make_pool, batch_sim.url("primary"), "primary-sim", runtime="rocm",
                         accelerator="MI300X")


@pytest.fixture(autouse=True)
def batch_files_dir(settings: Any, tmp_path: Path) -> Path:
    """Every batch test keeps its input files in its own folder (nothing left behind in
    var/). A worker process a test starts must get the same folder: pass
    env BATCH_FILES_DIR=str(batch_files_dir) (BatchFile.path is relative to it)."""
    folder = tmp_path / "batch-files"
    folder.mkdir()
    settings.BATCH_FILES_DIR = folder
    return folder
