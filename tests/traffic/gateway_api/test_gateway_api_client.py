"""The Gateway API adapter's calls against a fake API server on loopback (see fake_apiserver:
no Kubernetes API server can run here): server-side apply, read-back, auth, TLS, errors. What
every gateway kind does is in tests/traffic/contract/."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl.traffic.gateways.base import AdapterError, DesiredState, GatewaySpec
from fleetctl.traffic.gateways.gateway_api.adapter import GatewayApiAdapter
from fleetctl.traffic.gateways.gateway_api.render import render_routes

from .conftest import TOKEN
from .fake_apiserver import FakeApiServer
from .test_gateway_api_render import POOLS, route

ROUTES_PATH = "/apis/gateway.networking.k8s.io/v1/namespaces/llm/httproutes"


def adapter(url: str, **options: Any) -> GatewayApiAdapter:
    opts: dict[str, Any] = {"namespace": "llm", "gateway_name": "public", "token": TOKEN,
                            "services": {"h200-us": {"name": "vllm-h200", "port": 8080}}}
    return GatewayApiAdapter(GatewaySpec(name="edge", kind="gateway-api", admin_address=url,
                                         options={**opts, **options}))


def desired(*routes: Any) -> DesiredState:
    return DesiredState(routes=routes or (route("chat", {"h200-us": 7000, "mi300x-us": 3000}),),
                        pools=POOLS)


def test_apply_server_side_applies_each_httproute_with_the_bearer_token(
        api: FakeApiServer) -> None:
    state = desired()
    result = adapter(api.url).apply(state)
    assert result.applied and result.method == "api"
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert [r.path for r in patches] == [f"{ROUTES_PATH}/fleetctl-edge-residency-guard",
                                         f"{ROUTES_PATH}/fleetctl-edge-chat"]
    for request in patches:
        assert request.query == {"fieldManager": ["fleetctl"], "force": ["true"]}
        assert request.headers["content-type"] == "application/apply-patch+yaml"
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
    sent = [yaml.safe_load(r.body) for r in patches]
    assert sent == render_routes(state, adapter(api.url).settings)


def test_read_back_returns_the_weights_the_api_server_holds(api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    state = desired(route("chat", {"h200-us": 7000, "mi300x-us": 3000}),
                    route("chat-in", {"h200-in": 10000}, residency="IN"),
                    route("chat-eu", {}, residency="EU"))
    gateway.apply(state)
    held = gateway.read_back()
    assert held == {"chat": {"h200-us": 7000, "mi300x-us": 3000},
                    "chat-in": {"h200-in": 10000}, "chat-eu": {}}
    assert gateway.matches(state, held)
    listing = [r for r in api.requests if r.method == "GET"][-1]
    assert listing.query["labelSelector"] == [
        "app.kubernetes.io/managed-by=fleetctl,fleetctl.io/gateway=edge"]


def test_routes_no_longer_desired_are_deleted(api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    gateway.apply(desired(route("chat", {"h200-us": 10000}), route("old", {"h200-us": 10000})))
    gateway.apply(desired(route("chat", {"h200-us": 10000})))
    assert set(api.stored("llm")) == {"fleetctl-edge-residency-guard", "fleetctl-edge-chat"}
    assert gateway.read_back() == {"chat": {"h200-us": 10000}}


def test_objects_of_other_managers_and_gateways_are_left_alone(api: FakeApiServer) -> None:
    adapter(api.url).apply(desired())
    other = GatewayApiAdapter(GatewaySpec(name="other", kind="gateway-api",
                                          admin_address=api.url,
                                          options={"namespace": "llm", "token": TOKEN}))
    other.apply(desired(route("batch", {"mi300x-us": 10000})))
    assert "fleetctl-edge-chat" in api.stored("llm")
    assert other.read_back() == {"batch": {"mi300x-us": 10000}}


def test_matches_fails_when_the_residency_guard_is_missing(api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    state = desired()
    gateway.apply(state)
    api.state.objects.pop(("llm", "fleetctl-edge-residency-guard"))
    assert not gateway.matches(state, gateway.read_back())
    gateway.apply(state)
    assert gateway.matches(state, gateway.read_back())


def test_the_token_file_is_read_at_each_call(api: FakeApiServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("stale\n")
    gateway = adapter(api.url, token=None, token_file=str(token_file))
    with pytest.raises(AdapterError) as caught:
        gateway.apply(desired())
    assert caught.value.permanent and "401" in str(caught.value)
    token_file.write_text(TOKEN + "\n")  # rotated
    assert gateway.apply(desired()).applied


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422])
def test_a_4xx_answer_is_a_permanent_error(api: FakeApiServer, status: int) -> None:
    api.state.fail_next.append((status, "Invalid"))
    with pytest.raises(AdapterError) as caught:
        adapter(api.url).apply(desired())
    assert caught.value.permanent
    assert f"answered {status}: injected {status}" in str(caught.value)


@pytest.mark.parametrize("status", [429, 500, 503])
def test_429_and_5xx_answers_are_retryable(api: FakeApiServer, status: int) -> None:
    api.state.fail_next.append((status, "ServiceUnavailable"))
    with pytest.raises(AdapterError) as caught:
        adapter(api.url).read_back()
    assert not caught.value.permanent


def test_an_api_server_that_hangs_times_out_as_configured(api: FakeApiServer) -> None:
    api.state.delay_s = 8
    started = time.monotonic()
    with pytest.raises(AdapterError) as caught:
        adapter(api.url, timeout_s=2.5).read_back()
    elapsed = time.monotonic() - started
    assert not caught.value.permanent and "timed out" in str(caught.value)
    # The configured 2.5 s, once: not the 2 s default (a floor load cannot lower), and not
    # a second attempt or a wait for the server (with 2 s of room for a loaded machine).
    assert 2.4 <= elapsed < 4.5


# --- TLS -----------------------------------------------------------------------------------------

def _certificates(directory: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    paths = {name: directory / name for name in
             ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt", "ext.cnf",
              "other.key", "other.crt")}
    paths["ext.cnf"].write_text("subjectAltName=IP:127.0.0.1\n")
    run = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", paths["ca.key"],
         "-out", paths["ca.crt"], "-days", "1", "-subj", "/CN=fleetctl-test-ca"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", paths["server.key"],
         "-out", paths["server.csr"], "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", paths["server.csr"], "-CA", paths["ca.crt"], "-CAkey",
         paths["ca.key"], "-CAcreateserial", "-out", paths["server.crt"], "-days", "1",
         "-extfile", paths["ext.cnf"]],
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", paths["other.key"],
         "-out", paths["other.crt"], "-days", "1", "-subj", "/CN=someone-else"],
    ]
    for args in run:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True,
                       timeout=60)
    return paths


def test_the_api_server_is_verified_against_the_ca_bundle(tmp_path: Path) -> None:
    certs = _certificates(tmp_path)
    server = FakeApiServer(token=TOKEN, tls=(certs["server.crt"], certs["server.key"])).start()
    try:
        trusted = adapter(server.url, ca_file=str(certs["ca.crt"]))
        trusted.apply(desired())
        assert trusted.read_back() == {"chat": {"h200-us": 7000, "mi300x-us": 3000}}
        with pytest.raises(AdapterError) as caught:
            adapter(server.url, ca_file=str(certs["other.crt"])).read_back()
        assert caught.value.permanent and "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    finally:
        server.stop()
