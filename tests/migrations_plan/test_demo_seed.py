"""The demo's plans, as `make demo` seeds them: what a second platform lead can and cannot
approve, and why."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from fleetctl.accounts.actor import Actor
from fleetctl.core.errors import ConflictError
from migrations_plan import evidence as ev
from migrations_plan import services
from migrations_plan.models import Plan


@pytest.fixture
def seeded(db):
    args = ["demo_seed", "--password", "demo-pw", "--gateway-admin", "http://127.0.0.1:1",
            "--gateway-config-dir", "/tmp/fleetctl-demo-test"]
    call_command(*args)
    call_command(*args)  # idempotent
    return Actor(user=User.objects.get(username="lead2"))


def test_the_demo_plan_sits_in_stage_2_with_a_partly_green_gate(seeded):
    plan = Plan.objects.get(name="mi300x-llama-8b")
    assert plan.state == "stage-2"
    gate = ev.evaluate_gate(plan)
    statuses = {o.check.key: o.status for o in gate.outcomes}
    assert statuses["the-model-reaches-the-candidate-only-through-a-route"] == ev.PASS
    assert statuses["dashboards"] == ev.AWAITING
    assert statuses["benchmark-slo"] == ev.INSUFFICIENT
    assert Plan.objects.count() == 2


def test_the_second_lead_can_approve_what_is_ready_and_not_what_is_not(seeded):
    # The seed fabricates no evidence: the A100's conformance check waits for its real probe
    # (make demo queues one; tests/conformance/test_demo.py runs it and sees it block).
    a100 = Plan.objects.get(name="a100-llama-8b")
    conformance = next(o for o in ev.evaluate_gate(a100, stage=1).outcomes
                       if o.check.key == "conformance")
    assert conformance.status == ev.INSUFFICIENT
    assert not a100.candidate_pool.evidence.filter(kind="conformance").exists()
    mi300x = Plan.objects.get(name="mi300x-llama-8b")
    with pytest.raises(ConflictError, match="Awaiting attestation"):
        services.approve(actor=seeded, plan=mi300x, justification="benchmarks come later on")
    services.attest(actor=seeded, check=mi300x.checks.get(stage=2, key="dashboards"),
                    note="Grafana board and alerts exist")
    approval = services.approve(actor=seeded, plan=mi300x,
                                justification="benchmarks come with a later issue")
    assert approval.gate_status == ev.INSUFFICIENT
