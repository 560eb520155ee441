"""Stage 3's traffic rules, per pool: a stage-3 candidate carries its plan's batch-class
routes and nothing else; interactive weight (on any route, the plan's or another) waits for
stage 4; below stage 3 it carries nothing; drains are never blocked; leaving stage 3 (or
stage 4 for 3) drains what the new stage no longer allows; a plan's candidate starts with no
weight on any route. Real PostgreSQL, through the services and REST."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from fleetctl.core.errors import ConflictError
from fleetctl.fleet.services import pool_model_create
from fleetctl.ramps.services import ramp_create
from fleetctl.traffic import selectors as traffic_selectors
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Gateway, Route
from migrations_plan import services
from migrations_plan.models import Plan, StageMove
from tests.migrations_plan.conftest import MODEL
from tests.migrations_plan.helpers import pass_gate, walk_to

OTHER = "qwen-2.5-7b-instruct"  # a model of routes in no plan
THRESHOLDS = {"slo_ttft_p95_ms": 500.0, "slo_tpot_p95_ms": 100.0, "slo_error_rate": 0.05,
              "latency_margin_pct": 10.0}


@pytest.fixture
def routes(world, system):
    """Besides the world's interactive route `llama` (no latency class): the plan's
    batch-class route, and two routes of another model in no plan — interactive and batch."""
    for pool in (world.primary, world.candidate):
        pool_model_create(actor=system, pool=pool, model_id=OTHER, max_context_tokens=8192)
    make = lambda name, model, cls: traffic.route_create(  # noqa: E731
        actor=system, name=name, model_id=model, latency_class=cls,
        primary_pool=world.primary)
    made = {"llama": world.route, "llama-batch": make("llama-batch", MODEL, "batch"),
            "qwen": make("qwen", OTHER, "interactive"),
            "qwen-batch": make("qwen-batch", OTHER, "batch")}
    # Stage 1's gate wants every plan route carried by a gateway.
    traffic.gateway_set_routes(actor=system, gateway=Gateway.objects.get(name="envoy-a"),
                               routes=list(made.values()))
    return made


@pytest.fixture
def plan(world, routes):
    return world.plan(routes=[routes["llama"], routes["llama-batch"]])


def share(world, name: str, percent: float, who: str = "oncall"):
    """Give the candidate `percent` of route `name` (the rest to the primary)."""
    route = Route.objects.get(name=name)
    return traffic.revision_create(
        actor=world.actor(who), route=route, base_revision=route.revision_number,
        weights={"h200-us": 100 - percent, "mi300x-us": percent}, reason=f"{percent} %")


def held(name: str) -> int:
    current = traffic_selectors.revision_current(route=Route.objects.get(name=name))
    return current.weights.get("mi300x-us", 0) if current else 0


def refused(world, name: str) -> str:
    with pytest.raises(ValidationError) as caught:
        share(world, name, 10)
    return caught.value.message_dict["weights"][0]


def test_stage_3_candidate_carries_only_its_plans_batch_routes(world, plan):
    walk_to(world, plan, 3)
    assert share(world, "llama-batch", 40).weights == {"h200-us": 6000, "mi300x-us": 4000}
    own = refused(world, "llama")
    assert ("candidate of plan mi300x-llama, which is at stage 3 (batch); live weight needs "
            "stage 4 (live) on any interactive route") in own
    assert "only the plan's batch-class routes (llama-batch)" in own
    assert "live weight needs stage 4 (live) on any interactive route" in refused(world, "qwen")
    assert "qwen-batch is not one of them" in refused(world, "qwen-batch")
    assert (held("llama"), held("qwen"), held("qwen-batch")) == (0, 0, 0)


def test_below_stage_3_the_candidate_carries_nothing_anywhere(world, plan):
    walk_to(world, plan, 2)
    for name in ("llama", "llama-batch", "qwen", "qwen-batch"):
        assert ("candidate of plan mi300x-llama, which is at stage 2 (shadow); live weight "
                "needs stage 4 (live) on any route, stage 3 (batch) only on the plan's "
                "batch-class routes (llama-batch)") in refused(world, name), name
        assert held(name) == 0
    # Through REST: a 400 with the reason, nothing stored.
    client = APIClient()
    client.force_login(world.oncall)
    before = Route.objects.get(name="qwen").revision_number
    answer = client.post("/api/v1/routes/qwen/revisions/", {
        "weights": {"h200-us": 90, "mi300x-us": 10}, "base_revision": before,
        "reason": "try"}, format="json")
    assert answer.status_code == 400, answer.content
    assert "stage 2 (shadow)" in answer.json()["error"]["message"]
    assert Route.objects.get(name="qwen").revision_number == before


def test_a_paused_stage_3_plan_holds_its_candidate_off_every_route(world, plan):
    plan = walk_to(world, plan, 3)
    services.pause(actor=world.actor("oncall"), plan=plan, reason="incident")
    assert "paused at stage 3" in refused(world, "llama-batch")


def test_stage_4_allows_interactive_weight_on_any_route(world, plan):
    walk_to(world, plan, 4)
    assert share(world, "llama", 10).weights["mi300x-us"] == 1000
    assert share(world, "qwen", 20).weights["mi300x-us"] == 2000
    assert share(world, "qwen-batch", 30).weights["mi300x-us"] == 3000


def test_another_open_plan_below_stage_4_holds_the_pool_back_everywhere(world, plan, routes):
    """Per pool: the candidate's stage-4 plan does not lift a second plan's stage 2."""
    plan = walk_to(world, plan, 4)
    second = world.plan(name="mi300x-qwen", routes=[routes["qwen"]])
    assert second.state == "stage-1"
    assert "plan mi300x-qwen, which is at stage 1" in refused(world, "llama")


def test_drains_are_never_blocked(world, plan):
    plan = walk_to(world, plan, 3)
    share(world, "llama-batch", 40)
    # Held weight the guard now refuses (the plan set back without its drain, as a plan
    # edited outside the services would be): lowering it and draining it still go through.
    Plan.objects.filter(pk=plan.pk).update(state=Plan.State.STAGE_2, stage=2)
    with pytest.raises(ValidationError, match=r"stage 2 \(shadow\)"):
        share(world, "llama-batch", 50)
    assert share(world, "llama-batch", 20).weights["mi300x-us"] == 2000
    drain = traffic.drain_request(actor=world.actor("oncall"), pool=world.candidate,
                                  reason="off")
    assert drain.drained_pools == ["mi300x-us"] and held("llama-batch") == 0


@pytest.mark.parametrize("leave", ["regress", "pause", "abandon"])
def test_leaving_stage_3_drains_the_candidate(world, plan, leave):
    plan = walk_to(world, plan, 3)
    share(world, "llama-batch", 40)
    lead = world.actor("lead")
    if leave == "regress":
        plan = services.regress(actor=lead, plan=plan, to_stage=2, reason="soak failed")
    elif leave == "pause":
        plan = services.pause(actor=world.actor("oncall"), plan=plan, reason="incident")
    else:
        plan = services.abandon(actor=lead, plan=plan, reason="too slow")
    drain = StageMove.objects.get(plan=plan, kind=leave).drains.get()
    assert drain.drained_pools == ["mi300x-us"]
    assert "leaves stage 3" in drain.reason
    assert held("llama-batch") == 0


def test_stage_4_to_3_keeps_the_batch_route_and_drains_every_interactive_one(world, plan):
    plan = walk_to(world, plan, 4)
    for name, percent in (("llama", 10), ("llama-batch", 30), ("qwen", 20)):
        share(world, name, percent)
    plan = services.regress(actor=world.actor("lead"), plan=plan, to_stage=3,
                            reason="p95 over the SLO")
    drain = StageMove.objects.get(plan=plan, kind="regress").drains.get()
    assert sorted(r.route.name for r in drain.revisions.all()) == ["llama", "qwen"]
    assert (held("llama"), held("llama-batch"), held("qwen")) == (0, 3000, 0)
    # Back at stage 4 and completed: no rule holds the pool back any more.
    plan = pass_gate(world, plan)
    assert share(world, "qwen", 5).weights["mi300x-us"] == 500


def test_a_plan_is_refused_while_its_candidate_carries_weight_on_any_route(world, routes):
    share(world, "qwen", 10)
    with pytest.raises(ConflictError, match=r"mi300x-us already carries 10 % of route qwen; "
                                            r"a candidate starts with no live weight on any "
                                            r"route\. Drain it first"):
        world.plan(routes=[routes["llama"], routes["llama-batch"]])
    client = APIClient()
    client.force_login(world.author)
    answer = client.post("/api/v1/plans/", {
        "name": "mi300x-llama", "candidate_pool": "mi300x-us", "primary_pool": "h200-us",
        "routes": ["llama"], "slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60,
        "slo_error_rate": 0.01}, format="json")
    assert answer.status_code == 409, answer.content
    assert "route qwen" in answer.json()["error"]["message"]
    assert not Plan.objects.exists()


def test_ramps_follow_the_guard_and_a_plans_ramp_waits_for_stage_4(world, plan, routes):
    """At stage 3 a ramp may raise the candidate on the plan's batch route with the guard's
    thresholds given; naming the plan is refused (its ramp evidence is stage 4's), and an
    interactive route is refused by the guard."""
    plan = walk_to(world, plan, 3)
    steps = [{"percent": 10, "hold_s": 30}]
    with pytest.raises(ValidationError, match="needs stage 4"):
        ramp_create(actor=world.actor("oncall"), route=routes["llama-batch"],
                    pool=world.candidate, steps=steps, plan=plan, **THRESHOLDS)
    ramp = ramp_create(actor=world.actor("oncall"), route=routes["llama-batch"],
                       pool=world.candidate, steps=steps, **THRESHOLDS)
    assert ramp.plan is None
    with pytest.raises(ValidationError) as caught:
        ramp_create(actor=world.actor("oncall"), route=routes["qwen"], pool=world.candidate,
                    steps=steps, **THRESHOLDS)
    assert "on any interactive route" in caught.value.message_dict["pool"][0]
