"""Rendering Envoy configuration: what Envoy accepts, and what the routes mean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl.demo.envoy_process import validate_config
from fleetctl.traffic.gateways.base import AdapterError, DesiredState, GatewaySpec, PoolTarget
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter, held_weights
from fleetctl.traffic.gateways.envoy.runtime import write_runtime_file

from .conftest import MODEL, OTHER_MODEL, route, state

POOLS = {
    "pa": PoolTarget("pa", ("http://127.0.0.1:8101",), "US"),
    "pb": PoolTarget("pb", ("http://127.0.0.1:8102/v1", "http://127.0.0.2:8102"), "EU"),
    "pc": PoolTarget("pc", ("https://pool-c.example.com", "https://pool-c2.example.com:8443"),
                     "EU"),
}


def rich_state() -> DesiredState:
    """Every kind of route at once: split, pinned, pinned and empty, latency class, zero."""
    return state(
        POOLS,
        route("chat", {"pa": 8000, "pb": 2000}),
        route("chat-eu", {"pb": 10000, "pc": 0}, residency="EU"),
        route("chat-fast", {"pa": 10000}, latency_class="interactive"),
        route("qwen-eu", {}, model=OTHER_MODEL, residency="EU"),
        route("qwen", {"pc": 5000, "pa": 5000}, model=OTHER_MODEL),
    )


def route_names(desired: DesiredState) -> list[str]:
    config = envoy_config.render(desired).route_config
    return [r["name"] for r in config["virtual_hosts"][0]["routes"]]


# --- Envoy accepts what we render ------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("desired", [rich_state(), state({})], ids=["rich", "empty"])
def test_rendered_clusters_and_routes_pass_envoy_validate(desired: DesiredState,
                                                          tmp_path: Path) -> None:
    ok, output = validate_config(envoy_config.render_validation_bootstrap(desired), tmp_path)
    assert ok, output
    assert "deprecated" not in output.lower()
    # Envoy only warns about retry_on tokens it does not know, and ignores them.
    assert "unknown retry_on" not in output.lower()


@pytest.mark.slow
def test_the_bootstrap_and_unconfigured_files_pass_envoy_validate(tmp_path: Path) -> None:
    for name, text in envoy_config.unconfigured_files().items():
        (tmp_path / name).write_text(text)
    write_runtime_file(tmp_path, envoy_config.runtime_file({}))  # its directory must exist
    bootstrap = envoy_config.render_bootstrap(config_dir=tmp_path, listen_port=10000,
                                              admin_port=9901,
                                              access_log_path=tmp_path / "access.log")
    ok, output = validate_config(bootstrap, tmp_path)
    assert ok, output
    assert "deprecated" not in output.lower()


@pytest.mark.slow
def test_the_routes_file_checks_out_against_the_unconfigured_route_config(
        tmp_path: Path) -> None:
    # The unconfigured routes are part of no DesiredState; validate them as static routes.
    bootstrap = envoy_config.render_validation_bootstrap(state({}))
    listener = bootstrap["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    unconfigured = envoy_config.render_unconfigured_route_config()
    hcm["route_config"] = {k: v for k, v in unconfigured.items() if k != "@type"}
    ok, output = validate_config(bootstrap, tmp_path)
    assert ok, output


# --- what the routes mean --------------------------------------------------------------------

def test_pinned_routes_come_before_the_residency_refusal_and_unpinned_ones_after() -> None:
    names = route_names(rich_state())
    llama = [n for n in names if n.startswith("chat") or n.endswith(MODEL)]
    assert llama == ["fleetctl:model:" + MODEL, "chat-eu", "fleetctl:residency:" + MODEL,
                     "chat-fast", "chat", "fleetctl:no-route:" + MODEL]
    assert names[-3:] == ["fleetctl:unknown-model", "fleetctl:missing-model",
                          "fleetctl:unknown-url"]


def test_an_unpinned_route_requires_the_residency_header_to_be_absent() -> None:
    config = envoy_config.render(rich_state()).route_config
    chat = next(r for r in config["virtual_hosts"][0]["routes"] if r["name"] == "chat")
    residency = [h for h in chat["match"]["headers"] if h["name"] == "x-fleetctl-residency"]
    assert residency == [{"name": "x-fleetctl-residency", "present_match": True,
                          "invert_match": True}]


def test_an_empty_route_answers_503_and_never_names_a_cluster() -> None:
    config = envoy_config.render(rich_state()).route_config
    empty = next(r for r in config["virtual_hosts"][0]["routes"] if r["name"] == "qwen-eu")
    assert "route" not in empty
    assert empty["direct_response"]["status"] == 503


def test_a_weights_only_change_keeps_the_routes_version_and_the_runtime_prefix() -> None:
    before = envoy_config.render(state(POOLS, route("chat", {"pa": 8000, "pb": 2000})))
    after = envoy_config.render(state(POOLS, route("chat", {"pa": 0, "pb": 10000})))
    assert before.routes_version == after.routes_version
    assert before.runtime.keys() == after.runtime.keys()
    assert sorted(after.runtime.values()) == [0, 10000]


def test_a_new_shape_of_a_route_gets_new_runtime_keys() -> None:
    before = envoy_config.render(state(POOLS, route("chat", {"pa": 10000})))
    after = envoy_config.render(state(POOLS, route("chat", {"pa": 5000, "pb": 5000})))
    assert before.routes_version != after.routes_version
    assert not set(before.runtime) & set(after.runtime)


def test_clusters_are_static_for_addresses_and_dns_with_tls_for_names() -> None:
    clusters = envoy_config.render(rich_state()).clusters
    assert clusters["pa"]["type"] == "STATIC"
    assert len(clusters["pb"]["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    assert clusters["pc"]["type"] == "STRICT_DNS"
    assert clusters["pc"]["transport_socket"]["typed_config"]["sni"] == "pool-c.example.com"


@pytest.mark.parametrize(("desired", "message"), [
    (state(POOLS, route("chat", {"nope": 10000})), "pool 'nope' is not declared"),
    (state(POOLS, route("a", {"pa": 10000}), route("b", {"pb": 10000})),
     "routes a and b match the same requests"),
    (state({"pa": PoolTarget("pa", ("http://127.0.0.1:8101/openai",), "US")},
           route("chat", {"pa": 10000})), r"cannot route to a base URL with a path \(/openai\)"),
    (state(POOLS, route("chat", {"pa": 10000}, model="bad model%")), "model 'bad model%'"),
    (state(POOLS, route("chat", {"pa": 10000}, residency="E U")), "residency 'E U'"),
    (state({"pa": PoolTarget("pa", (), "US")}, route("chat", {"pa": 10000})),
     "has weight but no base URL"),
], ids=["unknown-pool", "same-match", "url-prefix", "model-chars", "residency", "no-url"])
def test_a_state_envoy_cannot_hold_is_refused(desired: DesiredState, message: str) -> None:
    with pytest.raises(envoy_config.ConfigError, match=message):
        envoy_config.render(desired)


def test_a_bad_state_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    for name, text in envoy_config.unconfigured_files().items():
        (tmp_path / name).write_text(text)
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    adapter = EnvoyAdapter(GatewaySpec("gw", "envoy", "http://127.0.0.1:9",
                                       {"config_dir": str(tmp_path)}))
    with pytest.raises(AdapterError) as caught:
        adapter.apply(state(POOLS, route("chat", {"nope": 10000})))
    assert caught.value.permanent
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before


def test_read_back_prefers_runtime_weights_over_file_defaults() -> None:
    rendered = envoy_config.render(rich_state())
    config: dict[str, Any] = json.loads(json.dumps(rendered.route_config))
    assert held_weights(config, {}) == rich_state().held_weights()
    prefix = next(k for k in rendered.runtime if ".chat." in k).rsplit(".", 1)[0]
    runtime = {f"{prefix}.pa": "0", f"{prefix}.pb": "10000"}
    assert held_weights(config, runtime)["chat"] == {"pb": 10000}
    assert held_weights(config, {f"{prefix}.pa": "junk"})["chat"] == {"pa": 8000, "pb": 2000}


def test_the_lua_script_uses_the_header_names_the_routes_match() -> None:
    desired = DesiredState(routes=(), pools={}, model_header="x-my-model",
                           residency_header="x-my-residency", latency_class_header="x-my-class")
    lua = envoy_config.routing_lua(desired)
    assert 'local MODEL_HEADER = "x-my-model"' in lua
    assert '{"x-my-residency", "x-my-class"}' in lua
    assert "@" not in lua.replace("/@+-]", "")  # every placeholder filled in
