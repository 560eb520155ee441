"""A real Prometheus (Debian's package) scraping two simulated pools (labelled with the pool
names of tests/migrations_plan's world) and a real Envoy's admin `/stats/prometheus`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetctl.core.http import http_get
from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.demo.prometheus_process import (
    INSTALL_HINT,
    PrometheusProcess,
    ScrapeJob,
    prometheus_binary,
)
from tests.migrations_plan.conftest import World, world  # noqa: F401 (the plans' world)
from tests.prometheus.json_endpoint import JsonEndpoint, serve
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

POOLS = ("h200-us", "mi300x-us")  # the world's primary and candidate


@dataclass
class Stack:
    prometheus: PrometheusProcess
    sim: SimProcess
    envoy: EnvoyProcess
    rules_dir: Path

    def series(self, query: str) -> list[dict[str, object]]:
        answer = http_get(f"{self.prometheus.url}/api/v1/query?query={query}", timeout_s=5)
        return list(answer.json()["data"]["result"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if prometheus_binary() is None:
        pytest.fail(INSTALL_HINT)
    folder = tmp_path_factory.mktemp("prometheus")
    sim = sim_with_profiles(folder / "sim", TEST_PROFILES, {p: "quick" for p in POOLS})
    envoy = EnvoyProcess(folder / "envoy", free_port(), free_port()).start(timeout_s=60)
    jobs = [ScrapeJob(f"pool-{p}", f"{sim.url(p)}/metrics", {"pool": p}) for p in POOLS]
    jobs.append(ScrapeJob("envoy", f"{envoy.admin_url}/stats/prometheus",
                          {"gateway": "envoy-test"}))
    rules_dir = folder / "rules"
    rules_dir.mkdir()
    prometheus = PrometheusProcess(folder / "prom", jobs=jobs).start()
    stack = Stack(prometheus, sim, envoy, rules_dir)
    try:
        # Every target scraped once: `up` answers for the three jobs.
        wait_until(lambda: len(stack.series("up")) == 3 and all(
            s["value"][1] == "1" for s in stack.series("up")),  # type: ignore[index]
            timeout_s=60, what="prometheus to scrape both pools and envoy",
            explain=prometheus.log)
        yield stack
    finally:
        prometheus.stop()
        envoy.stop()
        sim.stop()


@pytest.fixture
def json_endpoint() -> Iterator[JsonEndpoint]:
    """A real HTTP server answering JSON per path (tests/prometheus/json_endpoint.py)."""
    yield from serve()
