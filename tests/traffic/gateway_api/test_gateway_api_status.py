"""A Gateway API route counts as held only once the Gateway implementation accepted its
current generation (HTTPRoute `status.parents[]`), against the fake API server playing the
controller: lagging, refusing, other controllers' entries, `require_status: false`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from fleetctl.traffic.gateways.base import AdapterError, GatewaySpec
from fleetctl.traffic.gateways.gateway_api.adapter import GatewayApiAdapter
from fleetctl.traffic.gateways.gateway_api.render import GatewayApiSettings

from .fake_apiserver import FakeApiServer
from .test_gateway_api_client import TOKEN, desired
from .test_gateway_api_client import adapter as client_adapter
from .test_gateway_api_render import route

CHAT = "fleetctl-edge-chat"
GUARD = "fleetctl-edge-residency-guard"
OURS = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public",
        "namespace": "llm"}


def adapter(url: str, **options: Any) -> GatewayApiAdapter:
    """Without the wait for the controller unless a test asks for it: these tests look at
    what a read-back says while the controller lags, not at how long it waits."""
    return client_adapter(url, **{"status_wait_s": 0, **options})


def split(h200: int) -> Any:
    return desired(route("chat", {"h200-us": h200, "mi300x-us": 10000 - h200}))


def meta(api: FakeApiServer, name: str = CHAT) -> dict[str, Any]:
    return api.stored("llm")[name]["metadata"]


def not_held(gateway: GatewayApiAdapter) -> AdapterError:
    with pytest.raises(AdapterError) as caught:
        gateway.read_back()
    return caught.value


def entry(parent: dict[str, Any], controller: str, status: str, reason: str = "Refused",
          generation: int = 99) -> dict[str, Any]:
    return {"parentRef": parent, "controllerName": controller, "conditions": [
        {"type": "Accepted", "status": status, "reason": reason,
         "message": f"{controller} says {status}", "observedGeneration": generation}]}


# --- the fake behaves like an API server with a controller ---------------------------------------

def test_the_fake_bumps_generation_only_when_the_spec_changes(api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    first = dict(meta(api))
    assert first["generation"] == 1
    gateway.apply(split(7000))  # same spec
    assert meta(api)["generation"] == 1
    relabelled = desired(route("chat", {"h200-us": 7000, "mi300x-us": 3000}, model="other"))
    gateway.apply(relabelled)  # the model annotation changes, and the header match: spec too
    assert meta(api)["generation"] == 2
    gateway.apply(split(6000))
    assert meta(api)["generation"] == 3
    before = meta(api)["resourceVersion"]
    api.reject()  # a status write: a new resourceVersion, the same generation
    assert meta(api)["generation"] == 3 and meta(api)["resourceVersion"] != before
    # the default controller wrote status for the generation, for our parentRef only
    api.catch_up()
    parents = api.stored("llm")[CHAT]["status"]["parents"]
    assert [(p["parentRef"], p["controllerName"]) for p in parents] == [
        (OURS, api.controller.name)]
    assert {c["type"]: (c["status"], c["observedGeneration"])
            for c in parents[0]["conditions"]} == {"Accepted": ("True", 3),
                                                    "ResolvedRefs": ("True", 3)}


def test_an_annotation_only_change_keeps_the_generation_and_the_status(
        api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    api.lag()
    # only the revision annotation moves
    state = desired(replace(route("chat", {"h200-us": 7000, "mi300x-us": 3000}), revision=4))
    gateway.apply(state)
    assert meta(api)["annotations"]["fleetctl.io/revision"] == "4"
    assert meta(api)["generation"] == 1
    assert gateway.matches(state, gateway.read_back())  # generation 1 was already accepted


def test_an_apply_neither_sets_nor_clears_status(api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    api.lag()
    gateway.apply(split(6000))
    assert meta(api)["generation"] == 2
    accepted = api.stored("llm")[CHAT]["status"]["parents"][0]["conditions"][0]
    assert accepted["observedGeneration"] == 1  # the old status stays until the controller


# --- read_back waits for the controller -----------------------------------------------------------

def test_verified_once_the_controller_observed_the_generation(api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    state = split(7000)
    gateway.apply(state)
    assert meta(api)["generation"] == 1
    held = gateway.read_back()
    assert held == {"chat": {"h200-us": 7000, "mi300x-us": 3000}}
    assert gateway.matches(state, held)


def test_a_new_route_without_status_is_not_held_until_the_controller_catches_up(
        api: FakeApiServer) -> None:
    api.lag()
    gateway = adapter(api.url)
    state = split(7000)
    gateway.apply(state)
    error = not_held(gateway)
    assert not error.permanent
    assert ("controller has not yet observed generation 1 of HTTPRoute llm/fleetctl-edge-chat"
            in str(error))
    assert "no status for parent Gateway llm/public yet" in str(error)
    api.catch_up()
    assert gateway.matches(state, gateway.read_back())


def test_a_lagging_controller_names_the_generation_then_the_same_adapter_verifies(
        api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    assert gateway.matches(split(7000), gateway.read_back())
    api.lag()
    state = split(2000)
    gateway.apply(state)
    error = not_held(gateway)
    assert not error.permanent
    assert str(error) == (
        "controller has not yet observed generation 2 of HTTPRoute llm/fleetctl-edge-chat "
        f"({api.controller.name}, parent Gateway llm/public: Accepted is for generation 1)")
    api.catch_up()
    held = gateway.read_back()
    assert held == {"chat": {"h200-us": 2000, "mi300x-us": 8000}}
    assert gateway.matches(state, held)


def test_the_residency_guard_must_be_accepted_too(api: FakeApiServer) -> None:
    api.lag(only={GUARD})
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    error = not_held(gateway)
    assert "generation 1 of HTTPRoute llm/fleetctl-edge-residency-guard" in str(error)
    assert CHAT not in str(error)


def test_a_condition_without_observed_generation_does_not_count(api: FakeApiServer) -> None:
    api.lag()
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    for name in (CHAT, GUARD):
        parent = entry(OURS, "example.net/old-controller", "True", "Accepted")
        del parent["conditions"][0]["observedGeneration"]
        api.add_parent_status("llm", name, parent)
    assert "Accepted is for generation (unset)" in str(not_held(gateway))


def test_accepted_unknown_is_not_held_and_retryable(api: FakeApiServer) -> None:
    api.lag()
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    for name in (CHAT, GUARD):
        api.add_parent_status("llm", name, entry(OURS, "example.net/ctl", "Unknown", "Pending",
                                                 generation=1))
    error = not_held(gateway)
    assert not error.permanent
    assert "not yet accepted by example.net/ctl" in str(error)
    assert "Accepted is Unknown, reason Pending" in str(error)


# --- refusals -------------------------------------------------------------------------------------

def test_a_route_refused_by_the_listeners_is_a_permanent_error_naming_why(
        api: FakeApiServer) -> None:
    api.reject("Accepted", "NotAllowedByListeners",
               "no listener of Gateway llm/public allows HTTPRoutes from namespace llm",
               only={CHAT})
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    error = not_held(gateway)
    assert error.permanent
    assert str(error) == (
        f"HTTPRoute llm/fleetctl-edge-chat generation 1 refused by {api.controller.name} for "
        "parent Gateway llm/public: Accepted is False, reason NotAllowedByListeners: no "
        "listener of Gateway llm/public allows HTTPRoutes from namespace llm")


def test_a_backend_not_found_is_a_permanent_error_until_it_resolves(
        api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    api.reject("ResolvedRefs", "BackendNotFound", 'service "llm/vllm-h200" not found',
               only={CHAT})  # the Service went away: the same generation, now refused
    error = not_held(gateway)
    assert error.permanent
    assert ("ResolvedRefs is False, reason BackendNotFound: "
            'service "llm/vllm-h200" not found') in str(error)
    assert "generation 1 refused by" in str(error)
    api.catch_up()  # the Service is back
    assert gateway.matches(split(7000), gateway.read_back())


def test_a_refusal_of_an_older_generation_is_only_lag(api: FakeApiServer) -> None:
    api.reject("ResolvedRefs", "BackendNotFound", "gone", only={CHAT})
    gateway = adapter(api.url)
    gateway.apply(split(7000))
    api.lag()
    gateway.apply(split(5000))  # generation 2; the refusal is of generation 1
    error = not_held(gateway)
    assert not error.permanent
    assert "has not yet observed generation 2" in str(error)


# --- whose status counts --------------------------------------------------------------------------

def test_entries_for_other_parents_are_ignored(api: FakeApiServer) -> None:
    gateway = adapter(api.url)
    state = split(7000)
    gateway.apply(state)
    for other in ({**OURS, "name": "internal"}, {**OURS, "namespace": "infra"},
                  {**OURS, "sectionName": "https"}, {**OURS, "kind": "Service"}):
        api.add_parent_status("llm", CHAT, entry(other, api.controller.name, "False",
                                                 "NotAllowedByListeners", generation=1))
    assert gateway.matches(state, gateway.read_back())
    # and an entry for another parent alone does not make a route held
    api.lag()
    gateway.apply(split(6000))
    api.add_parent_status("llm", CHAT, entry({**OURS, "name": "internal"}, api.controller.name,
                                             "True", "Accepted", generation=2))
    assert "has not yet observed generation 2" in str(not_held(gateway))


def test_parent_refs_written_with_defaults_omitted_still_match(api: FakeApiServer) -> None:
    api.lag()
    gateway = adapter(api.url)
    state = split(7000)
    gateway.apply(state)
    for name in (CHAT, GUARD):  # group, kind and namespace left to their defaults
        api.add_parent_status("llm", name, entry({"name": "public"}, "example.net/ctl", "True",
                                                 "Accepted", generation=1))
    assert gateway.matches(state, gateway.read_back())


def test_with_controller_name_other_controllers_entries_are_ignored(
        api: FakeApiServer) -> None:
    gateway = adapter(api.url, controller_name=api.controller.name)
    state = split(7000)
    gateway.apply(state)
    api.add_parent_status("llm", CHAT, entry(OURS, "example.net/someone-else", "False",
                                             "NotAllowedByListeners", generation=1))
    assert gateway.matches(state, gateway.read_back())
    # without controller_name, every controller's entry for our parent has to accept
    error = not_held(adapter(api.url))
    assert error.permanent and "refused by example.net/someone-else" in str(error)
    # and another controller's acceptance alone does not count
    api.lag()
    gateway.apply(split(6000))
    for name in (CHAT, GUARD):
        api.add_parent_status("llm", name, entry(OURS, "example.net/someone-else", "True",
                                                 "Accepted", generation=2))
    error = not_held(gateway)
    assert "has not yet observed generation 2" in str(error)


def test_with_controller_name_a_route_it_never_wrote_status_for_is_not_held(
        api: FakeApiServer) -> None:
    gateway = adapter(api.url, controller_name="gateway.envoyproxy.io/gatewayclass-controller")
    gateway.apply(split(7000))
    error = not_held(gateway)
    assert ("(no status by gateway.envoyproxy.io/gatewayclass-controller for parent Gateway "
            "llm/public yet)") in str(error)


def test_section_name_is_part_of_our_parent_ref(api: FakeApiServer) -> None:
    gateway = adapter(api.url, section_name="https")
    state = split(7000)
    gateway.apply(state)  # the fake controller answers for the parentRef as rendered
    assert gateway.matches(state, gateway.read_back())
    parents = api.stored("llm")[CHAT]["status"]["parents"]
    assert parents[0]["parentRef"]["sectionName"] == "https"


# --- require_status ------------------------------------------------------------------------------

def test_require_status_false_skips_the_check(api: FakeApiServer) -> None:
    api.lag()
    gateway = adapter(api.url, require_status=False)
    state = split(7000)
    gateway.apply(state)
    assert "status" not in api.stored("llm")[CHAT]
    assert gateway.matches(state, gateway.read_back())
    api.reject("ResolvedRefs", "BackendNotFound", "gone")
    assert gateway.matches(state, gateway.read_back())


@pytest.mark.parametrize("value", ["false", 0, None, "yes"])
def test_require_status_must_be_a_boolean(value: Any) -> None:
    with pytest.raises(AdapterError) as caught:
        GatewayApiSettings.from_gateway(GatewaySpec(
            name="edge", kind="gateway-api", admin_address="https://k8s:6443",
            options={"require_status": value}))
    assert caught.value.permanent and "require_status must be true or false" in str(
        caught.value)


@pytest.mark.parametrize("value", ["", 7, ["a"]])
def test_controller_name_must_be_a_non_empty_string(value: Any) -> None:
    with pytest.raises(AdapterError) as caught:
        GatewayApiSettings.from_gateway(GatewaySpec(
            name="edge", kind="gateway-api", admin_address="https://k8s:6443",
            options={"controller_name": value}))
    assert caught.value.permanent


def test_the_default_requires_status() -> None:
    settings = GatewayApiSettings.from_gateway(GatewaySpec(
        name="edge", kind="gateway-api", admin_address="https://k8s:6443"))
    assert settings.require_status is True and settings.controller_name is None


# --- what a push attempt records ------------------------------------------------------------------

def test_a_push_attempt_records_why_the_route_is_not_held(api: FakeApiServer) -> None:
    from fleetctl.traffic import push as engine
    from fleetctl.traffic.models import Gateway, GatewayPush

    options = {"namespace": "llm", "gateway_name": "public", "token": TOKEN,
               "services": {"h200-us": {"name": "vllm-h200", "port": 8080}},
               "status_wait_s": 0}
    push = GatewayPush(gateway=Gateway(name="edge", kind="gateway-api",
                                       admin_address=api.url, options=options))
    api.lag()
    lagging = engine._push_io(push, split(7000), frozenset())
    assert lagging.result is not None and lagging.result.applied
    assert not lagging.verified and not lagging.permanent
    assert "controller has not yet observed generation 1 of HTTPRoute" in lagging.error
    api.catch_up()
    caught_up = engine._push_io(push, split(7000), frozenset())
    assert caught_up.verified and caught_up.error == ""
    api.reject("ResolvedRefs", "BackendNotFound", "gone", only={CHAT})
    refused = engine._push_io(push, split(3000), frozenset())
    assert not refused.verified and refused.permanent
    assert "ResolvedRefs is False, reason BackendNotFound: gone" in refused.error


# --- waiting for the controller -------------------------------------------------------------------

def test_a_read_back_waits_for_a_controller_that_catches_up(api: FakeApiServer) -> None:
    """A real controller observes a new generation a moment after the apply: the first
    read-back waits for it (up to status_wait_s) instead of failing the attempt."""
    import threading

    gateway = adapter(api.url, status_wait_s=30)
    api.lag()
    gateway.apply(split(7000))
    threading.Timer(0.5, api.catch_up).start()
    assert gateway.read_back() == {"chat": {"h200-us": 7000, "mi300x-us": 3000}}
    assert api.controller.mode == "accept"  # it waited until the controller caught up


def test_a_refusal_ends_the_wait_at_once(api: FakeApiServer) -> None:
    import time

    gateway = adapter(api.url, status_wait_s=30)
    api.reject("ResolvedRefs", "BackendNotFound", "no such Service")
    gateway.apply(split(7000))
    started = time.monotonic()
    error = not_held(gateway)
    assert error.permanent and "BackendNotFound" in str(error)
    assert time.monotonic() - started < 20  # not the 30 s wait


def test_a_lagging_controller_is_reported_after_the_wait(api: FakeApiServer) -> None:
    import time

    gateway = adapter(api.url, status_wait_s=0.5)
    api.lag()
    gateway.apply(split(7000))
    started = time.monotonic()
    error = not_held(gateway)
    assert time.monotonic() - started >= 0.5  # it did wait (a floor load cannot lower)
    assert not error.permanent and "has not yet observed generation 1" in str(error)


@pytest.mark.parametrize("value", [-1, 301, "5", True, None])
def test_status_wait_must_be_seconds_from_0_to_300(value: Any) -> None:
    spec = GatewaySpec(name="edge", kind="gateway-api", admin_address="http://127.0.0.1:1",
                       options={"status_wait_s": value})
    with pytest.raises(AdapterError, match=r"options\.status_wait_s must be (a number|from 0 to "
                                           r"300), not ") as caught:
        GatewayApiSettings.from_gateway(spec)
    assert caught.value.permanent
