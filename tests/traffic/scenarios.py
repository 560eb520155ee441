"""Helpers for driving a gateway with real traffic: the simulated pools behind it, desired
states, the official `openai` client, and what each pool served.

A pool's count is read from its own `/metrics` (`vllm:request_success_total`), never from what
the gateway says. The scenarios themselves are in tests/traffic/contract/.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from fleetctl.traffic.gateways.base import (
    Adapter,
    ApplyResult,
    DesiredState,
    PoolTarget,
    RouteSpec,
)
from tests.sim.simproc import MODEL, SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES

# alpha and beta serve the unpinned route in the US; gamma is the only pool in India.
POOLS = {"alpha": "US", "beta": "US", "gamma": "IN"}
RESIDENCY = "x-fleetctl-residency"
LATENCY_CLASS = "x-fleetctl-latency-class"
OTHER_MODEL = "qwen2.5-7b-instruct"  # every pool serves it too, for routes by model


def start_fleet(directory: Path) -> SimProcess:
    return sim_with_profiles(directory, TEST_PROFILES, dict.fromkeys(POOLS, "quick"),
                             models=[MODEL, OTHER_MODEL])


def route(weights: dict[str, int], *, key: str = "chat", residency: str = "",
          latency_class: str = "", model: str = MODEL, revision: int = 1) -> RouteSpec:
    return RouteSpec(key=key, model=model, latency_class=latency_class, residency=residency,
                     revision=revision, weights=weights)


@dataclass
class Harness:
    """A gateway process, its adapter, and the simulated pools behind it."""

    url: str
    adapter: Adapter
    sim: SimProcess
    extra_pools: dict[str, PoolTarget] | None = None

    def pools(self) -> dict[str, PoolTarget]:
        pools = {name: PoolTarget(name=name, base_urls=(self.sim.url(name),), jurisdiction=j)
                 for name, j in POOLS.items()}
        return {**pools, **(self.extra_pools or {})}

    def desired(self, *routes: RouteSpec) -> DesiredState:
        return DesiredState(routes=routes, pools=self.pools())

    def apply(self, *routes: RouteSpec) -> ApplyResult:
        return self.adapter.apply(self.desired(*routes))

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="sim", max_retries=0,
                             timeout=30, default_headers=headers or None)

    def served(self) -> dict[str, int]:
        return {name: served_by(self.sim.url(name)) for name in POOLS}

    def served_since(self, before: dict[str, int]) -> dict[str, int]:
        now = self.served()
        return {name: now[name] - before[name] for name in POOLS}


def served_by(pool_url: str) -> int:
    text = httpx.get(f"{pool_url}/metrics", timeout=5).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total{")))


def ask(client: openai.OpenAI, model: str = MODEL) -> str:
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "ping"}], max_tokens=2)
    return answer.choices[0].finish_reason or ""


def error_of(call: Callable[[], object]) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value


@contextmanager
def slowed(sim: SimProcess, pool: str, slowdown: float) -> Iterator[None]:
    """Make one pool's decode steps `slowdown` times longer, so a stream lasts seconds."""
    httpx.post(f"{sim.url(pool)}/admin/faults", json={"slowdown": slowdown}, timeout=5)
    try:
        yield
    finally:
        httpx.post(f"{sim.url(pool)}/admin/reset", timeout=5)
