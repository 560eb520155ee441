"""InferencePool backends (the Gateway API Inference Extension's v1 API, group
inference.networking.k8s.io) in the Gateway API kind: the option that names them and its
refusals, the backendRefs rendered, and weights, drains, mirrors and residency read back
from a fake API server that knows the InferencePool schema (see fake_apiserver: no
Kubernetes API server can run here, so the fake's controller stands in for a Gateway
implementation with Inference Extension support)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest

from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import AdapterError, DesiredState, GatewaySpec
from fleetctl.traffic.gateways.gateway_api.adapter import GatewayApiAdapter
from fleetctl.traffic.gateways.gateway_api.options import MIRROR_TO_POOL
from fleetctl.traffic.gateways.gateway_api.render import GatewayApiSettings, render_routes
from fleetctl.traffic.gateways.schema import OptionsError

from .conftest import TOKEN
from .fake_apiserver import FakeApiServer, inference_pool_problems
from .test_gateway_api_render import POOLS, route

GROUP = "inference.networking.k8s.io"
POOLS_PATH = f"/apis/{GROUP}/v1/namespaces/llm/inferencepools"
BACKENDS = {"h200-us": {"kind": "InferencePool", "name": "vllm-h200"},
            "mi300x-us": {"kind": "InferencePool", "group": GROUP, "name": "vllm-mi300x"},
            "h200-in": {"kind": "InferencePool", "name": "vllm-h200-in"}}


def inference_pool(name: str, **spec: Any) -> dict[str, Any]:
    """An InferencePool as the model servers' deployment (e.g. the Inference Extension's
    Helm chart) would create it."""
    return {"apiVersion": f"{GROUP}/v1", "kind": "InferencePool", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "targetPorts": [{"number": 8000}],
                     "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}},
                     **spec}}


def adapter(url: str, **options: Any) -> GatewayApiAdapter:
    opts: dict[str, Any] = {"namespace": "llm", "gateway_name": "public", "token": TOKEN,
                            "services": BACKENDS, "status_wait_s": 0}
    return GatewayApiAdapter(GatewaySpec(name="edge", kind="gateway-api", admin_address=url,
                                         options={**opts, **options}))


def desired(*routes: Any, **fields: Any) -> DesiredState:
    return DesiredState(routes=routes or (route("chat", {"h200-us": 7000, "mi300x-us": 3000}),),
                        pools=POOLS, **fields)


@pytest.fixture
def pools(api: FakeApiServer) -> FakeApiServer:
    for backend in BACKENDS.values():
        api.put_inference_pool("llm", inference_pool(backend["name"]))
    return api


def refs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["rules"][0].get("backendRefs", [])


# --- the option ----------------------------------------------------------------------------------

def test_a_pools_backend_may_be_an_inference_pool_rendered_without_a_port() -> None:
    settings = GatewayApiSettings.from_gateway(GatewaySpec(
        name="edge", kind="gateway-api", admin_address="https://k8s:6443",
        options={"namespace": "llm", "services": {
            "h200-us": {"kind": "InferencePool", "name": "vllm-h200"},
            "mi300x-us": {"kind": "InferencePool", "name": "vllm-mi300x",
                          "namespace": "amd"}}}))
    chat = render_routes(desired(route("chat", {"h200-us": 7000, "mi300x-us": 3000,
                                                "h200-in": 0})), settings)[1]
    assert refs(chat) == [
        {"group": GROUP, "kind": "InferencePool", "name": "vllm-h200", "weight": 7000},
        {"group": GROUP, "kind": "InferencePool", "name": "vllm-mi300x", "namespace": "amd",
         "weight": 3000}]


def test_services_and_inference_pools_mix_in_one_route() -> None:
    settings = GatewayApiSettings.from_gateway(GatewaySpec(
        name="edge", kind="gateway-api", admin_address="https://k8s:6443",
        options={"services": {"h200-us": {"kind": "InferencePool", "name": "vllm-h200"},
                              "mi300x-us": {"name": "vllm-mi300x", "port": 8080}}}))
    chat = render_routes(desired(), settings)[1]
    assert refs(chat) == [
        {"group": GROUP, "kind": "InferencePool", "name": "vllm-h200", "weight": 7000},
        {"group": "", "kind": "Service", "name": "vllm-mi300x", "port": 8080, "weight": 3000}]


@pytest.mark.parametrize(("backend", "message"), [
    ({"kind": "InferencePool", "group": "inference.networking.x-k8s.io", "name": "p"},
     "options.services ['h200-us'].group must be 'inference.networking.k8s.io' for kind "
     "InferencePool, not 'inference.networking.x-k8s.io' (v1alpha2's group: "
     "fleetctl speaks the v1 API, inference.networking.k8s.io)"),
    ({"kind": "InferencePool", "group": "", "name": "p"},
     "options.services ['h200-us'].group must be 'inference.networking.k8s.io' for kind "
     "InferencePool, not ''"),
    ({"kind": "Service", "group": GROUP, "name": "p"},
     "options.services ['h200-us'].group must be '' for kind Service, not "
     "'inference.networking.k8s.io'"),
    ({"kind": "InferencePools", "name": "p"},
     'options.services [\'h200-us\'].kind must be "Service" or "InferencePool", not '
     "'InferencePools'"),
    ({"kind": "InferencePool", "name": "Vllm_H200"},
     "options.services ['h200-us'].name must be an InferencePool name (a DNS subdomain: "
     "lower-case letters, digits, '-' and '.'), not 'Vllm_H200'"),
    ({"kind": "InferencePool", "name": ""},
     "options.services ['h200-us'].name must be an InferencePool name"),
    ({"kind": "InferencePool", "name": "p", "port": 8000},
     "options.services ['h200-us'].port: an InferencePool backendRef takes no port (the "
     "InferencePool's spec.targetPorts name the model servers' ports)"),
    ({"kind": "InferencePool", "name": "p", "targetPorts": [8000]},
     "options.services ['h200-us'].targetPorts is not a field of a backend; its fields are "
     "name, port, namespace, group, kind"),
    ({"kind": "InferencePool", "name": "p", "namespace": ""},
     "options.services ['h200-us'].namespace must be a namespace name"),
])
def test_a_bad_backend_is_refused_naming_its_field(backend: dict[str, Any],
                                                   message: str) -> None:
    with pytest.raises(OptionsError) as caught:
        registry.get("gateway-api").parse_options({"services": {"h200-us": backend}})
    assert caught.value.permanent
    assert caught.value.problems[0].startswith(message), caught.value.problems


def test_one_backend_named_for_two_pools_is_refused() -> None:
    with pytest.raises(OptionsError, match=r"\['b'\] names the InferencePool p that \['a'\] "
                                           "names too: a read-back could not tell their "
                                           "weights apart"):
        registry.get("gateway-api").parse_options({"services": {
            "a": {"kind": "InferencePool", "name": "p"},
            "b": {"kind": "InferencePool", "name": "p"}}})
    # a Service and an InferencePool of one name are two backends
    registry.get("gateway-api").parse_options({"services": {
        "a": {"kind": "InferencePool", "name": "p"}, "b": "p"}})


@pytest.mark.django_db
def test_the_api_refuses_a_bad_backend_and_stores_nothing(client_for) -> None:
    from fleetctl.traffic.models import Gateway

    lead = client_for("platform-lead")
    answer = lead.post("/api/v1/gateways/", {
        "name": "k8s", "kind": "gateway-api", "admin_address": "https://k8s:6443",
        "options": {"services": {"h200-us": {"kind": "InferencePool", "group":
                                             "inference.networking.x-k8s.io", "name": "p"}}}},
        format="json")
    assert answer.status_code == 400
    assert ("['h200-us'].group must be 'inference.networking.k8s.io' for kind InferencePool"
            in " ".join(answer.json()["error"]["fields"]["options"]))
    assert not Gateway.objects.filter(name="k8s").exists()
    good = lead.post("/api/v1/gateways/", {
        "name": "k8s", "kind": "gateway-api", "admin_address": "https://k8s:6443",
        "options": {"services": {"h200-us": {"kind": "InferencePool", "name": "p"}}}},
        format="json")
    assert good.status_code == 201, good.json()


@pytest.mark.parametrize("value", ["InferencePool/vllm-shadow", "inferencepools/shadow:9911",
                                   "inference.networking.k8s.io/InferencePool/shadow:1"])
def test_a_mirror_to_an_inference_pool_is_refused_with_the_reason(value: str) -> None:
    with pytest.raises(OptionsError) as caught:
        registry.get("gateway-api").parse_options({"shadow_collector_service": value})
    assert caught.value.problems == [f"options.shadow_collector_service {MIRROR_TO_POOL}"]
    # a Service whose name merely contains the word is a Service
    options = registry.get("gateway-api").parse_options(
        {"shadow_collector_service": "inferencepool-shadow:9911"})
    assert options.shadow_collector_service == "inferencepool-shadow:9911"


def test_a_push_to_a_missing_inference_pool_fails_for_good_naming_it(
        api: FakeApiServer) -> None:
    from fleetctl.traffic import push as engine
    from fleetctl.traffic.models import Gateway, GatewayPush

    api.put_inference_pool("llm", inference_pool("vllm-h200"))
    push = GatewayPush(gateway=Gateway(name="edge", kind="gateway-api", admin_address=api.url,
                                       options=adapter(api.url).gateway.options))
    refused = engine._push_io(push, desired(), frozenset())
    assert refused.result is not None and refused.result.applied
    assert not refused.verified and refused.permanent
    assert ('ResolvedRefs is False, reason BackendNotFound: inferencepools '
            '"llm/vllm-mi300x" not found') in refused.error
    api.put_inference_pool("llm", inference_pool("vllm-mi300x"))
    assert engine._push_io(push, desired(), frozenset()).verified


# --- the fake API server knows the InferencePool schema ------------------------------------------

@pytest.mark.parametrize(("change", "problem"), [
    ({"selector": {}}, "spec.selector.matchLabels: Required value"),
    ({"targetPorts": []}, "spec.targetPorts: Required value"),
    ({"targetPorts": [{"number": n} for n in range(8000, 8009)]},
     "spec.targetPorts: Too many: 9: must have at most 8 items"),
    ({"targetPorts": [{"number": 8000}, {"number": 8000}]},
     "spec.targetPorts: Invalid value: port numbers must be unique"),
    ({"targetPorts": [{"number": 70000}]}, "spec.targetPorts[0].number: Invalid value: 70000"),
    ({"appProtocol": "grpc"}, "spec.appProtocol: Unsupported value: 'grpc'"),
    ({"endpointPickerRef": {"name": "epp"}},
     "spec.endpointPickerRef: Invalid value: port is required when kind is 'Service'"),
    ({"endpointPickerRef": {"port": {"number": 9002}}},
     "spec.endpointPickerRef.name: Required value"),
    ({"endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "Open"}},
     "spec.endpointPickerRef.failureMode: Unsupported value: 'Open'"),
])
def test_the_fake_refuses_an_inference_pool_its_crd_would(api: FakeApiServer,
                                                           change: dict[str, Any],
                                                           problem: str) -> None:
    bad = inference_pool("vllm-h200")
    bad["spec"].update(change)
    answer = httpx.patch(f"{api.url}{POOLS_PATH}/vllm-h200", params={"fieldManager": "fleetctl"},
                         content=json.dumps(bad),
                         headers={"Authorization": f"Bearer {TOKEN}",
                                  "Content-Type": "application/apply-patch+yaml"})
    assert answer.status_code == 422
    assert answer.json()["reason"] == "Invalid"
    assert answer.json()["message"].startswith(
        f'InferencePool.{GROUP} "vllm-h200" is invalid: ')
    assert problem in answer.json()["message"]
    assert api.state.pools == {}


def test_the_fake_stores_a_valid_inference_pool_and_lists_it(api: FakeApiServer) -> None:
    body = inference_pool("vllm-h200", appProtocol="kubernetes.io/h2c")
    assert inference_pool_problems(body) == []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    created = httpx.patch(f"{api.url}{POOLS_PATH}/vllm-h200", params={"fieldManager": "fleetctl"},
                          content=json.dumps(body),
                          headers={**headers, "Content-Type": "application/apply-patch+yaml"})
    assert created.status_code == 201
    assert created.json()["metadata"]["generation"] == 1
    listed = httpx.get(f"{api.url}{POOLS_PATH}", headers=headers).json()
    assert listed["kind"] == "InferencePoolList"
    assert [item["metadata"]["name"] for item in listed["items"]] == ["vllm-h200"]
    with pytest.raises(ValueError, match=r"spec.targetPorts: Required value"):
        api.put_inference_pool("llm", inference_pool("other", targetPorts=None))


def test_the_fake_refuses_a_service_ref_without_a_port(api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    route_object = render_routes(desired(), gateway.settings)[1]
    route_object["spec"]["rules"][0]["backendRefs"].append(
        {"group": "", "kind": "Service", "name": "no-port", "weight": 1})
    answer = httpx.patch(
        f"{api.url}/apis/gateway.networking.k8s.io/v1/namespaces/llm/httproutes/"
        "fleetctl-edge-chat", params={"fieldManager": "fleetctl"},
        content=json.dumps(route_object),
        headers={"Authorization": f"Bearer {TOKEN}",
                 "Content-Type": "application/apply-patch+yaml"})
    assert answer.status_code == 422
    assert "backendRefs[2]: Invalid value: Must have port for Service reference" in (
        answer.json()["message"])


# --- weights, drains, residency and mirrors over InferencePools ----------------------------------

def test_weights_over_inference_pools_read_back_by_pool(pools: FakeApiServer) -> None:
    gateway = adapter(pools.url)
    state = desired(route("chat", {"h200-us": 7000, "mi300x-us": 3000}),
                    route("chat-in", {"h200-in": 10000}, residency="IN"),
                    route("chat-eu", {}, residency="EU"))
    gateway.apply(state)
    held = gateway.read_back()
    assert held == {"chat": {"h200-us": 7000, "mi300x-us": 3000},
                    "chat-in": {"h200-in": 10000}, "chat-eu": {}}
    assert gateway.matches(state, held)
    stored = pools.stored("llm")["fleetctl-edge-chat"]
    assert {c["type"]: c["status"] for c in stored["status"]["parents"][0]["conditions"]} == {
        "Accepted": "True", "ResolvedRefs": "True"}


def test_a_drain_leaves_the_inference_pool_out_and_reads_back_so(pools: FakeApiServer) -> None:
    gateway = adapter(pools.url)
    gateway.apply(desired())
    drained = desired(route("chat", {"h200-us": 10000, "mi300x-us": 0}))
    gateway.apply(drained)
    held = gateway.read_back()
    assert held == {"chat": {"h200-us": 10000}}
    assert gateway.matches(drained, held)
    assert [r["name"] for r in refs(pools.stored("llm")["fleetctl-edge-chat"])] == ["vllm-h200"]


def test_weight_on_an_inference_pool_abroad_is_refused_before_anything_is_stored(
        pools: FakeApiServer) -> None:
    gateway = adapter(pools.url)
    with pytest.raises(AdapterError, match="pinned to IN; pool h200-us is in US") as caught:
        gateway.apply(desired(route("chat-in", {"h200-us": 5000, "h200-in": 5000},
                                    residency="IN")))
    assert caught.value.permanent
    assert pools.stored("llm") == {}


def test_a_missing_inference_pool_is_a_permanent_error_until_it_exists(
        api: FakeApiServer) -> None:
    api.put_inference_pool("llm", inference_pool("vllm-h200"))
    gateway = adapter(api.url)
    gateway.apply(desired())
    with pytest.raises(AdapterError) as caught:
        gateway.read_back()
    assert caught.value.permanent
    assert ("HTTPRoute llm/fleetctl-edge-chat generation 1 refused by "
            f"{api.controller.name} for parent Gateway llm/public: ResolvedRefs is False, "
            'reason BackendNotFound: inferencepools "llm/vllm-mi300x" not found'
            ) in str(caught.value)
    api.put_inference_pool("llm", inference_pool("vllm-mi300x"))  # the deployment catches up
    assert gateway.matches(desired(), gateway.read_back())
    api.delete_inference_pool("llm", "vllm-mi300x")  # and goes away again
    with pytest.raises(AdapterError, match="BackendNotFound"):
        gateway.read_back()


def test_a_route_over_inference_pools_mirrors_to_the_collector_service(
        pools: FakeApiServer) -> None:
    gateway = adapter(pools.url, shadow_collector_service="shadow-collector:9911")
    base = desired()
    state = replace(base, mirror_url="http://127.0.0.1:9911",
                    routes=(replace(base.routes[0], mirror_bp=1250),))
    gateway.apply(state)
    assert gateway.read_back() == {"chat": {"h200-us": 7000, "mi300x-us": 3000}}
    assert gateway.read_back_mirror() == {"chat": 1250}
    rule = pools.stored("llm")["fleetctl-edge-chat"]["spec"]["rules"][0]
    assert rule["filters"][1]["requestMirror"]["backendRef"] == {
        "group": "", "kind": "Service", "name": "shadow-collector", "port": 9911}


def test_the_fake_controller_does_not_resolve_an_inference_pool_mirror(
        pools: FakeApiServer) -> None:
    """What a Gateway implementation that refuses InferencePool mirrors says (fleetctl never
    renders one: the option refuses it first)."""
    gateway = adapter(pools.url, require_status=False)
    gateway.apply(desired())
    stored = pools.stored("llm")["fleetctl-edge-chat"]
    stored["spec"]["rules"][0]["filters"] = [{"type": "RequestMirror", "requestMirror": {
        "backendRef": {"group": GROUP, "kind": "InferencePool", "name": "vllm-h200"}}}]
    pools.delete_inference_pool("llm", "vllm-h200-in")  # the controller reconciles every route
    conditions = {c["type"]: c for c in stored["status"]["parents"][0]["conditions"]}
    assert conditions["ResolvedRefs"]["status"] == "False"
    assert conditions["ResolvedRefs"]["reason"] == "InvalidKind"
