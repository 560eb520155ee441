"""The gateways' mirror secrets in the records (fleetctl/traffic/mirror_auth.py): each gateway
gets one of its own, generated, that no API answer, page, audit event or log line shows; a
rotation keeps the previous one for a grace and pushes the gateway; what the shadow collectors
are told (Redis) is, per route, the gateways that carry it and digests of their tokens; each
gateway renders its own token on the copy alone, overwriting the client's.

The collector's side is in tests/shadow/test_collector.py, real gateways mirroring to a real
collector in tests/shadow/test_mirror_auth_gateways.py."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from django.urls import reverse

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.core.errors import PermissionDeniedError
from fleetctl.traffic import mirror_auth, selectors, services
from fleetctl.traffic.gateways.base import (
    MIRROR_AUTH_HEADER,
    MIRROR_HEADER,
    DesiredState,
    GatewaySpec,
    PoolTarget,
)
from fleetctl.traffic.gateways.envoy import render as envoy
from fleetctl.traffic.gateways.nginx.render import NginxSettings, render_config
from fleetctl.traffic.models import Gateway, GatewayPush, Route
from tests.conftest import SYSTEM
from tests.shadow import forget_shadow_keys, use_isolated_redis
from tests.traffic.scenarios import route as route_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def collectors_redis(settings: Any) -> Iterator[redis.Redis]:
    """The Redis the collectors read (a database of these tests' own)."""
    r = use_isolated_redis(settings)
    yield r
    forget_shadow_keys(r)


@pytest.fixture
def second(route: Route, tmp_path: Path, file_kind: None) -> Gateway:
    """`gw-2`, another file gateway carrying `route`."""
    return services.gateway_create(actor=SYSTEM, name="gw-2", kind="file",
                                   admin_address=str(tmp_path / "gw-2"),
                                   options={"file_name": "weights.json"}, routes=[route])


def secrets_of(*gateways: Gateway) -> list[str]:
    """Every secret of the gateways, and every token they render: what must never show."""
    found = []
    for gateway in gateways:
        gateway.refresh_from_db()
        for secret in (gateway.mirror_secret, gateway.mirror_secret_previous):
            if secret:
                found += [secret, mirror_auth.route_token(secret, "llama")]
    return found


def assert_nothing_shown(text: str, hidden: list[str], where: str) -> None:
    for value in hidden:
        assert value not in text, f"a mirror secret or token in {where}"


def publish_on_commit(callbacks: list[Any]) -> None:
    """Run the captured commit hooks that publish to the collectors (not the pushes)."""
    for callback in callbacks:
        if callback is mirror_auth.publish_quietly:
            callback()


def test_every_gateway_gets_a_secret_of_its_own_that_no_answer_page_or_event_shows(
        gateway, second, route, client_for):
    secrets = [gateway.mirror_secret, second.mirror_secret]
    assert all(re.fullmatch(r"[0-9a-f]{64}", s) for s in secrets)
    assert secrets[0] != secrets[1]
    services.gateway_update(actor=SYSTEM, gateway=gateway, options={"file_name": "w.json"})
    services.gateway_mirror_secret_rotate(actor=SYSTEM, gateway=second)
    hidden = secrets_of(gateway, second)
    viewer, lead = client_for("viewer"), client_for("platform-lead")

    for client in (viewer, lead):
        answer = client.get("/api/v1/gateways/")
        assert answer.status_code == 200
        assert_nothing_shown(answer.content.decode(), hidden, "GET /api/v1/gateways/")
        one = client.get(f"/api/v1/gateways/{second.name}/")
        assert one.status_code == 200 and one.json()["mirror_secret_rotated_at"]
        assert_nothing_shown(one.content.decode(), hidden, "GET /api/v1/gateways/gw-2/")
        assert "mirror_secret" not in one.json()
    events = json.dumps(list(AuditEvent.objects.values()), default=str)
    assert "gateway.mirror_secret_rotate" in events
    assert_nothing_shown(events, hidden, "the audit log")
    for url in (reverse("traffic:routes"), reverse("traffic:route-detail", args=[route.name])):
        page = lead.get(url)
        assert page.status_code == 200
        assert_nothing_shown(page.content.decode(), hidden, url)
    exported = lead.get("/api/v1/audit-events/")
    assert_nothing_shown(exported.content.decode(), hidden, "the audit events API")


def test_a_gateway_body_cannot_set_or_read_a_secret(client_for, route, tmp_path, file_kind):
    lead = client_for("platform-lead")
    answer = lead.post("/api/v1/gateways/", {
        "name": "gw-x", "kind": "file", "admin_address": str(tmp_path),
        "options": {"file_name": "w.json"}, "mirror_secret": "0" * 64}, format="json")
    assert answer.status_code == 201, answer.json()
    assert Gateway.objects.get(name="gw-x").mirror_secret != "0" * 64
    assert "mirror_secret" not in answer.json()


def test_rotating_keeps_the_previous_secret_for_the_grace_and_pushes_the_gateway(
        gateway, route, collectors_redis, django_capture_on_commit_callbacks, client_for):
    before = gateway.mirror_secret
    lead = client_for("platform-lead")
    with django_capture_on_commit_callbacks() as callbacks:
        answer = lead.post(f"/api/v1/gateways/{gateway.name}/rotate-mirror-secret/")
    assert answer.status_code == 200, answer.content
    gateway.refresh_from_db()
    assert gateway.mirror_secret != before and gateway.mirror_secret_previous == before
    assert answer.json()["mirror_secret_rotated_at"] is not None
    assert_nothing_shown(answer.content.decode(), secrets_of(gateway), "the rotation's answer")
    assert GatewayPush.objects.filter(gateway=gateway, reason="mirror-secret").count() == 1
    event = AuditEvent.objects.get(action="gateway.mirror_secret_rotate")
    assert "accepted until" in event.message and event.actor == lead.user.username

    publish_on_commit(callbacks)

    accepted = mirror_auth.published()["llama"][str(gateway.pk)]
    now = time.time()
    assert len(accepted) == 2 and accepted[0].until == float("inf")
    assert now + mirror_auth.MIRROR_SECRET_GRACE_S - 60 < accepted[1].until <= (
        now + mirror_auth.MIRROR_SECRET_GRACE_S)
    header = f"{gateway.pk}.{{}}".format
    for secret in (gateway.mirror_secret, before):
        assert mirror_auth.check(mirror_auth.published()["llama"], header(
            mirror_auth.route_token(secret, "llama")), now)
    # Once the grace is over, only the new one.
    assert not mirror_auth.check(mirror_auth.published()["llama"], header(
        mirror_auth.route_token(before, "llama")), now + mirror_auth.MIRROR_SECRET_GRACE_S)
    Gateway.objects.filter(pk=gateway.pk).update(
        mirror_secret_rotated_at=gateway.mirror_secret_rotated_at.replace(year=2000))
    mirror_auth.publish()
    assert len(mirror_auth.published()["llama"][str(gateway.pk)]) == 1


def test_only_fleet_managers_rotate_a_mirror_secret(gateway, client_for, make_user):
    for role in ("viewer", "on-call"):
        answer = client_for(role).post(f"/api/v1/gateways/{gateway.name}/rotate-mirror-secret/")
        assert answer.status_code == 403, role
    with pytest.raises(PermissionDeniedError):
        services.gateway_mirror_secret_rotate(actor=Actor(user=make_user("v", "viewer")),
                                              gateway=gateway)
    assert not GatewayPush.objects.filter(reason="mirror-secret").exists()


def test_the_collectors_are_told_which_gateways_carry_each_route(
        gateway, second, route, make_pool, collectors_redis,
        django_capture_on_commit_callbacks):
    mirror_auth.publish()
    assert set(mirror_auth.published()["llama"]) == {str(gateway.pk), str(second.pk)}
    raw = json.dumps({k.decode(): v.decode() for k, v in
                      collectors_redis.hgetall(mirror_auth.MIRROR_AUTH_KEY).items()})
    assert_nothing_shown(raw, secrets_of(gateway, second), "Redis")  # digests only

    with django_capture_on_commit_callbacks() as callbacks:
        services.gateway_set_routes(actor=SYSTEM, gateway=second, routes=[])
    publish_on_commit(callbacks)
    assert set(mirror_auth.published()["llama"]) == {str(gateway.pk)}

    with django_capture_on_commit_callbacks() as callbacks:
        services.gateway_delete(actor=SYSTEM, gateway=gateway)
    publish_on_commit(callbacks)
    assert "llama" not in mirror_auth.published()  # no gateway carries it: every copy refused


def test_each_gateway_renders_a_token_of_its_own_for_every_route_and_no_repr_shows_it(
        gateway, second, route, caplog):
    shared = selectors.gateway_desired_state(gateway=gateway)
    mine = selectors.desired_for_gateway(shared, gateway=gateway)
    theirs = selectors.desired_for_gateway(shared, gateway=second)

    assert mine is shared  # the state a push shares is still shared by the gateway it was made for
    assert mine.routes[0].mirror_auth == mirror_auth.header_value(
        gateway.pk, gateway.mirror_secret, "llama")
    assert theirs.routes[0].mirror_auth == mirror_auth.header_value(
        second.pk, second.mirror_secret, "llama")
    assert theirs.routes[0].mirror_bp == 0  # on every route, mirrored now or not
    caplog.set_level(logging.DEBUG)
    logging.getLogger("fleetctl.traffic").error("state %s %r", theirs, theirs.routes)
    assert_nothing_shown(caplog.text + repr(theirs) + str(theirs), secrets_of(gateway, second),
                         "a log line")


def test_a_secret_edited_by_hand_signs_nothing_and_breaks_no_push(gateway, second,
                                                                   collectors_redis):
    Gateway.objects.filter(pk=gateway.pk).update(mirror_secret="not hex")
    gateway.refresh_from_db()

    desired = selectors.gateway_desired_state(gateway=gateway)

    assert desired.routes[0].mirror_auth == ""  # its copies carry none: refused
    mirror_auth.publish()
    assert set(mirror_auth.published()["llama"]) == {str(second.pk)}


def test_what_a_gateway_says_is_recorded_without_anything_shaped_like_a_token():
    token = mirror_auth.header_value(12, mirror_auth.new_secret(), "llama")
    said = f'nginx: [emerg] invalid value "{token}" in /srv/nginx/nginx.conf:41'
    assert mirror_auth.redact(said) == (
        'nginx: [emerg] invalid value "12.[redacted]" in /srv/nginx/nginx.conf:41')
    assert mirror_auth.redact("routes (r-0123456789abcdef) swapped") == (
        "routes (r-0123456789abcdef) swapped")


# --- rendered: on the copy alone, overwriting the client's -----------------------------------

def mirroring(token: str = "") -> DesiredState:
    spec = replace(route_spec({"alpha": 10_000}), mirror_bp=2500, mirror_auth=token)
    return DesiredState(routes=(spec,), mirror_url="http://127.0.0.1:9911", pools={
        "alpha": PoolTarget(name="alpha", base_urls=("http://127.0.0.1:8001",),
                            jurisdiction="US")})


TOKEN = mirror_auth.header_value(7, mirror_auth.new_secret(), "chat")


def test_envoy_overwrites_the_copys_mirror_header_and_removes_a_clients_without_a_token():
    route = next(r for r in envoy.render(mirroring(TOKEN)).route_config["virtual_hosts"][0][
        "routes"] if r["name"] == "chat")
    (policy,) = route["route"]["request_mirror_policies"]
    assert {"append": {"header": {"key": MIRROR_AUTH_HEADER, "value": TOKEN},
                       "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}} in policy[
        "request_headers_mutations"]
    # Only the copy: the route's own headers (what the live pool gets) carry neither header.
    assert MIRROR_AUTH_HEADER not in json.dumps({k: v for k, v in route.items()
                                                 if k != "route"})
    assert TOKEN not in json.dumps({k: v for k, v in route["route"].items()
                                    if k != "request_mirror_policies"})

    untokened = envoy.mirror_policy(mirroring().routes[0], mirroring())
    assert {"remove": MIRROR_AUTH_HEADER} in untokened["request_headers_mutations"]
    # A new token is a new routes file (a file swap), not a runtime change.
    assert envoy.render(mirroring(TOKEN)).routes_version != envoy.render(
        mirroring(mirror_auth.header_value(7, mirror_auth.new_secret(), "chat"))).routes_version


def test_nginx_sets_the_mirror_header_in_the_mirror_location_only(tmp_path):
    settings = NginxSettings.from_gateway(GatewaySpec(
        name="edge", kind="nginx", admin_address=str(tmp_path),
        options={"listen": "127.0.0.1:18081", "user": ""}))
    text = render_config(mirroring(TOKEN), settings).text
    mirror_location = text.split("location = /__fleetctl_shadow {", 1)[1].split(
        "\n        }\n", 1)[0]
    assert f"proxy_set_header {MIRROR_AUTH_HEADER} $fleetctl_shadow_auth;" in mirror_location
    assert f"proxy_set_header {MIRROR_HEADER} $fleetctl_shadow;" in mirror_location
    assert text.count(MIRROR_AUTH_HEADER) == 1
    assert f'"chat" "{TOKEN}";' in text and text.count(TOKEN) == 1
