"""`fleetctl plans list | show`, run as a real process against a live server."""

from __future__ import annotations

import json

import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.traffic import services as traffic
from migrations_plan import services
from migrations_plan.models import Plan
from tests.cli.test_cli import run
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


@pytest.fixture
def plans(transactional_db, world: World) -> World:  # noqa: F811 - the fixture
    """One plan at stage 1 approved by bob (with a justification), one paused."""
    plan = world.plan()
    services.approve(actor=world.actor("lead"), plan=plan,
                     justification="conformance evidence arrives with a later issue")
    services.evidence_record(actor=Actor.for_system("conformance-probe"), pool=world.candidate,
                             kind="conformance", verdict="pass", summary="42/42 probes pass",
                             source="conformance run 4")
    batch = traffic.route_create(actor=Actor.for_system("test"), name="llama-batch",
                                 model_id=MODEL, latency_class="batch",
                                 primary_pool=world.primary)
    paused = world.plan(name="paused-plan", routes=[batch])
    services.pause(actor=world.actor("oncall"), plan=paused, reason="incident")
    return world


@pytest.fixture
def viewer_token(plans: World) -> str:
    return token_create_personal(actor=Actor(user=plans.viewer), name="cli",
                                 scopes=["read"]).secret


def test_plans_list_prints_each_plan_with_its_gate_progress(live_server, viewer_token):
    table = run(live_server, "plans", "list", token=viewer_token)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["NAME", "STATE", "CANDIDATE", "PRIMARY", "ROUTES"]
    row = next(line for line in lines if line.startswith("mi300x-llama"))
    assert "stage-1" in row and "mi300x-us" in row and "llama" in row
    # Routing and conformance pass; cost and 24 h of health are still to come.
    assert "2/5 pass · insufficient data" in row
    assert any(line.startswith("paused-plan") and "paused" in line for line in lines)

    paused = run(live_server, "plans", "list", "--state", "paused", "--json", token=viewer_token)
    assert paused.returncode == 0, paused.stderr
    assert [p["name"] for p in json.loads(paused.stdout)] == ["paused-plan"]


def test_plans_show_prints_the_checklist_and_the_approvals(live_server, viewer_token):
    shown = run(live_server, "plans", "show", "mi300x-llama", token=viewer_token)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "gate to leave stage 1 (abstraction): insufficient data · 2/5 pass" in out
    assert next(line for line in out.splitlines() if line.startswith("approvals")).endswith(
        "0 of 1 required")
    checklist = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "pass" in checklist and "insufficient data" in checklist
    assert "42/42 probes pass" in out and "Cost per 1M output tokens is reported" in out
    # Where each check's evidence comes from.
    assert "EVIDENCE FROM" in out.splitlines()[next(
        i for i, line in enumerate(out.splitlines()) if line.startswith("STATUS"))]
    conformance = next(line for line in out.splitlines() if "42/42 probes pass" in line)
    assert conformance.rstrip().endswith("measured by conformance run 4")
    healthy = next(line for line in out.splitlines() if "Candidate healthy" in line)
    assert healthy.rstrip().endswith("measured by the health probe")
    # Bob approved before the conformance evidence arrived: his approval no longer counts.
    approval = next(line for line in out.splitlines() if line.startswith("bob"))
    assert "no: check 'Passes the OpenAI-contract conformance probe'" in approval

    as_json = run(live_server, "plans", "show", "mi300x-llama", "--json", token=viewer_token)
    body = json.loads(as_json.stdout)
    assert body["gate"]["stage"] == 1 and len(body["gate"]["checks"]) == 5
    assert body["approvals"][0]["by"] == "bob" and body["approvals"][0]["counts"] is False


def test_plans_errors_are_one_line_and_exit_codes_say_whose_fault(live_server, viewer_token):
    missing = run(live_server, "plans", "show", "nope", token=viewer_token)
    assert missing.returncode == 1
    assert missing.stderr.startswith("fleetctl: HTTP 404") and len(
        missing.stderr.strip().splitlines()) == 1
    bad_state = run(live_server, "plans", "list", "--state", "stage-9", token=viewer_token)
    assert bad_state.returncode == 2 and "invalid choice" in bad_state.stderr
    no_token = run(live_server, "plans", "list")
    assert no_token.returncode == 2 and "FLEETCTL_TOKEN" in no_token.stderr


def test_a_gate_awaiting_an_attestation_reads_the_same_as_in_the_api(live_server, plans,
                                                                     viewer_token):
    plan = Plan.objects.get(name="mi300x-llama")
    for check in plan.checks.filter(stage=1):
        services.check_remove(actor=plans.actor("lead"), check=check, reason="not for this test")
    services.check_add(actor=plans.actor("lead"), plan=plan, stage=1, title="Runbook reviewed",
                       attest_role="on-call")
    table = run(live_server, "plans", "list", token=viewer_token)
    row = next(line for line in table.stdout.splitlines() if line.startswith("mi300x-llama"))
    assert "0/1 pass · awaiting attestation (blocked)" in row
    shown = run(live_server, "plans", "show", "mi300x-llama", token=viewer_token).stdout
    assert ("gate to leave stage 1 (abstraction): awaiting attestation (blocked: cannot be "
            "approved or advanced) · 0/1 pass") in shown
    as_json = json.loads(run(live_server, "plans", "show", "mi300x-llama", "--json",
                             token=viewer_token).stdout)
    assert (as_json["gate"]["status"], as_json["gate"]["blocks_advance"]) == (
        "awaiting-attestation", True)
