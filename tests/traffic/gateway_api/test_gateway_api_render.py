"""The HTTPRoutes the Gateway API adapter renders: their structure, the CRD's limits, and —
through a reference matcher that follows the spec's precedence rules — where each request
would go, so residency is shown to fail closed."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from fleetctl.traffic.gateways.base import (
    AdapterError,
    DesiredState,
    GatewaySpec,
    PoolTarget,
    RouteSpec,
    adapter_for,
)
from fleetctl.traffic.gateways.gateway_api.adapter import GatewayApiAdapter
from fleetctl.traffic.gateways.gateway_api.options import METHODS
from fleetctl.traffic.gateways.gateway_api.render import GatewayApiSettings, render_routes

MODEL = "llama-3.1-8b-instruct"
POOLS = {
    "h200-us": PoolTarget("h200-us", ("http://10.0.0.1:8000",), "US"),
    "mi300x-us": PoolTarget("mi300x-us", ("http://10.0.0.2:8000",), "US"),
    "h200-in": PoolTarget("h200-in", ("http://10.1.0.1:8000",), "IN"),
}


def route(key: str, weights: dict[str, int], *, residency: str = "", latency: str = "",
          model: str = MODEL) -> RouteSpec:
    return RouteSpec(key=key, model=model, latency_class=latency, residency=residency,
                     revision=3, weights=weights)


def settings(**options: Any) -> GatewayApiSettings:
    return GatewayApiSettings.from_gateway(GatewaySpec(
        name="edge", kind="gateway-api", admin_address="https://k8s.example:6443",
        options={"namespace": "llm", "gateway_name": "public", "gateway_namespace": "infra",
                 "services": {"h200-us": {"name": "vllm-h200", "port": 8080}}, **options}))


def render(*routes: RouteSpec, **options: Any) -> list[dict[str, Any]]:
    return render_routes(DesiredState(routes=routes, pools=POOLS), settings(**options))


def test_the_adapter_is_registered_as_gateway_api() -> None:
    spec = GatewaySpec(name="edge", kind="gateway-api", admin_address="https://k8s:6443")
    assert isinstance(adapter_for(spec), GatewayApiAdapter)


def test_one_httproute_per_route_after_a_residency_guard() -> None:
    objects = render(route("chat", {"h200-us": 10000}),
                     route("chat-in", {"h200-in": 10000}, residency="IN"))
    assert [o["metadata"]["name"] for o in objects] == [
        "fleetctl-edge-residency-guard", "fleetctl-edge-chat", "fleetctl-edge-chat-in"]
    for obj in objects:
        assert obj["apiVersion"] == "gateway.networking.k8s.io/v1"
        assert obj["kind"] == "HTTPRoute"
        assert obj["metadata"]["namespace"] == "llm"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "fleetctl"
        assert obj["metadata"]["labels"]["fleetctl.io/gateway"] == "edge"
        assert obj["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io",
                                              "kind": "Gateway", "name": "public",
                                              "namespace": "infra"}]


def test_an_unpinned_route_matches_the_model_header_on_each_path_with_no_method() -> None:
    chat = render(route("chat", {"h200-us": 7000, "mi300x-us": 3000}))[1]
    assert chat["metadata"]["annotations"]["fleetctl.io/route"] == "chat"
    assert chat["metadata"]["annotations"]["fleetctl.io/revision"] == "3"
    (rule,) = chat["spec"]["rules"]
    assert [m["path"] for m in rule["matches"]] == [
        {"type": "Exact", "value": "/v1/chat/completions"},
        {"type": "Exact", "value": "/v1/completions"},
        {"type": "Exact", "value": "/v1/embeddings"}]
    for match in rule["matches"]:
        assert "method" not in match
        assert match["headers"] == [{"type": "Exact", "name": "x-fleetctl-model",
                                     "value": MODEL}]


def test_backend_refs_carry_basis_points_to_each_pools_service() -> None:
    chat = render(route("chat", {"h200-us": 7000, "mi300x-us": 3000, "h200-in": 0}))[1]
    assert chat["spec"]["rules"][0]["backendRefs"] == [
        {"group": "", "kind": "Service", "name": "vllm-h200", "port": 8080, "weight": 7000},
        {"group": "", "kind": "Service", "name": "mi300x-us", "port": 8000, "weight": 3000}]


def test_a_pinned_route_also_matches_residency_and_post() -> None:
    pinned = render(route("chat-in", {"h200-in": 10000}, residency="IN",
                          latency="interactive"))[1]
    for match in pinned["spec"]["rules"][0]["matches"]:
        assert match["method"] == "POST"
        assert match["headers"] == [
            {"type": "Exact", "name": "x-fleetctl-model", "value": MODEL},
            {"type": "Exact", "name": "x-fleetctl-residency", "value": "IN"},
            {"type": "Exact", "name": "x-fleetctl-latency-class", "value": "interactive"}]


def test_an_empty_route_has_a_rule_without_backend_refs() -> None:
    empty = render(route("chat-in", {}, residency="IN"))[1]
    (rule,) = empty["spec"]["rules"]
    assert "backendRefs" not in rule and "filters" not in rule
    assert rule["matches"]


def test_the_guard_matches_any_residency_value_on_every_method_and_path() -> None:
    guard = render()[0]
    assert guard["metadata"]["labels"]["fleetctl.io/role"] == "residency-guard"
    matches = [m for rule in guard["spec"]["rules"] for m in rule["matches"]]
    assert {(m["path"]["value"], m["method"]) for m in matches} == set(
        itertools.product(("/v1/chat/completions", "/v1/completions", "/v1/embeddings"),
                          METHODS))
    for rule in guard["spec"]["rules"]:
        assert "backendRefs" not in rule
    assert all(m["headers"] == [{"type": "RegularExpression", "name": "x-fleetctl-residency",
                                 "value": ".*"}] for m in matches)


def test_weight_on_a_pool_abroad_is_refused_for_good() -> None:
    with pytest.raises(AdapterError) as caught:
        render(route("chat-in", {"h200-us": 10000}, residency="IN"))
    assert caught.value.permanent


def test_the_crd_limits_hold() -> None:
    objects = render(route("chat", {"h200-us": 5000, "mi300x-us": 5000}),
                     paths=[f"/v1/p{n}" for n in range(14)])
    for obj in objects:
        rules = obj["spec"]["rules"]
        assert 1 <= len(rules) <= 16
        assert all(len(rule["matches"]) <= 64 for rule in rules)
        assert sum(len(rule["matches"]) for rule in rules) <= 128
        assert all(len(rule.get("backendRefs", [])) <= 16 for rule in rules)
        assert all(0 <= ref["weight"] <= 1_000_000
                   for rule in rules for ref in rule.get("backendRefs", []))
        assert len(obj["metadata"]["name"]) <= 253
    with pytest.raises(AdapterError):
        settings(paths=[f"/v1/p{n}" for n in range(15)])


# --- where requests go, by the spec's precedence rules -----------------------------------------

def _match(match: dict[str, Any], path: str, method: str, headers: dict[str, str]) -> bool:
    if match["path"]["type"] != "Exact" or match["path"]["value"] != path:
        return False
    if "method" in match and match["method"] != method:
        return False
    for header in match.get("headers", []):
        value = headers.get(header["name"].lower())
        if value is None:
            return False
        if header["type"] == "Exact" and value != header["value"]:
            return False
        if header["type"] == "RegularExpression" and not re.fullmatch(header["value"], value):
            return False
    return True


def destination(objects: list[dict[str, Any]], path: str, method: str,
                headers: dict[str, str]) -> tuple[str, list[str]]:
    """(HTTPRoute name or "404", services it sends to). Precedence (all paths here are Exact):
    method match, then number of header matches, then the oldest route (list order here),
    then rule order."""
    best: tuple[Any, ...] | None = None
    for age, obj in enumerate(objects):
        for index, rule in enumerate(obj["spec"]["rules"]):
            for match in rule["matches"]:
                if _match(match, path, method, headers):
                    key = ("method" in match, len(match.get("headers", [])), -age, -index)
                    if best is None or key > best[0]:
                        best = (key, obj, rule)
    if best is None:
        return "404", []
    return best[1]["metadata"]["name"], [r["name"] for r in best[2].get("backendRefs", [])]


ROUTES = (
    route("chat", {"h200-us": 7000, "mi300x-us": 3000}),
    route("chat-fast", {"mi300x-us": 10000}, latency="interactive"),
    route("chat-in", {"h200-in": 10000}, residency="IN"),
    route("chat-in-fast", {"h200-in": 10000}, residency="IN", latency="interactive"),
    route("chat-eu", {}, residency="EU"),
)


@pytest.mark.parametrize(("method", "headers", "expected"), [
    ("POST", {}, "chat"),
    ("POST", {"lat": "interactive"}, "chat-fast"),
    ("POST", {"lat": "batch"}, "chat"),
    ("POST", {"res": "IN"}, "chat-in"),
    ("POST", {"res": "IN", "lat": "interactive"}, "chat-in-fast"),
    ("POST", {"res": "IN", "lat": "batch"}, "chat-in"),
    ("POST", {"res": "US"}, "residency-guard"),
    ("POST", {"res": "US", "lat": "interactive"}, "residency-guard"),
    ("POST", {"res": ""}, "residency-guard"),
    ("POST", {"res": "EU"}, "chat-eu"),
    ("POST", {"res": "IN", "model": "other-model"}, "residency-guard"),
    ("POST", {"model": "other-model"}, "404"),
    ("GET", {"res": "IN"}, "residency-guard"),
    ("POST", {"res": "IN", "model": None}, "residency-guard"),
])
def test_each_request_reaches_its_route_or_an_error(
        method: str, headers: dict[str, str | None], expected: str) -> None:
    objects = render(*ROUTES)
    sent = {"x-fleetctl-model": MODEL}
    names = {"res": "x-fleetctl-residency", "lat": "x-fleetctl-latency-class",
             "model": "x-fleetctl-model"}
    for short, value in headers.items():
        if value is None:
            sent.pop(names[short], None)
        else:
            sent[names[short]] = value
    # Whatever order the objects were created in, the outcome is the same.
    outcomes = {destination(order, "/v1/chat/completions", method, sent)[0]
                for order in (objects, objects[1:] + objects[:1], objects[::-1])}
    assert outcomes == {expected if expected == "404" else f"fleetctl-edge-{expected}"}


def test_a_request_naming_a_jurisdiction_only_ever_reaches_pools_there() -> None:
    objects = render(*ROUTES)
    jurisdiction_of = {"vllm-h200": "US", "mi300x-us": "US", "h200-in": "IN"}
    for res, lat, model, method in itertools.product(
            ("IN", "US", "EU", "", "in"), ("", "interactive", "batch"), (MODEL, "other"),
            ("POST", "GET", "PUT")):
        headers = {"x-fleetctl-model": model, "x-fleetctl-residency": res}
        if lat:
            headers["x-fleetctl-latency-class"] = lat
        for order in (objects, objects[::-1]):
            name, services = destination(order, "/v1/completions", method, headers)
            assert name != "404"  # it is answered by a route or the guard, never ignored
            assert all(jurisdiction_of[s] == res for s in services), (res, name, services)
