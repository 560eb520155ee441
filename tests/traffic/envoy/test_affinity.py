"""Prefix affinity on Envoy: what is rendered (the route's hash on its affinity header, ring
hash with bounded load on its pools' clusters, the Lua table), what `envoy --mode validate`
accepts, and a real Envoy in front of one pool of three simulated endpoints: requests sharing
a prompt prefix land on one endpoint, different prefixes spread, the caller's key wins, a
dead endpoint's keys move (only its own) without an error, and a hot key spills over."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from fleetctl.demo.envoy_process import validate_config
from fleetctl.traffic.gateways.base import (
    DesiredState,
    PoolTarget,
    PrefixAffinity,
    TierSpec,
    renderable,
)
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.affinity import HASH_BALANCE_FACTOR
from fleetctl.traffic.gateways.haproxy.adapter import HAProxyAdapter
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

from .conftest import MODEL, Gateway, route, state

ENDPOINTS = ("e0", "e1", "e2")
PROMPT = PrefixAffinity("prompt", 512)
HEADER_KEY = PrefixAffinity("header", 0)


def pools_ab() -> dict[str, PoolTarget]:
    return {"pa": PoolTarget("pa", ("http://127.0.0.1:8101",), "US"),
            "pb": PoolTarget("pb", ("http://127.0.0.1:8102",), "US")}


# --- rendering -----------------------------------------------------------------------------

def test_an_affinity_route_hashes_on_its_header_and_its_pools_ring_hash() -> None:
    tiers = (TierSpec(100, 0, "failover", ("pa",)), TierSpec(None, 100, "failover", ("pa",)))
    desired = state(pools_ab(),
                    replace(route("chat", {"pa": 10000}), affinity=PROMPT, tiers=tiers),
                    route("other", {"pb": 10000}, model="m2"))
    rendered = envoy_config.render(desired)
    entries = rendered.route_config["virtual_hosts"][0]["routes"]
    chat = [e for e in entries if e["name"] == "chat"]
    assert len(chat) == 4  # two tiers, unknown, the route's own: each hashes
    for entry in chat:
        assert entry["route"]["hash_policy"] == [
            {"header": {"header_name": "x-fleetctl-affinity-p512"}}]
    other = next(e for e in entries if e["name"] == "other")
    assert "hash_policy" not in other["route"]
    assert rendered.clusters["pa"]["lb_policy"] == "RING_HASH"
    assert rendered.clusters["pa"]["common_lb_config"] == {
        "consistent_hashing_lb_config": {"hash_balance_factor": HASH_BALANCE_FACTOR}}
    assert rendered.clusters["pb"]["lb_policy"] == "LEAST_REQUEST"
    lua = rendered.route_config["virtual_hosts"][0]["typed_per_filter_config"]
    script = next(iter(lua.values()))["source_code"]["inline_string"]
    assert f'["{MODEL}"] = {{{{"x-fleetctl-affinity-p512", 512}}}}' in script
    assert "local AFFINITY_SCAN = 512" in script


def test_a_queue_tiers_own_clusters_hash_like_their_pool(tmp_path: Path) -> None:
    """A queue tier sends each pool's share to a copy of its cluster (fallback.py): on an
    affinity route the copy must hash too, or the tier's requests would lose their warm
    endpoint; fallback's aggregate clusters delegate to those, and the config stays valid."""
    queue = TierSpec(None, 100, "queue", ("pa", "pb"), queue_max=8, retry_after_s=5)
    tiers = (TierSpec(100, 0, "failover", ("pa", "pb")), queue)
    desired = state(pools_ab(), replace(route("chat", {"pa": 5000, "pb": 5000}),
                                        affinity=PROMPT, tiers=tiers))
    rendered = envoy_config.render(desired)
    copies = {name: c for name, c in rendered.clusters.items()
              if "_q_" in name}
    assert len(copies) == 2
    assert {c["lb_policy"] for c in copies.values()} == {"RING_HASH"}
    ok, output = validate_config(envoy_config.render_validation_bootstrap(desired), tmp_path)
    assert ok, output


def test_affinity_passes_envoy_validate(tmp_path: Path) -> None:
    desired = state(pools_ab(), replace(route("chat", {"pa": 5000, "pb": 5000}),
                                        affinity=PROMPT),
                    replace(route("keyed", {"pb": 10000}, model="m2"), affinity=HEADER_KEY))
    ok, output = validate_config(envoy_config.render_validation_bootstrap(desired), tmp_path)
    assert ok, output
    assert "deprecated" not in output.lower()


def test_a_kind_without_affinity_drops_it_and_says_so() -> None:
    desired = state(pools_ab(), replace(route("chat", {"pa": 10000}), affinity=PROMPT))
    fit = renderable(HAProxyAdapter, desired)
    assert fit.desired.routes[0].affinity is None
    assert "cannot keep prefix affinity; route(s) chat" in fit.warning


# --- through a real Envoy, one pool of three endpoints -----------------------------------

@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("affinity-sims"), TEST_PROFILES,
                            dict.fromkeys(ENDPOINTS, "quick"), models=[MODEL],
                            args=["--record-ground-truth", "--ground-truth-size", "5000"])
    yield sim
    sim.stop()


def pool(*sims: SimProcess) -> dict[str, PoolTarget]:
    urls = tuple(sim.url(name) for sim in sims for name in sim.urls)
    return {"pool": PoolTarget("pool", urls, "US")}


def apply(gw: Gateway, desired: DesiredState) -> None:
    result = gw.adapter.apply(desired)
    assert result.applied, result.detail


