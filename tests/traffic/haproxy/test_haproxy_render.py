"""The HAProxy config and weight arithmetic, without a running HAProxy (but `haproxy -c`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetctl.traffic.gateways.base import (
    AdapterError,
    DesiredState,
    GatewaySpec,
    PoolTarget,
    RouteSpec,
    adapter_for,
)
from fleetctl.traffic.gateways.haproxy.adapter import (
    HAProxyAdapter,
    LiveServer,
    _commands,
    with_weights,
)
from fleetctl.traffic.gateways.haproxy.render import HAProxySettings, render_config, shares
from tests.traffic.scenarios import route

POOLS = {
    "alpha": PoolTarget("alpha", ("http://127.0.0.1:9001",), "US"),
    "beta": PoolTarget("beta", ("http://127.0.0.1:9002", "http://127.0.0.1:9003"), "US"),
    "gamma": PoolTarget("gamma", ("https://gamma.example:8443",), "IN"),
}


def gateway(tmp_path: Path) -> GatewaySpec:
    return GatewaySpec(name="edge", kind="haproxy", admin_address=str(tmp_path / "admin.sock"),
                       options={"bind": "127.0.0.1:18080",
                                "config_path": str(tmp_path / "haproxy.cfg"),
                                "master_socket": str(tmp_path / "master.sock")})


def rendered(tmp_path: Path, *routes: RouteSpec) -> tuple[str, str, dict[str, dict[str, int]]]:
    result = render_config(DesiredState(routes=routes, pools=POOLS),
                           HAProxySettings.from_gateway(gateway(tmp_path)))
    return result.text, result.structure, result.targets


def test_the_adapter_is_registered_as_haproxy(tmp_path: Path) -> None:
    assert isinstance(adapter_for(gateway(tmp_path)), HAProxyAdapter)
    assert "256" in HAProxyAdapter.weight_resolution


def test_basis_points_become_weights_out_of_256_and_never_round_to_zero(tmp_path: Path) -> None:
    _, _, targets = rendered(tmp_path, route({"alpha": 7000, "beta": 3000}))
    # beta has two endpoints: its 30 % is split between them.
    assert targets["route-chat"] == {"alpha.0": 179, "beta.0": 38, "beta.1": 38, "gamma.0": 0}
    _, _, tiny = rendered(tmp_path, route({"alpha": 9999, "beta": 1}))
    assert tiny["route-chat"]["beta.0"] == 1 and tiny["route-chat"]["beta.1"] == 1
    assert tiny["route-chat"]["alpha.0"] == 256


def test_shares_are_reported_in_basis_points_of_the_backend() -> None:
    assert shares({"alpha.0": 179, "beta.0": 77}) == {"alpha": 6992, "beta": 3008}
    assert shares({"alpha.0": 0, "beta.0": 0}) == {}
    assert shares({"beta.0": 38, "beta.1": 38, "alpha.0": 0}) == {"beta": 10000}


def test_matches_compares_at_haproxy_resolution(tmp_path: Path) -> None:
    adapter = HAProxyAdapter(gateway(tmp_path))
    desired = DesiredState(routes=(route({"alpha": 7000, "beta": 3000}),), pools=POOLS)
    # 7000/3000 over 256 is 179 against 2 x 38: alpha holds 179/255 of the backend.
    assert adapter.matches(desired, {"chat": {"alpha": 7020, "beta": 2980}})
    assert not adapter.matches(desired, {"chat": {"alpha": 7000, "beta": 3000}})
    assert not adapter.matches(desired, {"chat": {"alpha": 10000}})


def test_weights_do_not_change_the_structure_but_routes_and_pools_do(tmp_path: Path) -> None:
    _, first, _ = rendered(tmp_path, route({"alpha": 7000, "beta": 3000}))
    _, reweighted, _ = rendered(tmp_path, route({"alpha": 0, "beta": 10000}, revision=2))
    _, emptied, _ = rendered(tmp_path, route({}, revision=3))
    _, added, _ = rendered(tmp_path, route({"alpha": 10000}),
                           route({"gamma": 10000}, key="chat-in", residency="IN"))
    assert first == reweighted == emptied
    assert added != first


def test_each_route_gets_acls_on_model_residency_and_latency_class(tmp_path: Path) -> None:
    text, _, _ = rendered(
        tmp_path, route({"alpha": 10000}),
        route({"beta": 10000}, key="chat-fast", latency_class="interactive"),
        route({"gamma": 10000}, key="chat-in", residency="IN"))
    uses = [line.strip() for line in text.splitlines() if "use_backend" in line]
    model = "{ var(txn.fleetctl_model) -m str llama-3.1-8b-instruct }"
    assert uses == [
        f"use_backend route-chat-fast if {model} {{ req.fhdr_cnt(x-fleetctl-residency) eq 0 }} "
        "{ req.fhdr(x-fleetctl-latency-class) -m str interactive }",
        f"use_backend route-chat if {model} {{ req.fhdr_cnt(x-fleetctl-residency) eq 0 }}",
        f"use_backend route-chat-in if {model} {{ req.fhdr(x-fleetctl-residency) -m str IN }}",
    ]
    assert "req.body,json_query('$.model')" in text
    assert "default_backend fleetctl.refuse" in text


def test_a_pinned_route_holds_only_pools_of_its_jurisdiction(tmp_path: Path) -> None:
    _, _, targets = rendered(tmp_path, route({"gamma": 10000}, key="chat-in", residency="IN"))
    assert set(targets["route-chat-in"]) == {"gamma.0"}


def test_weight_on_a_pool_abroad_is_refused_for_good(tmp_path: Path) -> None:
    with pytest.raises(AdapterError) as caught:
        rendered(tmp_path, route({"alpha": 10000}, key="chat-in", residency="IN"))
    assert caught.value.permanent


def test_a_base_url_with_a_path_or_a_bad_port_is_refused(tmp_path: Path) -> None:
    for url in ("http://127.0.0.1:9001/openai", "http://127.0.0.1:99999"):
        pools = {**POOLS, "alpha": PoolTarget("alpha", (url,), "US")}
        with pytest.raises(AdapterError) as caught:
            render_config(DesiredState(routes=(route({"alpha": 10000}),), pools=pools),
                          HAProxySettings.from_gateway(gateway(tmp_path)))
        assert caught.value.permanent


def test_the_rendered_config_passes_haproxy_check(tmp_path: Path) -> None:
    text, _, _ = rendered(
        tmp_path, route({"alpha": 7000, "beta": 3000}),
        route({"gamma": 10000}, key="chat-in", residency="IN"),
        route({}, key="empty"))
    path = tmp_path / "haproxy.cfg"
    path.write_text(text.replace("gamma.example", "127.0.0.1"))
    done = subprocess.run(["/usr/sbin/haproxy", "-c", "-f", str(path)], capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 0, done.stderr


def test_capacity_is_added_before_it_is_removed() -> None:
    ready = LiveServer("route-chat", "alpha.0", admin_state=0, weight=256)
    drained = LiveServer("route-chat", "beta.0", admin_state=0x08, weight=77)
    assert _commands("route-chat/alpha.0", ready, 0) == (
        [], ["set server route-chat/alpha.0 state drain"])
    assert _commands("route-chat/beta.0", drained, 256) == (
        ["set weight route-chat/beta.0 256", "set server route-chat/beta.0 state ready"], [])
    assert _commands("route-chat/alpha.0", ready, 100) == (
        [], ["set weight route-chat/alpha.0 100"])
    assert _commands("route-chat/alpha.0", ready, 256) == ([], [])


def test_the_state_file_for_a_reload_carries_the_desired_weights() -> None:
    dump = ("1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state "
            "srv_uweight srv_iweight rest\n"
            "3 route-chat 1 alpha.0 127.0.0.1 2 0 256 256 5\n"
            "3 route-chat 2 beta.0 127.0.0.1 2 8 77 77 5\n")
    patched = with_weights(dump, {"route-chat": {"alpha.0": 0, "beta.0": 200}})
    rows = patched.splitlines()
    assert rows[2].split()[6:8] == ["8", "0"]  # drained
    assert rows[3].split()[6:8] == ["0", "200"]  # ready again, at its new weight
