"""Real Envoy processes in front of real simulated pools, all on loopback and free ports.

`sims`: one simulator process for the session, pools `pa`, `pb`, `pc` (fast profile, both
test models, ground truth on). `gateway`: one Envoy per test module, and the EnvoyAdapter
pointed at it; each test applies the whole state it needs, as fleetctl does. Which pool
served a request is read from the pools' own ground truth, never from what Envoy says.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.traffic.gateways.base import DesiredState, GatewaySpec, PoolTarget, RouteSpec
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

MODEL = "llama-3.1-8b-instruct"
OTHER_MODEL = "qwen2.5-7b-instruct"
POOLS = ("pa", "pb", "pc")
JURISDICTION = {"pa": "US", "pb": "EU", "pc": "EU"}


@pytest.fixture(scope="session")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("envoy-sims"), TEST_PROFILES,
                            dict.fromkeys(POOLS, "quick"), models=[MODEL, OTHER_MODEL],
                            args=["--record-ground-truth", "--ground-truth-size", "5000"])
    yield sim
    sim.stop()


@dataclass
class Gateway:
    process: EnvoyProcess
    adapter: EnvoyAdapter
    sims: SimProcess
    _client: openai.OpenAI | None = None

    @property
    def url(self) -> str:
        return self.process.listen_url

    def client(self) -> openai.OpenAI:
        """One client per test: a new one costs an SSL context (~20 ms) per request."""
        if self._client is None:
            self._client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="test",
                                         max_retries=0, timeout=30.0)
        return self._client

    def pools(self, *names: str) -> dict[str, PoolTarget]:
        return {n: PoolTarget(n, (self.sims.url(n),), JURISDICTION[n]) for n in names}

    def served_by(self, *expected: str, timeout_s: float = 30.0) -> dict[str, str]:
        return served_by(self.sims, *expected, timeout_s=timeout_s)


def served_by(sims: SimProcess, *expected: str, timeout_s: float = 30.0) -> dict[str, str]:
    """Response id and request id -> the pool whose ground truth records it. A pool
    records a request just after answering it, so wait for the `expected` ids (as long
    as a loaded machine may need: waiting costs nothing once they are there)."""
    served: dict[str, str] = {}

    def recorded() -> bool:
        served.clear()
        served.update(_ground_truth(sims))
        return all(i in served for i in expected)

    wait_until(recorded, timeout_s=timeout_s, every_s=0.02,
               what=f"the pools to record {', '.join(expected)}",
               explain=lambda: f"missing: {[i for i in expected if i not in served]}")
    return served


def _ground_truth(sims: SimProcess) -> dict[str, str]:
    served: dict[str, str] = {}
    for pool in POOLS:
        answer = httpx.get(f"{sims.url(pool)}/admin/ground-truth",
                           params={"kind": "requests", "limit": "100000"}, timeout=5)
        for record in answer.json()["requests"]:
            served[record["response_id"]] = pool
            served[record["request_id"]] = pool
    return served


@pytest.fixture(scope="module")
def gateway(sims: SimProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    for pool in POOLS:
        httpx.delete(f"{sims.url(pool)}/admin/ground-truth", timeout=5)
    process = EnvoyProcess(tmp_path_factory.mktemp("envoy"), free_port(),
                           free_port()).start(timeout_s=60)
    # load_timeout_s: how long an apply waits for Envoy to load a swapped file. The default
    # (5 s) is ample on a quiet machine; a loaded one may need longer, and a longer wait
    # costs nothing when the file loads. A rejected file is still detected at once.
    adapter = EnvoyAdapter(GatewaySpec(name="test-gw", kind="envoy",
                                       admin_address=process.admin_url,
                                       options={"config_dir": str(process.workdir),
                                                "load_timeout_s": 30}))
    yield Gateway(process=process, adapter=adapter, sims=sims)
    process.stop()


def route(key: str, weights: dict[str, int], *, model: str = MODEL, latency_class: str = "",
          residency: str = "", revision: int = 1) -> RouteSpec:
    return RouteSpec(key=key, model=model, latency_class=latency_class, residency=residency,
                     revision=revision, weights=weights)


def state(pools: dict[str, PoolTarget], *routes: RouteSpec) -> DesiredState:
    return DesiredState(routes=tuple(routes), pools=pools)