def ask(gw: Gateway, prefix: str, tail: str = "", *, key: str | None = None,
        raw: bytes | None = None) -> str:
    """One chat request through the gateway; the answer's id."""
    body = raw or json.dumps({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": prefix},
        {"role": "user", "content": tail or uuid.uuid4().hex}]}).encode()
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["x-fleetctl-prefix-key"] = key
    answer = httpx.post(f"{gw.url}/v1/chat/completions", content=body, headers=headers,
                        timeout=30)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def served(sims: list[SimProcess], ids: list[str]) -> dict[str, str]:
    """Answer id -> the endpoint (sim pool name) whose ground truth records it."""
    found: dict[str, str] = {}

    def recorded() -> bool:
        for sim in sims:
            for name in sim.urls:
                try:
                    answer = httpx.get(f"{sim.url(name)}/admin/ground-truth",
                                       params={"kind": "requests", "limit": "100000"},
                                       timeout=5)
                except httpx.HTTPError:
                    continue  # a stopped endpoint records nothing more
                for record in answer.json()["requests"]:
                    found[record["response_id"]] = name
        return all(i in found for i in ids)

    wait_until(recorded, timeout_s=30, every_s=0.05, what="the endpoints to record answers",
               explain=lambda: f"missing: {[i for i in ids if i not in found]}")
    return {i: found[i] for i in ids}


def prefix(n: int) -> str:
    return f"Shared system prompt number {n}. " + "You answer about the handbook. " * 30


def test_a_shared_prefix_returns_to_one_endpoint_and_others_spread(
        gateway: Gateway, endpoints: SimProcess) -> None:
    apply(gateway, state(pool(endpoints),
                         replace(route("chat", {"pool": 10000}), affinity=PROMPT)))
    ids = {n: [ask(gateway, prefix(n)) for _ in range(3)] for n in range(12)}
    where = served([endpoints], [i for group in ids.values() for i in group])
    homes = {}
    for n, group in ids.items():
        assert len({where[i] for i in group}) == 1, (n, [where[i] for i in group])
        homes[n] = where[group[0]]
    assert len(set(homes.values())) >= 2, homes
    # The same content sent with other JSON punctuation (spacing, key order) is the same key.
    raw = (b'{ "messages" : [ {"content" : ' + json.dumps(prefix(0)).encode()
           + b', "role":"system"}, {"role":"user","content":"again"} ],\n "max_tokens":2,'
           b' "model" : "' + MODEL.encode() + b'" }')
    first = ask(gateway, "", raw=raw)
    assert served([endpoints], [first])[first] == homes[0]


def test_the_callers_key_wins_over_the_prompt(gateway: Gateway, endpoints: SimProcess) -> None:
    apply(gateway, state(pool(endpoints),
                         replace(route("chat", {"pool": 10000}), affinity=PROMPT)))
    ids = [ask(gateway, prefix(n), key="tenant-7") for n in range(8)]
    assert len(set(served([endpoints], ids).values())) == 1
    # A `header` route reads no prompt: without a key a request is balanced (and answered).
    apply(gateway, state(pool(endpoints),
                         replace(route("chat", {"pool": 10000}), affinity=HEADER_KEY)))
    keyed = [ask(gateway, prefix(n), key="tenant-9") for n in range(6)]
    assert len(set(served([endpoints], keyed).values())) == 1
    unkeyed = [ask(gateway, prefix(0)) for _ in range(12)]
    assert len(set(served([endpoints], unkeyed).values())) >= 2


def test_a_dead_endpoints_keys_move_and_only_they(
        gateway: Gateway, endpoints: SimProcess, tmp_path: Path) -> None:
    extra = sim_with_profiles(tmp_path / "dead", TEST_PROFILES, {"d0": "quick"},
                              models=[MODEL],
                              args=["--record-ground-truth", "--ground-truth-size", "5000"])
    sims = [endpoints, extra]
    try:
        apply(gateway, state(pool(*sims),
                             replace(route("chat", {"pool": 10000}), affinity=PROMPT)))
        homes: dict[int, str] = {}
        for n in range(100, 180):  # until the dead-to-be endpoint holds some keys
            answer = ask(gateway, prefix(n))
            homes[n] = served(sims, [answer])[answer]
            if list(homes.values()).count("d0") >= 2 and len(homes) >= 12:
                break
        on_dead = [n for n, home in homes.items() if home == "d0"]
        assert len(on_dead) >= 2, homes
        extra.stop()
        # Every request is answered: a refused connect is retried on another endpoint.
        after = {n: ask(gateway, prefix(n)) for n in homes}
        where = served([endpoints], list(after.values()))
        for n, home in homes.items():
            if home != "d0":
                assert where[after[n]] == home, (n, home, where[after[n]])
            else:
                assert where[after[n]] in ENDPOINTS
    finally:
        extra.stop()


@pytest.fixture
def slow_endpoints(endpoints: SimProcess) -> Iterator[SimProcess]:
    """Every answer takes 1.5 s more, so requests sent together are in flight together."""
    for name in ENDPOINTS:
        httpx.post(f"{endpoints.url(name)}/admin/faults", json={"added_latency_ms": 1500},
                   timeout=5).raise_for_status()
    yield endpoints
    for name in ENDPOINTS:
        httpx.post(f"{endpoints.url(name)}/admin/reset", timeout=5).raise_for_status()


def test_bounded_load_spills_a_hot_key(gateway: Gateway, slow_endpoints: SimProcess) -> None:
    apply(gateway, state(pool(slow_endpoints),
                         replace(route("chat", {"pool": 10000}), affinity=PROMPT)))
    with ThreadPoolExecutor(6) as workers:
        ids = list(workers.map(lambda _: ask(gateway, prefix(1)), range(6)))
    # Without the bound all six would queue on the key's endpoint.
    assert len(set(served([slow_endpoints], ids).values())) >= 2
