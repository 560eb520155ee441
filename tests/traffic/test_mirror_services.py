"""Mirroring a route (shadow runs) in the records: route_mirror_set / route_mirror_clear
validate, audit and push the route's gateways; the desired state carries mirror_bp and the
collector URL and fails closed; the registry refuses edits that would leave a mirror pool
outside its route's pin or not serving its model; a push verifies the mirror fraction, or
says the kind cannot read it back; the Gateway API renders a RequestMirror filter; HAProxy
says it cannot mirror."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import pytest
from django.core.exceptions import ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from fleetctl.fleet import services as fleet
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import push, selectors, services
from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import GatewaySpec, adapter_for
from fleetctl.traffic.gateways.gateway_api.render import GatewayApiSettings, render_route
from fleetctl.traffic.models import Gateway, GatewayPush, Route
from tests.conftest import SYSTEM
from tests.traffic.conftest import MODEL
from tests.traffic.scenarios import route as route_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def eu_route(make_pool) -> Route:
    """`eu-chat`, pinned to EU: primary `eu-a`, candidate `eu-b` (a region of its own);
    `us-c` serves the model in the US."""
    eu = fleet.region_create(actor=SYSTEM, code="eu-west", name="EU", jurisdiction="EU")
    north = fleet.region_create(actor=SYSTEM, code="eu-north", name="EU N", jurisdiction="EU")
    pools = [make_pool(name="eu-a", region=eu), make_pool(name="eu-b", region=north),
             make_pool(name="us-c")]
    for pool in pools:
        fleet.pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        fleet.pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return services.route_create(actor=SYSTEM, name="eu-chat", model_id=MODEL, residency="EU",
                                 primary_pool=pools[0])


def pool(name: str) -> Pool:
    return Pool.objects.select_related("region").get(name=name)


def start(route: Route, percent: float = 12.5, *names: str) -> Route:
    return services.route_mirror_set(actor=SYSTEM, route=route, percent=percent,
                                     pools=[pool(n) for n in names or ("eu-a", "eu-b")],
                                     owner="shadow run 7")


def spec(route: Route, gateway: Gateway):
    desired = selectors.gateway_desired_state(gateway=gateway)
    return next(r for r in desired.routes if r.key == route.name), desired


@pytest.fixture
def edge(eu_route: Route, tmp_path, file_kind) -> Gateway:
    return services.gateway_create(actor=SYSTEM, name="edge", kind="file",
                                   admin_address=str(tmp_path),
                                   options={"file_name": "weights.json"}, routes=[eu_route])


# --- the service ---------------------------------------------------------------------------------

def test_mirror_set_stores_audits_and_pushes_the_routes_gateways(eu_route, edge, settings):
    settings.SHADOW_COLLECTOR_URL = "http://127.0.0.1:9999"
    before = GatewayPush.objects.count()
    start(eu_route)
    eu_route.refresh_from_db()
    assert (eu_route.mirror_percent, eu_route.mirror_owner) == (12.5, "shadow run 7")
    assert eu_route.mirror_pools == {"eu-a": pool("eu-a").pk, "eu-b": pool("eu-b").pk}
    event = AuditEvent.objects.get(action="route.mirror_set")
    assert event.after["mirror_percent"] == 12.5 and "shadow run 7" in event.message
    pushed = GatewayPush.objects.filter(reason="mirror")
    assert GatewayPush.objects.count() == before + 1 and pushed.get().gateway == edge
    assert pushed.get().revision.number == eu_route.revision_number  # no new revision
    route, desired = spec(eu_route, edge)
    assert (route.mirror_bp, desired.mirror_url) == (1250, "http://127.0.0.1:9999")

    services.route_mirror_clear(actor=SYSTEM, route=eu_route, reason="run stopped")
    eu_route.refresh_from_db()
    assert (eu_route.mirror_percent, eu_route.mirror_pools, eu_route.mirror_owner) == (0, {}, "")
    assert spec(eu_route, edge)[0].mirror_bp == 0
    assert AuditEvent.objects.filter(action="route.mirror_clear", message="run stopped").exists()
    assert GatewayPush.objects.filter(reason="mirror").count() == 2


def test_a_gateway_option_names_its_own_collector(eu_route, edge):
    envoy = Gateway.objects.create(name="envoy-edge", kind="envoy",
                                   admin_address="http://127.0.0.1:1",
                                   options={"config_dir": "/tmp",
                                            "shadow_collector": "http://10.0.0.9:7000"})
    envoy.full_clean()
    envoy.routes.add(eu_route)
    assert spec(eu_route, envoy)[1].mirror_url == "http://10.0.0.9:7000"
    envoy.options["shadow_collector"] = "http://10.0.0.9:7000/path"
    with pytest.raises(ValidationError, match="without a path"):
        envoy.full_clean()


@pytest.mark.parametrize("percent, field", [
    (0, "percent"), (-1, "percent"), (100.5, "percent"), (0.001, "percent"), ("5", "percent"),
])
def test_mirror_set_refuses_a_share_outside_0_to_100(eu_route, percent, field):
    with pytest.raises(ValidationError) as caught:
        start(eu_route, percent)
    assert field in caught.value.message_dict
    assert Route.objects.get(pk=eu_route.pk).mirror_percent == 0


def test_mirror_set_refuses_a_pool_outside_the_pin_naming_it_and_changes_nothing(eu_route):
    with pytest.raises(ValidationError) as caught:
        start(eu_route, 10, "eu-a", "us-c")
    [message] = caught.value.message_dict["pools"]
    assert "us-c" in message and "pinned to EU" in message
    assert Route.objects.get(pk=eu_route.pk).mirror_percent == 0
    assert not AuditEvent.objects.filter(action="route.mirror_set").exists()


def test_mirror_set_refuses_a_pool_that_does_not_serve_the_model(eu_route):
    PoolModel.objects.filter(pool__name="eu-b").delete()
    with pytest.raises(ValidationError) as caught:
        start(eu_route)
    assert "eu-b does not serve model" in caught.value.message_dict["pools"][0]


def test_mirroring_needs_the_jobs_role(eu_route, make_user):
    reader = Actor(user=make_user("reader", "read-only"))
    with pytest.raises(PermissionDeniedError):
        services.route_mirror_set(actor=reader, route=eu_route, percent=5,
                                  pools=[pool("eu-a")], owner="shadow run 7")
    with pytest.raises(PermissionDeniedError):
        services.route_mirror_clear(actor=reader, route=eu_route, reason="x")
    lead = Actor(user=make_user("lead", "platform-lead"))
    services.route_mirror_set(actor=lead, route=eu_route, percent=5, pools=[pool("eu-a")],
                              owner="shadow run 7")


# --- the desired state fails closed --------------------------------------------------------------

def test_mirror_bp_is_0_when_a_mirror_pool_left_the_pin_behind_the_registrys_back(
        eu_route, edge, caplog):
    start(eu_route)
    us = pool("us-c").region
    Pool.objects.filter(name="eu-b").update(region=us)  # no service: the registry would refuse
    with caplog.at_level(logging.ERROR, logger="fleetctl.traffic"):
        assert spec(eu_route, edge)[0].mirror_bp == 0
    assert "mirror pool eu-b" in caplog.text


def test_mirror_bp_is_0_when_a_mirror_pool_is_gone_or_renamed(eu_route, edge):
    start(eu_route)
    Pool.objects.filter(name="eu-b").update(name="eu-b2")  # renamed: the name means nobody
    assert spec(eu_route, edge)[0].mirror_bp == 0
    Pool.objects.filter(name="eu-b2").update(name="eu-b")
    assert spec(eu_route, edge)[0].mirror_bp == 1250
    Route.objects.filter(pk=eu_route.pk).update(mirror_pools={"eu-a": pool("eu-a").pk,
                                                              "eu-b": 999_999})
    assert spec(eu_route, edge)[0].mirror_bp == 0  # the id is no pool's any more


def test_mirror_bp_is_0_on_a_route_whose_split_is_empty(eu_route, edge):
    start(eu_route)
    from fleetctl.traffic.models import SplitRevision

    SplitRevision.objects.filter(route=eu_route).update(weights={})
    route, desired = spec(eu_route, edge)
    assert (route.weights, route.mirror_bp, desired.held_mirror()) == ({}, 0, {})


# --- the registry refuses edits that would break a mirror ----------------------------------------

def test_the_registry_refuses_to_move_delete_rename_or_unserve_a_mirror_pool(eu_route):
    start(eu_route)
    us = pool("us-c").region
    expected = re.escape("pool eu-b is a mirror target of route eu-chat (shadow run 7); stop "
                         "the shadow run first")
    with pytest.raises(ConflictError, match=expected) as caught:
        fleet.pool_update(actor=SYSTEM, pool=pool("eu-b"), region=us)
    assert str(caught.value).startswith("Pool eu-b cannot move to US: ")
    with pytest.raises(ConflictError, match=expected):
        fleet.pool_delete(actor=SYSTEM, pool=pool("eu-b"))
    with pytest.raises(ConflictError, match=expected):
        fleet.pool_update(actor=SYSTEM, pool=pool("eu-b"), name="eu-b-new")
    with pytest.raises(ConflictError, match=expected):
        fleet.pool_model_delete(actor=SYSTEM, entry=PoolModel.objects.get(pool__name="eu-b"))
    with pytest.raises(ConflictError, match=expected):
        fleet.pool_model_update(actor=SYSTEM, entry=PoolModel.objects.get(pool__name="eu-b"),
                                model_id="another-model")
    with pytest.raises(ConflictError, match=expected):
        fleet.region_update(actor=SYSTEM, region=pool("eu-b").region, jurisdiction="US")
    assert pool("eu-b").region.jurisdiction == "EU"
    assert PoolModel.objects.filter(pool__name="eu-b").exists()

    services.route_mirror_clear(actor=SYSTEM, route=eu_route, reason="run stopped")
    fleet.pool_model_delete(actor=SYSTEM, entry=PoolModel.objects.get(pool__name="eu-b"))


def test_a_pool_may_move_within_the_pin_while_mirrored(eu_route):
    start(eu_route)
    other_eu = fleet.region_create(actor=SYSTEM, code="eu-south", name="EU S",
                                   jurisdiction="EU")
    fleet.pool_update(actor=SYSTEM, pool=pool("eu-b"), region=other_eu)
    assert pool("eu-b").region == other_eu


# --- pushes verify the mirror fraction -----------------------------------------------------------

def test_a_push_to_a_kind_that_cannot_read_the_mirror_back_verifies_and_says_so(eu_route, edge):
    start(eu_route)
    [pushed] = GatewayPush.objects.filter(reason="mirror")
    push.push_fanout(push_ids=[pushed.pk])
    pushed.refresh_from_db()
    assert pushed.status == GatewayPush.Status.VERIFIED
    detail = pushed.attempt_rows.get().detail
    assert "mirror fraction not verified" in detail and "cannot read it back" in detail


# --- kinds ---------------------------------------------------------------------------------------

def test_every_kind_but_haproxy_can_mirror_and_the_api_says_which(client_for, eu_route):
    assert {name: kind.supports_mirror for name, kind in registry.kinds().items()} == {
        "envoy": True, "envoy-xds": True, "gateway-api": True, "haproxy": False,
        "nginx": True}
    api = client_for("platform-lead")
    Gateway.objects.create(name="hap", kind="haproxy", admin_address="/tmp/x.sock",
                           options={"bind": "127.0.0.1:1", "config_path": "/tmp/h.cfg"})
    answer = api.get("/api/v1/gateways/hap/")
    assert answer.status_code == 200, answer.content
    assert answer.json()["supports_mirror"] is False
    start(eu_route, 2.5)
    assert api.get("/api/v1/routes/eu-chat/").json()["mirror_percent"] == 2.5


def _gateway_api(**options: object):
    return adapter_for(GatewaySpec(name="k8s", kind="gateway-api",
                                   admin_address="https://127.0.0.1:1", options=options))


def test_the_gateway_api_renders_a_request_mirror_filter_with_the_share():
    adapter = _gateway_api(shadow_collector_service="shadow-collector:9911")
    settings = GatewayApiSettings.of("k8s", "https://127.0.0.1:1", adapter.options)
    desired = replace(adapter_harness_state(), mirror_url="http://127.0.0.1:9911")
    whole = render_route(replace(desired.routes[0], mirror_bp=1500), desired, settings)
    filters = whole["spec"]["rules"][0]["filters"]
    assert filters[0]["requestHeaderModifier"]["set"] == [
        {"name": "x-fleetctl-shadow-route", "value": "chat"}]
    assert filters[1] == {"type": "RequestMirror", "requestMirror": {
        "backendRef": {"group": "", "kind": "Service", "name": "shadow-collector",
                       "port": 9911}, "percent": 15}}
    fine = render_route(replace(desired.routes[0], mirror_bp=1250), desired, settings)
    assert fine["spec"]["rules"][0]["filters"][1]["requestMirror"]["fraction"] == {
        "numerator": 1250, "denominator": 10_000}
    off = render_route(desired.routes[0], desired, settings)
    assert "filters" not in off["spec"]["rules"][0]


def test_the_gateway_api_without_a_collector_service_mirrors_nothing_and_says_so():
    adapter = _gateway_api()
    desired = adapter_harness_state()
    desired = replace(desired, mirror_url="http://127.0.0.1:9911", routes=tuple(
        replace(r, mirror_bp=1000) for r in desired.routes))
    fit = adapter.renderable(desired)
    assert fit.desired.held_mirror() == {}
    assert "shadow_collector_service" in fit.warning and "chat" in fit.warning


def test_haproxy_renders_no_mirror_and_its_warning_says_use_replay():
    haproxy = registry.adapter_class("haproxy")
    from fleetctl.traffic.gateways.base import renderable

    desired = replace(adapter_harness_state(), mirror_url="http://127.0.0.1:9911")
    desired = replace(desired, routes=tuple(replace(r, mirror_bp=500) for r in desired.routes))
    fit = renderable(haproxy, desired)
    assert fit.desired.held_mirror() == {}
    assert fit.warning == ("HAProxy cannot mirror; route(s) chat are not mirrored here (use a "
                           "replay shadow run)")


def adapter_harness_state():
    from fleetctl.traffic.gateways.base import DesiredState, PoolTarget

    return DesiredState(routes=(route_spec({"alpha": 10_000}),),
                        pools={"alpha": PoolTarget("alpha", ("http://127.0.0.1:8000",), "US")})
