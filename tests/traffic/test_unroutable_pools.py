"""A pool a gateway cannot route to (e.g. a base URL with a path prefix): refused when it is
registered, and, when one is stored anyway (old data), left out of that gateway's config
with a warning so it never blocks a drain of anything else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.fleet.services import pool_health_record, pool_model_create, pool_update
from fleetctl.traffic.gateways.base import (
    DesiredState,
    GatewaySpec,
    PoolTarget,
    RouteSpec,
    renderable,
)
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
from fleetctl.traffic.gateways.envoy.render import COLLECTOR_CLUSTER
from fleetctl.traffic.gateways.haproxy import adapter as haproxy
from fleetctl.traffic.gateways.nginx import adapter as nginx
from fleetctl.traffic.gateways.nginx.adapter import NginxAdapter
from fleetctl.traffic.models import Drain, Gateway, GatewayPushAttempt
from fleetctl.traffic.push import gateway_reconcile
from fleetctl.traffic.services import gateway_create, route_create
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

MODEL = "llama-3.1-8b-instruct"
PATH_PROBLEM = ("cannot route to a base URL with a path (/openai): give the server's root URL "
                "(requests keep their /v1/... path)")


# --- what a gateway kind can hold of a desired state -----------------------------------------

def spec(key: str, weights: dict[str, int], residency: str = "") -> RouteSpec:
    return RouteSpec(key=key, model=MODEL, latency_class="", residency=residency, revision=1,
                     weights=weights)


def pools(**urls: str) -> dict[str, PoolTarget]:
    return {name: PoolTarget(name, (url,), "US") for name, url in urls.items()}


def test_a_left_out_pools_share_goes_to_the_routes_other_pools_with_weight_in_proportion():
    desired = DesiredState(routes=(spec("chat", {"a": 6000, "b": 1000, "bad": 3000, "c": 0}),),
                           pools=pools(a="http://a:1", b="http://b:1", c="http://c:1",
                                       bad="http://bad:1/openai"))
    fit = renderable(EnvoyAdapter, desired)
    assert fit.left_out == {"bad": PATH_PROBLEM}
    # c had no weight and gets none (it may not be cleared for live traffic).
    assert fit.desired.routes[0].weights == {"a": 8572, "b": 1428, "c": 0}
    assert set(fit.desired.pools) == {"a", "b", "c"}
    assert fit.warning == f"pool bad left out: this gateway {PATH_PROBLEM}"


def test_a_route_left_with_no_pool_fails_closed():
    desired = DesiredState(routes=(spec("chat-eu", {"bad": 10000, "idle": 0}, residency="EU"),),
                           pools=pools(bad="http://bad:1/openai", idle="http://idle:1"))
    assert renderable(EnvoyAdapter, desired).desired.routes[0].weights == {}


def test_a_state_with_nothing_left_out_is_handed_on_as_it_is():
    desired = DesiredState(routes=(spec("chat", {"a": 10000}),), pools=pools(a="http://a:1/v1"))
    assert renderable(EnvoyAdapter, desired).desired is desired


def test_what_is_left_out_depends_on_the_gateway_kind():
    desired = DesiredState(routes=(spec("chat", {"a": 5000, "tls": 5000}),),
                           pools=pools(a="http://a:1", tls="https://tls.example"))
    assert renderable(EnvoyAdapter, desired).left_out == {}
    assert renderable(NginxAdapter, desired).left_out == {
        "tls": "cannot route to 'https://tls.example': it proxies to http://host:port only"}


# --- refused when registered -----------------------------------------------------------------

VALID_POOL: dict[str, Any] = {
    "name": "mi300x-us-east", "runtime": "rocm", "accelerator": "MI300X", "region": "us-east",
    "base_urls": ["http://10.0.0.5:8000"], "max_context_tokens": 131072,
    "node_hourly_rate": "31.50",
}


@pytest.fixture
def edge(db: None, system: Any, tmp_path: Path) -> Gateway:
    return gateway_create(actor=system, name="edge-1", kind="envoy",
                          admin_address="http://127.0.0.1:9",
                          options={"config_dir": str(tmp_path)})


@pytest.mark.django_db
def test_registering_a_pool_with_a_path_prefix_is_refused_naming_the_gateway(
        client_for, region, edge):
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/pools/", {**VALID_POOL,
                                            "base_urls": ["http://10.0.0.5:8000/openai"]},
                         format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["fields"]["base_urls"] == [
        f"Gateway edge-1 (Envoy) {PATH_PROBLEM}."]
    assert not Pool.objects.exists()


@pytest.mark.django_db
def test_changing_a_pools_base_url_to_one_a_gateway_cannot_route_to_is_refused(
        client_for, make_pool, edge):
    make_pool(name="h200-a", base_urls=["http://10.0.0.7:8000"])
    lead = client_for("platform-lead")
    response = lead.patch("/api/v1/pools/h200-a/", {"base_urls": ["http://10.0.0.7:8000/openai"]},
                          format="json")
    assert response.status_code == 400
    assert "Gateway edge-1 (Envoy) cannot route to a base URL with a path (/openai)" in (
        response.json()["error"]["message"])
    assert Pool.objects.get(name="h200-a").base_urls == ["http://10.0.0.7:8000"]


@pytest.mark.django_db
def test_every_gateway_that_cannot_route_to_the_pool_is_named_by_kind(
        client_for, region, edge, system, tmp_path):
    gateway_create(actor=system, name="edge-2", kind="envoy", admin_address="http://127.0.0.1:9",
                   options={"config_dir": str(tmp_path)})
    gateway_create(actor=system, name="lb", kind="nginx", admin_address=str(tmp_path),
                   options={"listen": "127.0.0.1:9"})
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/pools/", {**VALID_POOL, "base_urls": [
        "https://pool.example/openai"]}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["base_urls"] == [
        f"Gateways edge-1, edge-2 (Envoy) {PATH_PROBLEM}.",
        "Gateway lb (nginx) cannot route to 'https://pool.example/openai': it proxies to "
        "http://host:port only.",
    ]


@pytest.mark.django_db
def test_a_base_url_ending_in_v1_is_the_servers_root_to_every_proxy(
        client_for, region, edge, system, tmp_path):
    # OpenAI clients write base URLs with /v1; every proxy forwards /v1/... unchanged, so the
    # pool is its host:port (before, HAProxy and nginx refused it as a path prefix).
    desired = DesiredState(routes=(spec("chat", {"a": 10000}),),
                           pools=pools(a="http://10.0.0.5:8000/v1"))
    haproxy_options = {"bind": "127.0.0.1:9", "config_path": str(tmp_path / "h.cfg"),
                       "master_socket": str(tmp_path / "m")}
    haproxy_cfg = haproxy.render_config(desired, haproxy.HAProxySettings.from_gateway(
        GatewaySpec("hx", "haproxy", str(tmp_path / "s"), haproxy_options))).text
    assert "server a.0 10.0.0.5:8000 weight 256" in haproxy_cfg
    nginx_conf = nginx.render_config(desired, nginx.NginxSettings.from_gateway(
        GatewaySpec("lb", "nginx", str(tmp_path), {"listen": "127.0.0.1:9"}))).text
    assert "server 10.0.0.5:8000 weight=10000;" in nginx_conf

    gateway_create(actor=system, name="lb", kind="nginx", admin_address=str(tmp_path),
                   options={"listen": "127.0.0.1:9"})
    gateway_create(actor=system, name="hx", kind="haproxy", admin_address=str(tmp_path / "s"),
                   options=haproxy_options)
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/pools/", {**VALID_POOL, "base_urls": [
        "http://10.0.0.5:8000/v1"]}, format="json")
    assert response.status_code == 201, response.json()


# --- contained when stored anyway, with a real Envoy -------------------------------------------

@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("unroutable-sims"), TEST_PROFILES,
                            dict.fromkeys(("primary", "cand", "late"), "quick"), models=[MODEL])
    yield sim
    sim.stop()


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[EnvoyProcess]:
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    yield process
    process.stop()


def _clusters(envoy: EnvoyProcess) -> set[str]:
    """The pools' clusters Envoy holds (not the shadow collector's, always there)."""
    answer = httpx.get(f"{envoy.admin_url}/clusters?format=json", timeout=5).json()
    return {cluster["name"] for cluster in answer.get("cluster_statuses", [])} - {
        COLLECTOR_CLUSTER}


@pytest.mark.slow
def test_a_bad_pool_stored_behind_the_registrys_back_never_blocks_a_drain(
        celery_worker, sims, envoy, make_pool, system, client_for):
    primary = make_pool(name="primary", base_urls=[sims.url("primary")])
    cand = make_pool(name="cand", base_urls=[sims.url("cand")])
    for pool in (primary, cand):
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = route_create(actor=system, name="llama", model_id=MODEL, primary_pool=primary,
                         weights={"primary": 50, "cand": 50}, reason="test")
    gateway = gateway_create(actor=system, name="edge-1", kind="envoy",
                             admin_address=envoy.admin_url,
                             options={"config_dir": str(envoy.workdir)}, routes=[route])
    wait_until(lambda: Gateway.objects.get(pk=gateway.pk).state == "in-sync",
               what="the first push")
    # Old data: a pool the API would refuse now, written straight to the database. It serves
    # the route's model, so every push lists it (at weight 0).
    late = Pool.objects.create(name="late", runtime="cuda", accelerator="H200",
                               region=primary.region, max_context_tokens=4096,
                               node_hourly_rate="1", base_urls=[f"{sims.url('late')}/openai"])
    PoolModel.objects.create(pool=late, model_id=MODEL, max_context_tokens=4096)

    answer = client_for("on-call").post("/api/v1/drains/", {"pool": "cand", "reason": "test"},
                                        format="json")

    assert answer.status_code == 202, answer.json()
    drain = Drain.objects.get(pk=answer.json()["id"])
    wait_until(lambda: Drain.objects.get(pk=drain.pk).status == "complete",
               what="the drain to complete")
    gateway.refresh_from_db()
    assert gateway.state == "in-sync"
    assert gateway.last_error == f"warning: pool late left out: this gateway {PATH_PROBLEM}"
    attempt = GatewayPushAttempt.objects.filter(push__revision__in=drain.revisions.all()).get()
    assert attempt.verified and f"pool late left out: this gateway {PATH_PROBLEM}" in (
        attempt.detail)
    assert _clusters(envoy) == {"primary", "cand"}
    client = openai.OpenAI(base_url=f"{envoy.listen_url}/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.headers["x-fleetctl-pool"] == "primary"

    # Corrected, the pool is rendered by the next push (the correction itself pushes).
    pool_update(actor=system, pool=late, base_urls=[sims.url("late")])
    wait_until(lambda: _clusters(envoy) == {"primary", "cand", "late"},
               what="the corrected pool to be rendered")
    wait_until(lambda: Gateway.objects.get(pk=gateway.pk).last_error == "",
               what="the warning to clear")
    assert Gateway.objects.get(pk=gateway.pk).state == "in-sync"
    assert not gateway_reconcile(gateway=gateway)  # nothing left to repair
