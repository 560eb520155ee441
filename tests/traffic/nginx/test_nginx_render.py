"""The nginx config the adapter renders and parses back, checked by `nginx -t` only."""

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
from fleetctl.traffic.gateways.nginx.adapter import NginxAdapter, _decode
from fleetctl.traffic.gateways.nginx.render import NginxSettings, parse_config, render_config
from tests.traffic.scenarios import route

POOLS = {
    "alpha": PoolTarget("alpha", ("http://127.0.0.1:9001",), "US"),
    "beta": PoolTarget("beta", ("http://127.0.0.1:9002", "http://127.0.0.1:9003",
                                "http://127.0.0.1:9004"), "US"),
    "gamma": PoolTarget("gamma", ("http://127.0.0.1:9005",), "IN"),
}


def settings(tmp_path: Path, **options: object) -> NginxSettings:
    return NginxSettings.from_gateway(GatewaySpec(
        name="edge", kind="nginx", admin_address=str(tmp_path),
        options={"listen": "127.0.0.1:18081", "user": "", **options}))


def render(tmp_path: Path, *routes: RouteSpec, **options: object) -> str:
    return render_config(DesiredState(routes=routes, pools=POOLS),
                         settings(tmp_path, **options)).text


def test_the_adapter_is_registered_as_nginx(tmp_path: Path) -> None:
    spec = GatewaySpec(name="edge", kind="nginx", admin_address=str(tmp_path),
                       options={"listen": "127.0.0.1:18081"})
    assert isinstance(adapter_for(spec), NginxAdapter)


def test_weights_are_basis_points_kept_exact_across_endpoints(tmp_path: Path) -> None:
    text = render(tmp_path, route({"alpha": 7001, "beta": 2999, "gamma": 0}))
    # beta has 3 endpoints: every weight is scaled by 3 so beta's share stays 2999 bp.
    assert "server 127.0.0.1:9001 weight=21003;  # pool=alpha" in text
    assert text.count("weight=2999;  # pool=beta") == 3
    assert "# pool=gamma" not in text  # weight 0: left out of the upstream
    assert parse_config(text).routes == {"chat": {"alpha": 7001, "beta": 2999}}


def test_read_back_parsing_keeps_empty_routes_and_every_pools_addresses(
        tmp_path: Path) -> None:
    live = parse_config(render(tmp_path, route({"alpha": 10000}),
                               route({}, key="chat-in", residency="IN")))
    assert live.routes == {"chat": {"alpha": 10000}, "chat-in": {}}
    assert live.addresses["gamma"] == {"127.0.0.1:9005"}
    assert len(live.version) == 16


def test_the_version_changes_with_the_weights(tmp_path: Path) -> None:
    one = render_config(DesiredState(routes=(route({"alpha": 10000}),), pools=POOLS),
                        settings(tmp_path))
    two = render_config(DesiredState(routes=(route({"beta": 10000}),), pools=POOLS),
                        settings(tmp_path))
    assert one.version != two.version
    assert f'return 200 "{one.version}\\n"' in one.text


def test_the_route_map_tries_latency_classes_first_and_fails_closed(tmp_path: Path) -> None:
    text = render(tmp_path, route({"alpha": 10000}),
                  route({"beta": 10000}, key="chat-fast", latency_class="interactive"),
                  route({"gamma": 10000}, key="chat-in", residency="IN"),
                  route({}, key="chat-eu", residency="EU"))
    start = text.index("$fleetctl_route {")
    block = text[start:text.index("}", start)].splitlines()[1:]
    entries = [line.strip() for line in block if line.strip()]
    assert entries == [
        'default "!unknown";',
        '"llama-3.1-8b-instruct||interactive" "route-chat-fast";',
        '"~\\|.*\\|.*\\|" "!bad";',
        '"~^\\|" "!nomodel";',
        '"~^llama\\-3\\.1\\-8b\\-instruct\\|\\|[^|]*$" "route-chat";',
        '"~^llama\\-3\\.1\\-8b\\-instruct\\|EU\\|[^|]*$" "!empty";',
        '"~^llama\\-3\\.1\\-8b\\-instruct\\|IN\\|[^|]*$" "route-chat-in";',
        '"~^[^|]*\\|[^|]+\\|" "!residency";',
    ]


def test_weight_on_a_pool_abroad_or_over_https_is_refused_for_good(tmp_path: Path) -> None:
    with pytest.raises(AdapterError) as abroad:
        render(tmp_path, route({"alpha": 10000}, key="chat-in", residency="IN"))
    assert abroad.value.permanent
    pools = {**POOLS, "alpha": PoolTarget("alpha", ("https://a.example",), "US")}
    with pytest.raises(AdapterError) as tls:
        render_config(DesiredState(routes=(route({"alpha": 10000}),), pools=pools),
                      settings(tmp_path))
    assert tls.value.permanent


def test_bad_options_are_refused_for_good(tmp_path: Path) -> None:
    for options in ({"listen": "8080"}, {"model_source": "query"}):
        with pytest.raises(AdapterError) as caught:
            settings(tmp_path, **options)
        assert caught.value.permanent


@pytest.mark.parametrize("model_source", ["body", "header"])
def test_the_rendered_config_passes_nginx_t(tmp_path: Path, model_source: str) -> None:
    text = render(tmp_path, route({"alpha": 7000, "beta": 3000}),
                  route({"gamma": 10000}, key="chat-in", residency="IN"),
                  route({}, key="empty", latency_class="batch"), model_source=model_source)
    path = tmp_path / "check.conf"
    path.write_text(text)
    (tmp_path / "tmp").mkdir()
    done = subprocess.run(["/usr/sbin/nginx", "-t", "-q", "-p", str(tmp_path), "-c", str(path),
                           "-e", "stderr"], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr


def test_proc_net_tcp_addresses_are_decoded() -> None:
    assert _decode("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _decode("00000000000000000000000001000000:0050") == ("::1", 80)
    assert _decode("0000000000000000FFFF00000100007F:0050") == ("127.0.0.1", 80)
