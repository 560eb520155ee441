"""Which pools batch jobs may target (fleetctl/batch/targets.py): the candidate of an open plan
only from stage 3 on; a primary, a pool in no plan and a closed plan's candidate always. The
plan is moved through its gates by the services, as people move it."""

from __future__ import annotations

import pytest

from fleetctl.batch.targets import job_target_refusal
from migrations_plan import services
from tests.migrations_plan.conftest import World, world  # noqa: F401
from tests.migrations_plan.helpers import pass_gate, walk_to


def test_a_candidate_below_stage_3_is_refused_with_its_plan_and_stage(world: World):  # noqa: F811
    plan = world.plan()
    assert job_target_refusal(world.candidate) == (
        "mi300x-us is the candidate of plan mi300x-llama, which is at stage 1 (abstraction); "
        "batch jobs on its candidate need stage 3 (batch). Advance the plan to stage 3 first.")
    plan = walk_to(world, plan, 2)
    assert "which is at stage 2 (shadow); batch jobs on its candidate need stage 3" in \
        (job_target_refusal(world.candidate) or "")
    services.pause(actor=world.actor("oncall"), plan=plan, reason="incident")
    assert "which is paused at stage 2 (shadow)" in (job_target_refusal(world.candidate) or "")
    # The primary, and a pool in no plan, are not the rule's business.
    assert job_target_refusal(world.primary) is None


@pytest.mark.parametrize("stage", [3, 4])
def test_from_stage_3_the_candidate_takes_batch_jobs(world: World, stage: int):  # noqa: F811
    plan = walk_to(world, world.plan(), stage)
    assert job_target_refusal(world.candidate) is None
    # Paused there: it already proved what stage 2 asks, so its batch work may go on.
    services.pause(actor=world.actor("oncall"), plan=plan, reason="look at the p95")
    assert job_target_refusal(world.candidate) is None


def test_closed_plans_do_not_hold_the_pool_back(world: World):  # noqa: F811
    plan = world.plan()
    services.abandon(actor=world.actor("lead"), plan=plan, reason="wrong pool")
    assert job_target_refusal(world.candidate) is None
    done = walk_to(world, world.plan(name="mi300x-llama-2"), 4)
    assert pass_gate(world, done).state == "completed"
    assert job_target_refusal(world.candidate) is None


def test_a_second_open_plan_below_stage_3_refuses_even_with_one_at_stage_3(
    world: World, make_pool, system  # noqa: F811
):
    from fleetctl.fleet.services import pool_model_create
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic.models import Gateway

    walk_to(world, world.plan(), 3)
    pool_model_create(actor=system, pool=world.primary, model_id="qwen-2.5-7b-instruct",
                      max_context_tokens=8192)
    pool_model_create(actor=system, pool=world.candidate, model_id="qwen-2.5-7b-instruct",
                      max_context_tokens=8192)
    qwen = traffic.route_create(actor=system, name="qwen", model_id="qwen-2.5-7b-instruct",
                                primary_pool=world.primary)
    traffic.gateway_set_routes(actor=system, gateway=Gateway.objects.get(name="envoy-a"),
                               routes=[world.route, qwen])
    world.plan(name="mi300x-qwen", routes=[qwen])
    assert "plan mi300x-qwen, which is at stage 1" in (job_target_refusal(world.candidate) or "")
