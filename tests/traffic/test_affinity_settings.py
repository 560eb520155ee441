"""A route's prefix affinity as a setting (issue 28): off by default, set over REST and from
the route page, audited, 400 naming the field on a bad value, refused while a gateway of a
kind that cannot keep it carries the route (and such a gateway cannot take such a route),
carried in the desired state, and its gateways pushed again."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.core.errors import PermissionDeniedError
from fleetctl.traffic import selectors, services
from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import PrefixAffinity
from fleetctl.traffic.models import Gateway, GatewayPush, Route
from tests.conftest import SYSTEM

pytestmark = pytest.mark.django_db

URL = "/api/v1/routes/llama/affinity/"


def envoy(name: str, *routes: Route) -> Gateway:
    return services.gateway_create(actor=SYSTEM, name=name, kind="envoy",
                                   admin_address="http://127.0.0.1:1",
                                   options={"config_dir": "/tmp"}, routes=list(routes))


def test_only_envoy_keeps_prefix_affinity() -> None:
    assert {name: kind.supports_prefix_affinity
            for name, kind in registry.kinds().items()} == {
        "envoy": True, "envoy-xds": True, "gateway-api": False, "haproxy": False,
        "nginx": False}


def test_off_by_default_then_set_audited_and_pushed(route: Route, make_user: Any) -> None:
    gateway = envoy("edge", route)
    spec = selectors.gateway_desired_state(gateway=gateway).routes[0]
    assert spec.affinity is None
    lead = Actor(user=make_user("lea", "platform-lead"))
    pushes = GatewayPush.objects.filter(gateway=gateway, reason="affinity")
    services.route_affinity_set(actor=lead, route=route, data={"source": "prompt"})
    spec = selectors.gateway_desired_state(gateway=gateway).routes[0]
    assert spec.affinity == PrefixAffinity("prompt", 4096)
    assert pushes.count() == 1
    services.route_affinity_set(actor=lead, route=route,
                                data={"source": "prompt", "prefix_bytes": 8000})
    event = AuditEvent.objects.filter(action="route.affinity").order_by("-id").first()
    assert event is not None
    assert event.before == {"source": "prompt", "prefix_bytes": 4096}
    assert event.after == {"source": "prompt", "prefix_bytes": 8000}
    # The same setting again: nothing recorded, nothing pushed.
    services.route_affinity_set(actor=lead, route=route,
                                data={"source": "prompt", "prefix_bytes": 8000})
    assert AuditEvent.objects.filter(action="route.affinity").count() == 2
    assert pushes.count() == 2
    services.route_affinity_set(actor=lead, route=route, data={"source": "header"})
    spec = selectors.gateway_desired_state(gateway=gateway).routes[0]
    assert spec.affinity == PrefixAffinity("header", 0)
    oncall = Actor(user=make_user("olga", "on-call"))
    with pytest.raises(PermissionDeniedError):
        services.route_affinity_set(actor=oncall, route=route, data={"source": "off"})


@pytest.mark.parametrize(("data", "field", "words"), [
    ({"source": "prompt", "prefix_bytes": 10}, "prefix_bytes", "from 64 to 65,536"),
    ({"source": "prompt", "prefix_bytes": 10**6}, "prefix_bytes", "got 1,000,000"),
    ({"source": "prompt", "prefix_bytes": "lots"}, "prefix_bytes", "whole number"),
    ({"source": "header", "prefix_bytes": 512}, "prefix_bytes", "Only a prompt key"),
    ({"source": "sticky"}, "source", "Unknown source 'sticky'"),
    ({}, "source", "Required"),
    ({"source": "off", "bytes": 3}, "bytes", "Unknown field"),
])
def test_a_bad_setting_is_a_400_naming_the_field(route: Route, data: dict[str, Any],
                                                 field: str, words: str) -> None:
    with pytest.raises(ValidationError) as refused:
        services.route_affinity_set(actor=SYSTEM, route=route, data=data)
    assert words in " ".join(refused.value.message_dict[field])
    assert Route.objects.get(pk=route.pk).prefix_affinity == "off"


def test_refused_while_a_haproxy_gateway_carries_the_route(route: Route,
                                                            tmp_path: Any) -> None:
    Gateway.objects.create(name="hap", kind="haproxy", admin_address="/tmp/x.sock",
                           options={"bind": "127.0.0.1:1", "config_path": "/tmp/h.cfg"}
                           ).routes.add(route)
    with pytest.raises(ValidationError) as refused:
        services.route_affinity_set(actor=SYSTEM, route=route, data={"source": "prompt"})
    message = refused.value.message_dict["source"][0]
    assert "hap (HAProxy)" in message and "cannot keep prefix affinity" in message
    # Turning it off is always allowed.
    services.route_affinity_set(actor=SYSTEM, route=route, data={"source": "off"})


def test_a_route_with_affinity_cannot_go_onto_nginx_nor_its_gateway_become_haproxy(
        route: Route, tmp_path: Any) -> None:
    services.route_affinity_set(actor=SYSTEM, route=route, data={"source": "prompt"})
    with pytest.raises(ValidationError) as refused:
        services.gateway_create(actor=SYSTEM, name="edge-nginx", kind="nginx",
                                admin_address=str(tmp_path),
                                options={"listen": "127.0.0.1:1"}, routes=[route])
    assert "llama" in refused.value.message_dict["routes"][0]
    gateway = envoy("edge", route)
    with pytest.raises(ValidationError) as refused:
        services.gateway_update(actor=SYSTEM, gateway=gateway, kind="haproxy",
                                options={"bind": "127.0.0.1:1", "config_path": "/tmp/h.cfg"})
    assert "cannot keep prefix affinity" in refused.value.message_dict["kind"][0]


def test_rest_round_trip_scopes_and_the_route_answer(route: Route, token_client: Any) -> None:
    reader = token_client(["read"], "platform-lead")
    assert reader.get(URL).json() == {"source": "off", "prefix_bytes": None}
    assert reader.put(URL, {"source": "prompt"}, format="json").status_code == 403
    client = token_client(["read", "fleet"], "platform-lead")
    put = client.put(URL, {"source": "prompt", "prefix_bytes": 2048}, format="json")
    assert put.status_code == 200, put.json()
    assert put.json() == {"source": "prompt", "prefix_bytes": 2048}
    assert client.get(URL).json() == put.json()
    assert client.get("/api/v1/routes/llama/").json()["prefix_affinity"] == put.json()
    bad = client.put(URL, {"source": "prompt", "prefix_bytes": 1}, format="json")
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) == {"prefix_bytes"}
    assert client.get("/api/v1/routes/nope/affinity/").status_code == 404


@pytest.mark.parametrize("role", ["viewer", "on-call", "platform-lead", "admin"])
def test_the_route_page_shows_it_and_fleet_managers_set_it(
        route: Route, make_user: Any, role: str) -> None:
    services.route_affinity_set(actor=SYSTEM, route=route,
                                data={"source": "prompt", "prefix_bytes": 1024})
    client = Client()
    client.force_login(make_user(f"p-{role}", role))
    html = client.get(reverse("traffic:route-detail", args=["llama"])).content.decode()
    assert "Prefix affinity" in html and "leading 1024 bytes" in html
    manages = role in ("platform-lead", "admin")
    assert ('id="affinity-form"' in html) == manages
    answer = client.post(reverse("traffic:route-affinity", args=["llama"]),
                         {"source": "header", "prefix_bytes": "1024"}, follow=True)
    assert answer.status_code == 200  # a refusal is said on the page it returns to
    assert Route.objects.get(pk=route.pk).prefix_affinity == ("header" if manages else "prompt")
    if manages:
        answer = client.post(reverse("traffic:route-affinity", args=["llama"]),
                             {"source": "prompt", "prefix_bytes": "12"}, follow=True)
        assert "prefix_bytes: Give a whole number from 64" in answer.content.decode()
