"""One simulator process for the conformance tests, with a pool per contract variant: a
conforming pool and its twin (the reference), the legacy A100 profile (no tool parsing,
another tokenizer), pools with one switch off each, and a tiny one that saturates at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES

MODEL = "llama-3.1-8b-instruct"
SIM_POOLS = {"good": "quick", "twin": "quick-twin", "legacy": "legacy",
             "no-usage": "quick:stream_usage=false", "no-json": "quick:json_mode=false",
             "tiny": "small"}


@pytest.fixture(scope="session")
def conformance_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("conformance-sim"), TEST_PROFILES,
                            SIM_POOLS)
    yield sim
    sim.stop()


@pytest.fixture
def sim_pool(conformance_sim: SimProcess, make_pool: Callable[..., Pool], system: Any
             ) -> Callable[..., Pool]:
    """A registry pool pointing at simulated pools (several: one endpoint each)."""

    def make(name: str, *sims: str, max_context: int = 4096) -> Pool:
        pool = make_pool(name=name, base_urls=[conformance_sim.url(s) for s in sims])
        pool_model_create(actor=system, pool=pool, model_id=MODEL,
                          max_context_tokens=max_context)
        return pool

    return make
