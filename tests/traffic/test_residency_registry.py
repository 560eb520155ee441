"""Residency fails closed through the registry too: a region, pool or endpoint edit that
would leave pinned traffic on a pool outside its pin is refused (409, naming the routes,
nothing changed, the refusal audited), revisions name pools by an identity a new pool cannot
take over, and gateways are never given such a weight even if a row says otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool, PoolModel, Region
from fleetctl.fleet.services import pool_health_record, pool_model_create, region_create
from fleetctl.traffic import selectors
from fleetctl.traffic.models import Gateway, SplitRevision
from fleetctl.traffic.push import drain_push_now
from fleetctl.traffic.services import (
    drain_request,
    drain_restore,
    revision_create,
    route_create,
)
from tests.conftest import SYSTEM

MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
def eu_fleet(db: None, make_pool: Any, region: Region) -> dict[str, Any]:
    """`chat-eu` pinned to the EU, split across two EU pools; a US pool beside them."""
    eu = region_create(actor=SYSTEM, code="eu-central", name="EU Central", jurisdiction="EU")
    eu2 = region_create(actor=SYSTEM, code="eu-west", name="EU West", jurisdiction="EU")
    pools = {
        "eu-a": make_pool(name="eu-a", region=eu, base_urls=["http://127.0.0.1:7001"]),
        "eu-b": make_pool(name="eu-b", region=eu2, base_urls=["http://127.0.0.1:7002"]),
        "us-a": make_pool(name="us-a", base_urls=["http://127.0.0.1:7003"]),
    }
    for pool in pools.values():
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = route_create(actor=SYSTEM, name="chat-eu", model_id=MODEL, residency="EU",
                         primary_pool=pools["eu-a"], weights={"eu-a": 50, "eu-b": 50})
    gateway = Gateway.objects.create(name="edge", kind="envoy",
                                     admin_address="http://127.0.0.1:1",
                                     options={"config_dir": "/nonexistent"})
    gateway.routes.add(route)
    return {"eu": eu, "eu2": eu2, "pools": pools, "route": route, "gateway": gateway}


def _refusals(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, outcome="denied"))


def _held(gateway: Gateway) -> dict[str, dict[str, int]]:
    return selectors.gateway_desired_state(gateway=gateway).held_weights()


# --- refused at the registry -----------------------------------------------------------------

def test_a_region_cannot_change_jurisdiction_under_pinned_traffic(eu_fleet, client_for):
    admin = client_for("admin")

    answer = admin.patch("/api/v1/regions/eu-west/", {"jurisdiction": "IN"}, format="json")

    assert answer.status_code == 409, answer.content
    message = answer.json()["error"]["message"]
    assert "chat-eu" in message and "eu-b" in message and "Drain" in message
    assert Region.objects.get(code="eu-west").jurisdiction == "EU"
    assert len(_refusals("region.update")) == 1


def test_a_region_may_change_jurisdiction_once_its_pools_are_drained(eu_fleet, client_for):
    drain_push_now(drain_request(actor=SYSTEM, pool=eu_fleet["pools"]["eu-b"],
                                 reason="moving region"))
    admin = client_for("admin")

    answer = admin.patch("/api/v1/regions/eu-west/", {"jurisdiction": "IN"}, format="json")

    assert answer.status_code == 200, answer.content
    assert "eu-b" not in _held(eu_fleet["gateway"])["chat-eu"]


def test_a_pool_cannot_move_to_a_region_outside_a_pin_it_carries(eu_fleet, client_for):
    admin = client_for("admin")

    answer = admin.patch("/api/v1/pools/eu-b/", {"region": "us-east"}, format="json")

    assert answer.status_code == 409, answer.content
    assert "sends 50 % to eu-b" in answer.json()["error"]["message"]
    assert Pool.objects.get(name="eu-b").region.code == "eu-west"


def test_a_pinned_routes_primary_cannot_leave_the_jurisdiction(eu_fleet, client_for):
    revision_create(actor=SYSTEM, route=eu_fleet["route"], weights={"eu-b": 100},
                    base_revision=1, reason="all on b")
    admin = client_for("admin")

    answer = admin.patch("/api/v1/pools/eu-a/", {"region": "us-east"}, format="json")

    assert answer.status_code == 409
    assert "eu-a as its primary" in answer.json()["error"]["message"]


def test_a_pool_may_move_within_its_jurisdiction(eu_fleet, client_for):
    answer = client_for("admin").patch("/api/v1/pools/eu-b/", {"region": "eu-central"},
                                       format="json")

    assert answer.status_code == 200, answer.content


def test_a_pool_carrying_weight_cannot_be_deleted_or_renamed(eu_fleet, client_for):
    admin = client_for("admin")

    deleted = admin.delete("/api/v1/pools/eu-b/")
    renamed = admin.patch("/api/v1/pools/eu-b/", {"name": "eu-b2"}, format="json")

    assert deleted.status_code == 409 and renamed.status_code == 409
    assert "Drain it first" in deleted.json()["error"]["message"]
    assert Pool.objects.filter(name="eu-b").exists()
    assert len(_refusals("pool.delete")) == 1 and len(_refusals("pool.update")) == 1


def _entry(pool: str) -> PoolModel:
    return PoolModel.objects.get(pool__name=pool, model_id=MODEL)


def test_a_pool_model_a_pinned_route_sends_weight_to_cannot_be_deleted(eu_fleet, client_for):
    admin = client_for("admin")

    answer = admin.delete(f"/api/v1/pool-models/{_entry('eu-b').pk}/")

    assert answer.status_code == 409, answer.content
    message = answer.json()["error"]["message"]
    assert message.startswith(f"Pool eu-b cannot stop serving {MODEL} while routes rely on it: "
                              f"route chat-eu (pinned to EU) sends 50 % of {MODEL} to eu-b.")
    assert "Drain it off those routes first" in message
    assert PoolModel.objects.filter(pool__name="eu-b").exists()
    refused = _refusals("pool_model.delete")
    assert len(refused) == 1 and refused[0].message == message


def test_a_pool_model_whose_pool_is_a_routes_primary_cannot_be_deleted_or_renamed(
        eu_fleet, client_for):
    revision_create(actor=SYSTEM, route=eu_fleet["route"], weights={"eu-b": 100},
                    base_revision=1, reason="all on b")
    admin = client_for("admin")

    deleted = admin.delete(f"/api/v1/pool-models/{_entry('eu-a').pk}/")
    renamed = admin.patch(f"/api/v1/pool-models/{_entry('eu-a').pk}/",
                          {"model_id": "another-model"}, format="json")

    assert deleted.status_code == renamed.status_code == 409
    assert f"route chat-eu (pinned to EU) has eu-a as its primary for {MODEL}" in \
        deleted.json()["error"]["message"]
    assert _entry("eu-a").model_id == MODEL
    assert len(_refusals("pool_model.delete")) == len(_refusals("pool_model.update")) == 1


def test_a_pool_model_is_refused_for_an_unpinned_route_too_and_allowed_once_drained(
        eu_fleet, client_for, make_pool):
    us_b = make_pool(name="us-b", base_urls=["http://127.0.0.1:7011"])
    pool_model_create(actor=SYSTEM, pool=us_b, model_id=MODEL, max_context_tokens=4096)
    pool_health_record(pool_id=us_b.pk, ok=True, status_code=200, latency_ms=1.0)
    from fleetctl.traffic.services import route_create

    route_create(actor=SYSTEM, name="chat-us", model_id=MODEL, primary_pool=eu_fleet["pools"]
                 ["us-a"], weights={"us-a": 90, "us-b": 10})
    admin = client_for("admin")

    refused = admin.delete(f"/api/v1/pool-models/{_entry('us-b').pk}/")
    assert refused.status_code == 409
    assert f"route chat-us sends 10 % of {MODEL} to us-b" in refused.json()["error"]["message"]

    drain_push_now(drain_request(actor=SYSTEM, pool=us_b, reason="retiring the model"))
    allowed = admin.delete(f"/api/v1/pool-models/{_entry('us-b').pk}/")
    assert allowed.status_code == 204, allowed.content
    assert not PoolModel.objects.filter(pool=us_b).exists()


def test_a_pool_model_no_route_relies_on_can_be_deleted(eu_fleet, client_for):
    answer = client_for("admin").delete(f"/api/v1/pool-models/{_entry('us-a').pk}/")

    assert answer.status_code == 204
    assert AuditEvent.objects.filter(action="pool_model.delete", outcome="ok").count() == 1


def test_an_endpoint_cannot_sit_in_two_jurisdictions(eu_fleet, client_for):
    admin = client_for("admin")

    moved = admin.patch("/api/v1/pools/us-a/", {"base_urls": ["http://127.0.0.1:7002/"]},
                        format="json")
    created = admin.post("/api/v1/pools/", {
        "name": "us-b", "runtime": "cuda", "accelerator": "H100", "region": "us-east",
        "base_urls": ["HTTP://127.0.0.1:7001"], "max_context_tokens": 4096,
        "node_hourly_rate": "1"}, format="json")
    same_side = admin.post("/api/v1/pools/", {
        "name": "eu-c", "runtime": "cuda", "accelerator": "H100", "region": "eu-west",
        "base_urls": ["http://127.0.0.1:7001"], "max_context_tokens": 4096,
        "node_hourly_rate": "1"}, format="json")

    assert moved.status_code == 400 and created.status_code == 400
    assert "pool eu-b's endpoint, in EU" in moved.json()["error"]["message"]
    assert "pool eu-a's endpoint, in EU" in created.json()["error"]["message"]
    assert same_side.status_code == 201, same_side.content
    assert Pool.objects.get(name="us-a").base_urls == ["http://127.0.0.1:7003"]


def test_a_region_move_that_would_split_an_endpoint_across_borders_is_refused(
    eu_fleet, client_for, make_pool
):
    spare = region_create(actor=SYSTEM, code="eu-north", name="EU North", jurisdiction="EU")
    make_pool(name="eu-twin", region=spare, base_urls=["http://127.0.0.1:7001"])

    answer = client_for("admin").patch("/api/v1/regions/eu-north/", {"jurisdiction": "UK"},
                                       format="json")

    assert answer.status_code == 400
    assert "two jurisdictions" in answer.json()["error"]["message"]


# --- identities, and the gateway's second line -----------------------------------------------

def test_a_restore_refuses_a_pool_that_took_over_a_drained_pools_name(eu_fleet, make_pool):
    drain = drain_request(actor=SYSTEM, pool=eu_fleet["pools"]["eu-b"], reason="bad node")
    from fleetctl.fleet.services import pool_update

    pool_update(actor=SYSTEM, pool=eu_fleet["pools"]["eu-b"], name="eu-b-retired")
    impostor = make_pool(name="eu-b", region=eu_fleet["eu"],
                         base_urls=["http://127.0.0.1:7009"])
    pool_model_create(actor=SYSTEM, pool=impostor, model_id=MODEL, max_context_tokens=4096)
    pool_health_record(pool_id=impostor.pk, ok=True, status_code=200, latency_ms=1.0)

    from fleetctl.core.errors import ConflictError

    with pytest.raises(ConflictError, match="registered again"):
        drain_restore(actor=SYSTEM, drain=drain, reason="back")
    assert eu_fleet["route"].revisions.count() == 2


def test_revisions_remember_which_pool_each_name_meant(eu_fleet):
    current = selectors.revision_current(route=eu_fleet["route"])

    assert current is not None
    assert current.pool_ids == {"eu-a": eu_fleet["pools"]["eu-a"].pk,
                                "eu-b": eu_fleet["pools"]["eu-b"].pk}


def test_gateways_are_not_given_a_weight_whose_pool_name_was_taken_over(eu_fleet, make_pool):
    # As old data or a path nobody thought of would leave it: the pool is gone from under
    # the revision and another pool, in the US, has its name.
    Pool.objects.filter(name="eu-b").update(name="eu-b-old")
    make_pool(name="eu-b", base_urls=["http://127.0.0.1:7010"])

    held = _held(eu_fleet["gateway"])

    assert held["chat-eu"] == {"eu-a": 10000}  # eu-b's share went to the primary


def test_gateways_are_not_given_weight_on_a_pool_outside_the_pin(eu_fleet):
    Region.objects.filter(code__in=["eu-central", "eu-west"]).update(jurisdiction="IN")

    held = _held(eu_fleet["gateway"])

    assert held["chat-eu"] == {}  # nothing left in the EU: the route answers an error
    assert SplitRevision.objects.filter(route=eu_fleet["route"]).count() == 1


def test_an_endpoint_change_is_pushed_to_the_gateways_without_a_new_revision(
    eu_fleet, client_for
):
    from fleetctl.traffic.models import GatewayPush

    answer = client_for("admin").patch("/api/v1/pools/eu-b/",
                                       {"base_urls": ["http://127.0.0.1:7102"]}, format="json")

    assert answer.status_code == 200
    push = GatewayPush.objects.get(reason="registry")
    assert push.gateway == eu_fleet["gateway"]
    pools = selectors.gateway_desired_state(gateway=eu_fleet["gateway"]).pools
    assert pools["eu-b"].base_urls == ("http://127.0.0.1:7102",)


def test_an_edit_that_changes_nothing_gateways_hold_pushes_nothing(eu_fleet, client_for):
    from fleetctl.traffic.models import GatewayPush

    client_for("admin").patch("/api/v1/pools/eu-b/", {"labels": {"rack": "7"}}, format="json")

    assert not GatewayPush.objects.filter(reason="registry").exists()


def test_the_dashboard_refuses_the_same_move_and_says_why(eu_fleet, client):
    from django.contrib.auth.models import Group, User
    from django.urls import reverse

    lead = User.objects.create_user("lead-x", password="pw-for-tests-only")
    lead.groups.set([Group.objects.get_or_create(name="platform-lead")[0]])
    client.force_login(lead)
    url = reverse("fleet:pool-edit", args=["eu-b"])
    form = client.get(url).context["form"]
    data = {name: "" if form[name].value() is None else form[name].value()
            for name in form.fields}  # what a browser sends for an empty field
    data["region"] = "us-east"

    answer = client.post(url, data)

    assert answer.status_code == 409, answer.context["form"].errors
    assert "chat-eu" in answer.content.decode()
    assert Pool.objects.get(name="eu-b").region.code == "eu-west"
