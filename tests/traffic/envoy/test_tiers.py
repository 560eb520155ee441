"""Routing by context tier on Envoy: the rendered entries (order, matchers, splits), what
`envoy --mode validate` accepts, and a real Envoy in front of simulated pools sending short
prompts to one pool, long ones to another, refusing above a `reject` tier with 413, sending
`unknown` to the most restrictive tier, and never leaving a pinned route's jurisdiction."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetctl.demo.envoy_process import validate_config
from fleetctl.traffic.gateways.base import (
    PROMPT_TOKENS_UNKNOWN,
    DesiredState,
    PoolTarget,
    RouteSpec,
    TierSpec,
    tier_weights,
)
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.adapter import held_weights
from fleetctl.traffic.gateways.envoy.fallback import pool_of
from fleetctl.traffic.gateways.envoy.names import PROMPT_SCAN_LIMIT_BYTES
from fleetctl.traffic.gateways.envoy.routes import INT64_MAX, is_tier_entry

from .conftest import MODEL, Gateway, route, state

HEADER = "x-fleetctl-prompt-tokens"
POOLS = {
    "pa": PoolTarget("pa", ("http://127.0.0.1:8101",), "US"),
    "pb": PoolTarget("pb", ("http://127.0.0.1:8102",), "EU"),
    "pc": PoolTarget("pc", ("http://127.0.0.1:8103",), "EU"),
}
SMALL = TierSpec(bound=100, above=0, behaviour="failover", pools=("pa", "pb"))
LARGE = TierSpec(bound=None, above=100, behaviour="queue", pools=("pb",))
REJECT = TierSpec(bound=None, above=100, behaviour="reject", pools=())


def tiered(weights: dict[str, int], *tiers: TierSpec, **kw: Any) -> RouteSpec:
    return replace(route("chat", weights, **kw), tiers=tiers)


def entries(desired: DesiredState) -> list[dict[str, Any]]:
    config = envoy_config.render(desired).route_config
    return list(config["virtual_hosts"][0]["routes"])


def size_matcher(entry: dict[str, Any]) -> dict[str, Any]:
    return next(h for h in entry["match"]["headers"] if h["name"] == HEADER)


def clusters(entry: dict[str, Any]) -> dict[str, int]:
    """The entry's split by pool (a queue or fallback cluster counts as its pool's)."""
    return {pool_of(c["name"]): c["weight"]
            for c in entry["route"]["weighted_clusters"]["clusters"]}


# --- rendering ---------------------------------------------------------------------------

def test_tier_weights_narrow_the_split_and_renormalise() -> None:
    spec = route("chat", {"pa": 7500, "pb": 2500, "pc": 0})
    assert tier_weights(spec, SMALL) == {"pa": 7500, "pb": 2500}
    assert tier_weights(spec, TierSpec(100, 0, "failover", ("pb", "pc"))) == {
        "pb": 10000, "pc": 0}
    # None of the split's pools with weight is eligible: the tier has no pool (its behaviour
    # answers). A pool the split gives 0 % — drained, or not ramped yet — gets nothing from a
    # tier either: a tier never undoes a drain.
    assert tier_weights(spec, TierSpec(100, 0, "failover", ("pc",))) == {}
    assert tier_weights(route("chat", {"pa": 10000, "pb": 0, "pc": 0}),
                        TierSpec(100, 0, "pinned", ("pb", "pc"))) == {}
    # A tier never widens the route: a pool the route does not list is not added.
    assert tier_weights(route("chat", {"pa": 10000}), LARGE) == {}


def test_each_tier_gets_an_entry_before_the_routes_own_with_an_exclusive_range() -> None:
    routes = entries(state(POOLS, tiered({"pa": 7500, "pb": 2500}, SMALL, LARGE)))
    chat = [e for e in routes if e["name"] == "chat"]
    assert [is_tier_entry(e) for e in chat] == [True, True, True, False]
    first, second, unknown, plain = chat
    # The cut is 8 % below the bound (100 // 1.08 = 92): an under-estimated prompt of 95
    # tokens goes to the larger tier's pool, never to a pool of 100.
    assert size_matcher(first) == {"name": HEADER, "range_match": {"start": 0, "end": 93}}
    assert size_matcher(second) == {"name": HEADER,
                                    "range_match": {"start": 93, "end": INT64_MAX}}
    assert size_matcher(unknown) == {"name": HEADER,
                                     "string_match": {"exact": PROMPT_TOKENS_UNKNOWN}}
    assert HEADER not in [h["name"] for h in plain["match"]["headers"]]
    # The same model, residency and latency matchers as the route's own entry, plus size.
    assert first["match"]["headers"][:-1] == plain["match"]["headers"]
    assert clusters(first) == {"pa": 7500, "pb": 2500}
    assert clusters(second) == clusters(unknown) == {"pb": 10000}
    # Read-back sees the route's own split only, not its tiers'.
    rendered = envoy_config.render(state(POOLS, tiered({"pa": 7500, "pb": 2500}, SMALL, LARGE)))
    assert held_weights(rendered.route_config, rendered.runtime_values) == {
        "chat": {"pa": 7500, "pb": 2500}}


def test_a_bounded_last_tier_takes_every_larger_prompt() -> None:
    routes = entries(state(POOLS, tiered({"pa": 9000, "pb": 1000},
                                         SMALL, TierSpec(1000, 100, "pinned", ("pb",)))))
    second = [e for e in routes if e["name"] == "chat"][1]
    assert size_matcher(second)["range_match"] == {"start": 93, "end": INT64_MAX}


def test_a_reject_tier_without_pools_answers_413_with_the_limit() -> None:
    routes = entries(state(POOLS, tiered({"pa": 10000}, SMALL, REJECT)))
    names = [e["name"] for e in routes]
    at = names.index("fleetctl:tier:chat:1")
    assert names[at + 1] == "fleetctl:tier:chat:unknown"
    assert names[at + 2] == "chat"
    # Below a tier that refuses, the bound is the bound (no margin): a prompt of 95 tokens
    # goes to the pool, which serves it, rather than to a 413.
    assert size_matcher(routes[at - 1])["range_match"] == {"start": 0, "end": 101}
    for entry in routes[at:at + 2]:
        answer = entry["direct_response"]
        assert answer["status"] == 413
        error = answer["body_format"]["json_format"]["error"]
        assert error["code"] == "context_length_exceeded"
        assert "at most 100 tokens" in error["message"]
        assert "above 100 tokens" in error["message"]


def test_tier_weights_are_runtime_keys_so_a_ramp_keeps_the_routes_version() -> None:
    before = envoy_config.render(state(POOLS, tiered({"pa": 9000, "pb": 1000}, SMALL, LARGE)))
    after = envoy_config.render(state(POOLS, tiered({"pa": 5000, "pb": 5000}, SMALL, LARGE)))
    assert before.routes_version == after.routes_version
    changed = {k for k in after.runtime if before.runtime.get(k) != after.runtime[k]}
    assert any(".tier0-" in key for key in changed)
    # The tier's keys are read by a loaded route (the adapter's runtime staging keeps them).
    prefixes = {wc["runtime_key_prefix"] for e in entries(
        state(POOLS, tiered({"pa": 5000, "pb": 5000}, SMALL, LARGE)))
        if (wc := e.get("route", {}).get("weighted_clusters"))}
    assert {key.rsplit(".", 1)[0] for key in after.runtime} <= prefixes


def test_a_route_without_weights_gets_no_tier_entries() -> None:
    routes = entries(state(POOLS, tiered({}, SMALL, REJECT)))
    assert [e["name"] for e in routes if "chat" in e["name"]] == ["chat"]


@pytest.mark.slow
def test_tiered_routes_pass_envoy_validate(tmp_path: Path) -> None:
    desired = replace(state(POOLS,
                            tiered({"pa": 7500, "pb": 2500}, SMALL, LARGE),
                            replace(tiered({"pb": 10000, "pc": 0},
                                           TierSpec(100, 0, "reject", ("pb", "pc")), REJECT,
                                           residency="EU"), key="chat-eu")),
                      mirror_url="http://127.0.0.1:9")
    ok, output = validate_config(envoy_config.render_validation_bootstrap(desired), tmp_path)
    assert ok, output
    assert "deprecated" not in output.lower()


# --- through a real Envoy ----------------------------------------------------------------

def send(gw: Gateway, body: dict[str, Any] | bytes, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{gw.url}/v1/chat/completions", content=content, timeout=30,
                      headers={"content-type": "application/json",
                               "x-request-id": f"req-{uuid.uuid4().hex}", **headers})


def chat(words: int) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": "word " * words}]}


def served(gw: Gateway, answer: httpx.Response) -> str:
    """The pool that answered, by Envoy's header and by the pools' own ground truth."""
    assert answer.status_code == 200, answer.text
    request_id = answer.request.headers["x-request-id"]
    truth = gw.served_by(request_id)[request_id]
    assert answer.headers["x-fleetctl-pool"] == truth
    return truth


def answered_by(answer: httpx.Response) -> str:
    """The pool Envoy sent a request to, for one the pool refuses itself (no ground truth
    is recorded for it): the answer came from upstream, so Envoy names the cluster."""
    assert "x-fleetctl-pool" in answer.headers, (answer.status_code, answer.text[:200])
    return answer.headers["x-fleetctl-pool"]


@pytest.mark.slow
def test_short_prompts_go_to_one_pool_and_long_ones_to_another(gateway: Gateway) -> None:
    tiers = (TierSpec(100, 0, "failover", ("pa",)), TierSpec(None, 100, "queue", ("pc",)))
    gateway.adapter.apply(state(gateway.pools("pa", "pc"),
                                tiered({"pa": 5000, "pc": 5000}, *tiers)))
    short, long = send(gateway, chat(10)), send(gateway, chat(1000))
    assert int(short.headers[HEADER]) <= 100 < int(long.headers[HEADER])
    assert {served(gateway, send(gateway, chat(10))) for _ in range(8)} == {"pa"}
    assert {served(gateway, send(gateway, chat(1000))) for _ in range(8)} == {"pc"}
    # Unknown (no prompt; a body over the scan limit): the most restrictive tier.
    no_prompt = send(gateway, {"model": MODEL, "max_tokens": 1})
    assert no_prompt.headers[HEADER] == PROMPT_TOKENS_UNKNOWN
    assert answered_by(no_prompt) == "pc"  # the pool's own 400: it has no messages
    huge = send(gateway, chat(PROMPT_SCAN_LIMIT_BYTES // 5 + 10))
    assert huge.headers[HEADER] == PROMPT_TOKENS_UNKNOWN
    assert answered_by(huge) == "pc"
    # A caller's larger stated size moves it up, never down.
    assert served(gateway, send(gateway, chat(10),
                                **{"x-fleetctl-prompt-tokens-stated": "5000"})) == "pc"


@pytest.mark.slow
def test_above_a_reject_tier_the_gateway_answers_413(gateway: Gateway) -> None:
    tiers = (TierSpec(100, 0, "failover", ("pa", "pc")), REJECT)
    gateway.adapter.apply(state(gateway.pools("pa", "pc"),
                                tiered({"pa": 10000, "pc": 0}, *tiers)))
    assert served(gateway, send(gateway, chat(10))) == "pa"
    refused = send(gateway, chat(1000))
    assert refused.status_code == 413, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "at most 100 tokens" in error["message"] and "chat" in error["message"]
    assert re.search(r"about \d{3,} tokens", error["message"]), error["message"]
    huge = send(gateway, chat(PROMPT_SCAN_LIMIT_BYTES // 5 + 10))
    assert huge.status_code == 413, huge.status_code
    assert "could not be read" in huge.json()["error"]["message"]


@pytest.mark.slow
def test_a_pinned_route_with_tiers_never_leaves_its_jurisdiction(gateway: Gateway) -> None:
    # pa is in the US: even listed as a tier's pool, the EU route does not send to it (the
    # route's own, residency-checked split does not list it; tiers only narrow).
    tiers = (TierSpec(100, 0, "failover", ("pb", "pa")), TierSpec(None, 100, "pinned",
                                                                 ("pc", "pa")))
    gateway.adapter.apply(state(gateway.pools("pa", "pb", "pc"),
                                tiered({"pb": 5000, "pc": 5000}, *tiers, residency="EU"),
                                replace(route("chat-us", {"pa": 10000}), key="chat-us")))
    eu = {"x-fleetctl-residency": "EU"}
    assert {served(gateway, send(gateway, chat(10), **eu)) for _ in range(6)} == {"pb"}
    assert {served(gateway, send(gateway, chat(1000), **eu)) for _ in range(6)} == {"pc"}
    assert answered_by(send(gateway, {"model": MODEL, "max_tokens": 1}, **eu)) == "pc"


@pytest.mark.slow
@pytest.mark.django_db
def test_the_access_log_names_each_requests_tier_and_telemetry_sums_the_live_share(
        gateway: Gateway) -> None:
    """%METADATA(ROUTE:fleetctl:tier)% as a real Envoy writes it: the index of the tier entry
    that routed the request, `unknown` for a prompt it could not size, nothing for a request
    the route's own entry took; followed into windows and summed per tier and pool."""
    from fleetctl.telemetry.follow import Aggregator, Follower
    from fleetctl.telemetry.selectors import route_tier_live
    from fleetctl.telemetry.services import windows_add
    from fleetctl.traffic.gateways.envoy.accesslog import parse_line
    from tests.traffic.accesslog import log_offset, read_records

    path = gateway.process.access_log_path
    assert path is not None
    tiers = (TierSpec(100, 0, "failover", ("pa", "pb")), TierSpec(None, 100, "queue", ("pc",)))
    gateway.adapter.apply(state(gateway.pools("pa", "pb", "pc"),
                                tiered({"pa": 4000, "pb": 4000, "pc": 2000}, *tiers)))
    since = log_offset(path)
    short = [served(gateway, send(gateway, chat(10))) for _ in range(6)]
    long = [served(gateway, send(gateway, chat(1000))) for _ in range(3)]
    assert set(long) == {"pc"} and set(short) <= {"pa", "pb"}
    assert answered_by(send(gateway, {"model": MODEL, "max_tokens": 1})) == "pc"  # unknown
    records = read_records(path, since, 10, parse_line)
    assert [r.tier for r in records] == ["0"] * 6 + ["1"] * 3 + ["unknown"]
    assert [r.pool for r in records] == [*short, *long, "pc"]
    assert {r.route for r in records} == {"chat"}

    aggregator = Aggregator(10)
    follower = Follower(gateway="test-gw", path=str(path), parse=parse_line, offset=since)
    wait_read = follower.poll(aggregator)
    assert wait_read >= 10
    windows_add(aggregator.take())
    live = route_tier_live("chat")["tiers"]
    assert set(live) == {"0", "1", "unknown"}
    assert live["0"]["requests"] == 6
    assert {p["pool"]: p["requests"] for p in live["0"]["pools"]} == {
        pool: short.count(pool) for pool in set(short)}
    assert sum(p["share"] for p in live["0"]["pools"]) == pytest.approx(1.0)
    assert live["1"] == {"requests": 3, "pools": [
        {"pool": "pc", "requests": 3, "share": 1.0, "percent": 100.0}]}
    assert live["unknown"]["pools"][0]["pool"] == "pc"
