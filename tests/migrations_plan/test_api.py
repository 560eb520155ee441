"""Migration plans over REST: the same rules as the services, answered as 4xx a person can act
on, nothing changed, every refusal on the plan's record. Tokens read and record evidence;
they never approve, advance, attest or edit a gate."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal, token_create_service
from fleetctl.audit.models import AuditEvent
from fleetctl.traffic import services as traffic
from migrations_plan import services
from migrations_plan.gates import DEFAULT_GATES
from migrations_plan.models import Approval, Evidence, GateCheck, Plan, StageMove
from tests.migrations_plan.conftest import MODEL
from tests.migrations_plan.helpers import walk_to

DEFAULT_CHECKS = sum(len(checks) for checks in DEFAULT_GATES.values())

pytestmark = pytest.mark.django_db

TOKEN_REFUSAL = "'plan.approve' cannot be done with an API token; sign in to the dashboard."
JUSTIFIED = {"justification": "conformance evidence arrives with a later issue"}


def signed_in(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def personal_token(user, *scopes: str) -> APIClient:
    issued = token_create_personal(actor=Actor(user=user), name="cli", scopes=list(scopes))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    return client


def service_token(system, *scopes: str, name: str = "evidence-bot") -> APIClient:
    issued = token_create_service(actor=system, name=name, scopes=list(scopes))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    return client


def new_plan(world, **extra: Any) -> dict[str, Any]:
    return {"name": "mi300x-llama", "candidate_pool": world.candidate.name,
            "primary_pool": world.primary.name, "routes": [world.route.name],
            "slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60, "slo_error_rate": 0.01, **extra}


def denied(plan: Plan, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(object_type="migrations_plan.plan",
                                          object_id=str(plan.pk), action=action,
                                          outcome="denied"))


def checks_by_key(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["key"]: c for c in body["gate"]["checks"]}


def error(response) -> str:
    return response.json()["error"]["message"]


# --- opening a plan ---------------------------------------------------------------------------

def test_a_platform_lead_opens_a_plan_and_gets_it_back_with_its_first_gate(world):
    response = signed_in(world.author).post("/api/v1/plans/", new_plan(
        world, owner="carol", target_date="2026-12-01", required_approvals=2,
        notes="first AMD pool"), format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["state"], body["stage"], body["stage_name"]) == ("stage-1", 1, "abstraction")
    assert (body["candidate_pool"], body["primary_pool"], body["routes"]) == (
        "mi300x-us", "h200-us", ["llama"])
    assert (body["owner"], body["created_by"], body["required_approvals"]) == ("carol", "alice", 2)
    assert list(checks_by_key(body)) == ["conformance", "only-through-route", "cost-reported",
                                         "healthy", "same-revision"]
    assert body["approvals"] == []
    event = AuditEvent.objects.get(action="plan.create")
    assert (event.actor, (event.after or {})["routes"]) == ("alice", ["llama"])


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"candidate_pool": "tpu-v5"}, "candidate_pool", "No pool named tpu-v5"),
    ({"primary_pool": "nope"}, "primary_pool", "No pool named nope"),
    ({"routes": ["llama", "qwen", "mistral"]}, "routes", "No route named qwen, mistral"),
    ({"owner": "mallory"}, "owner", "No active user named mallory"),
    ({"slo_error_rate": 0.9}, "slo_error_rate", "slo_error_rate"),
    ({"slo_ttft_p95_ms": "fast"}, "slo_ttft_p95_ms", "valid number"),
    ({"name": "Not A Slug"}, "name", "name"),
    ({"name": 42}, "name", "Must be text"),
    ({"routes": []}, "routes", "at least one route"),
])
def test_bad_plans_are_refused_naming_what_is_wrong_and_nothing_is_stored(world, change, field,
                                                                          words):
    response = signed_in(world.author).post("/api/v1/plans/", new_plan(world, **change),
                                            format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    assert words in error(response)
    assert not Plan.objects.exists() and not GateCheck.objects.exists()


def test_a_primary_that_does_not_serve_the_model_is_refused_and_the_attempt_audited(world,
                                                                                     make_pool):
    make_pool(name="a100-us")
    response = signed_in(world.author).post("/api/v1/plans/",
                                            new_plan(world, primary_pool="a100-us"),
                                            format="json")
    assert response.status_code == 400
    assert "Primary a100-us does not serve model llama-3.1-8b-instruct of route llama" in error(
        response)
    assert response.json()["error"]["fields"]["routes"]
    assert not Plan.objects.exists()
    refusal = AuditEvent.objects.get(action="plan.create", outcome="denied")
    assert "a100-us does not serve" in refusal.message


def test_a_second_open_plan_for_the_same_candidate_and_route_is_a_409(world):
    world.plan()
    response = signed_in(world.lead).post("/api/v1/plans/", new_plan(world, name="again"),
                                          format="json")
    assert response.status_code == 409
    assert "Plan mi300x-llama" in error(response) and "one open plan per candidate" in error(
        response)
    assert list(Plan.objects.values_list("name", flat=True)) == ["mi300x-llama"]


def test_only_people_with_fleet_manage_open_plans(world, system):
    viewer = signed_in(world.viewer).post("/api/v1/plans/", new_plan(world), format="json")
    assert viewer.status_code == 403 and "'fleet.manage' needs a role" in error(viewer)
    bot = service_token(system, "read", "jobs", "fleet").post("/api/v1/plans/", new_plan(world),
                                                              format="json")
    assert bot.status_code == 403 and "needs a named person" in error(bot)
    assert not Plan.objects.exists()


# --- reading ----------------------------------------------------------------------------------

def test_a_plan_shows_its_current_gate_check_by_check(world):
    world.plan()
    response = signed_in(world.viewer).get("/api/v1/plans/mi300x-llama/")
    assert response.status_code == 200
    body = response.json()
    gate = body["gate"]
    assert (gate["stage"], gate["stage_name"], gate["status"]) == (1, "abstraction",
                                                                   "insufficient")
    assert gate["total"] == 5 and len(gate["snapshot_hash"]) == 64
    checks = checks_by_key(body)
    routing = checks["only-through-route"]
    assert (routing["kind"], routing["rule"], routing["status"]) == (
        "evidence", "routing.only_through_route", "pass")
    assert routing["numbers"] == {"gateways_by_route": {"llama": ["envoy-a"]}}
    assert routing["evidence"][0]["url"] == "/traffic/routes/llama/"
    conformance = checks["conformance"]
    assert conformance["params"] == {"kind": "conformance"}
    assert conformance["status"] == "insufficient"
    assert "No OpenAI-contract conformance evidence" in conformance["summary"]
    assert conformance["attestation"] is None
    assert body["required_approvals"] == 1 and body["approvals"] == []


def test_any_stage_gate_can_be_read_and_a_bad_stage_is_a_400(world):
    world.plan()
    viewer = signed_in(world.viewer)
    stage2 = viewer.get("/api/v1/plans/mi300x-llama/gates/2/").json()
    # No check fails: the gate awaits an attestation, and that blocks.
    assert (stage2["stage"], stage2["status"], stage2["blocks_advance"]) == (
        2, "awaiting-attestation", True)
    assert stage2["status_label"] == "awaiting attestation"
    dashboards = next(c for c in stage2["checks"] if c["key"] == "dashboards")
    assert (dashboards["kind"], dashboards["status"], dashboards["attest_role"]) == (
        "attested", "awaiting-attestation", "platform-lead")
    assert stage2["blockers"] == [dashboards["title"]]
    assert stage2["approvals"] == [] and stage2["required_approvals"] == 1
    for bad in ("5", "0", "live"):
        response = viewer.get(f"/api/v1/plans/mi300x-llama/gates/{bad}/")
        assert response.status_code == 400 and "Stages are 1–4" in error(response)
    assert viewer.get("/api/v1/plans/nope/gates/1/").status_code == 404


def test_the_list_filters_by_state_candidate_and_route(world, system):
    world.plan()
    batch = traffic.route_create(actor=system, name="llama-batch", model_id=MODEL,
                                 latency_class="batch", primary_pool=world.primary)
    other = world.plan(name="other-route", routes=[batch])
    services.pause(actor=world.actor("oncall"), plan=other, reason="incident on the primary")
    viewer = signed_in(world.viewer)

    def names(**params: str) -> list[str]:
        response = viewer.get("/api/v1/plans/", params)
        assert response.status_code == 200, response.json()
        return [p["name"] for p in response.json()["results"]]

    assert names() == ["mi300x-llama", "other-route"]
    assert names(state="paused") == ["other-route"]
    assert names(route="llama") == ["mi300x-llama"]
    assert names(candidate_pool="mi300x-us") == ["mi300x-llama", "other-route"]
    assert names(candidate_pool="h200-us") == []
    listed = viewer.get("/api/v1/plans/").json()
    assert listed["count"] == 2
    assert listed["results"][0]["gate"]["total"] == 5
    bad = viewer.get("/api/v1/plans/", {"state": "stage-9"})
    assert bad.status_code == 400 and "state" in bad.json()["error"]["fields"]


def test_tokens_with_read_scope_read_plans_and_without_it_cannot(world, system):
    world.plan()
    assert service_token(system, "read", "jobs").get(
        "/api/v1/plans/mi300x-llama/").status_code == 200
    refused = service_token(system, "jobs", name="jobs-only").get("/api/v1/plans/")
    assert refused.status_code == 403


# --- approving --------------------------------------------------------------------------------

def test_the_author_cannot_approve_their_own_plan(world):
    plan = world.plan()
    response = signed_in(world.author).post("/api/v1/plans/mi300x-llama/approve/", JUSTIFIED,
                                            format="json")
    assert response.status_code == 403
    assert "separation of duties" in error(response)
    assert not Approval.objects.exists()
    assert "separation of duties" in denied(plan, "plan.approve")[0].message


def test_the_owner_cannot_approve_either(world):
    plan = world.plan(owner=world.lead)
    response = signed_in(world.lead).post("/api/v1/plans/mi300x-llama/approve/", JUSTIFIED,
                                          format="json")
    assert response.status_code == 403 and "You own plan mi300x-llama" in error(response)
    assert not Approval.objects.exists() and denied(plan, "plan.approve")


def test_the_author_cannot_advance_their_own_plan_after_another_lead_approved(world):
    plan = world.plan()
    assert signed_in(world.lead).post("/api/v1/plans/mi300x-llama/approve/", JUSTIFIED,
                                      format="json").status_code == 200
    response = signed_in(world.author).post("/api/v1/plans/mi300x-llama/advance/",
                                            {"reason": "approved, so I ship it"}, format="json")
    assert response.status_code == 403
    assert error(response) == ("You opened plan mi300x-llama; separation of duties: another "
                               "platform lead must advance it.")
    assert response.json()["error"]["code"] == "permission_denied"
    plan.refresh_from_db()
    assert plan.state == "stage-1"
    assert [e.actor for e in denied(plan, "plan.advance")] == ["alice"]


def test_a_viewer_cannot_approve(world):
    plan = world.plan()
    response = signed_in(world.viewer).post("/api/v1/plans/mi300x-llama/approve/", JUSTIFIED,
                                            format="json")
    assert response.status_code == 403
    assert "'plan.approve' needs a role that grants it; you have viewer" in error(response)
    assert not Approval.objects.exists()
    assert denied(plan, "plan.approve")[0].actor == "vic"


@pytest.mark.parametrize("kind", ["personal", "service"])
def test_no_token_can_approve_advance_attest_or_edit_a_gate(world, system, kind):
    plan = world.plan()
    attested = plan.checks.get(stage=2, key="dashboards")
    scopes = ("read", "jobs", "ramp", "drain", "fleet")
    client = (personal_token(world.lead, *scopes) if kind == "personal"
              else service_token(system, *scopes))
    base = "/api/v1/plans/mi300x-llama"
    attempts = {
        "plan.approve": client.post(f"{base}/approve/", JUSTIFIED, format="json"),
        "plan.advance": client.post(f"{base}/advance/", {"reason": "ship it"}, format="json"),
        "plan.check.add": client.post(f"{base}/checks/", {
            "stage": 1, "rule": "pool.healthy_for", "params": {"hours": 1}}, format="json"),
        "plan.check.update": client.patch(f"{base}/checks/{attested.pk}/", {"title": "x"},
                                          format="json"),
        "plan.check.remove": client.post(f"{base}/checks/{attested.pk}/remove/",
                                         {"reason": "not needed"}, format="json"),
        "plan.update": client.patch(f"{base}/", {"required_approvals": 1}, format="json"),
        "plan.regress": client.post(f"{base}/regress/", {"stage": 1, "reason": "x"},
                                    format="json"),
        "plan.abandon": client.post(f"{base}/abandon/", {"reason": "x"}, format="json"),
    }
    for action, response in attempts.items():
        assert response.status_code == 403, (action, response.json())
        assert error(response) == TOKEN_REFUSAL, action
        assert denied(plan, action), action
    attest = client.post(f"{base}/checks/{attested.pk}/attest/",
                         {"note": "dashboards exist"}, format="json")
    assert attest.status_code == 403
    assert "not with a token" in error(attest) or "needs a named person" in error(attest)
    plan.refresh_from_db()
    assert plan.state == "stage-1" and plan.required_approvals == 1
    assert not Approval.objects.exists() and not attested.attestations.exists()
    assert plan.checks.filter(removed_at__isnull=False).count() == 0
    assert plan.checks.count() == DEFAULT_CHECKS


def test_an_insufficient_gate_needs_a_written_justification_naming_the_checks(world):
    plan = world.plan()
    bob = signed_in(world.lead)
    response = bob.post("/api/v1/plans/mi300x-llama/approve/", {}, format="json")
    assert response.status_code == 400
    message = error(response)
    assert "Passes the OpenAI-contract conformance probe: insufficient data" in message
    assert "Cost per 1M output tokens is reported: insufficient data" in message
    assert "justification" in response.json()["error"]["fields"]
    assert not Approval.objects.exists()
    assert denied(plan, "plan.approve")


def test_a_failing_gate_cannot_be_approved_even_with_a_justification(world, system):
    plan = world.plan()
    services.evidence_record(actor=system, pool=world.candidate, kind="conformance",
                             verdict="fail", summary="tool calls come back as plain text")
    response = signed_in(world.lead).post("/api/v1/plans/mi300x-llama/approve/", JUSTIFIED,
                                          format="json")
    assert response.status_code == 409
    assert ("Passes the OpenAI-contract conformance probe — tool calls come back as plain text"
            in error(response))
    assert not Approval.objects.exists() and denied(plan, "plan.approve")


def test_approve_then_advance_moves_the_plan_and_records_who_and_on_what(world):
    plan = world.plan()
    bob = signed_in(world.lead)
    early = bob.post("/api/v1/plans/mi300x-llama/advance/", {"reason": "go"}, format="json")
    assert early.status_code == 409
    assert "needs 1 approval(s) on the current evidence; it has 0" in error(early)
    assert denied(plan, "plan.advance")

    approved = bob.post("/api/v1/plans/mi300x-llama/approve/", JUSTIFIED, format="json")
    assert approved.status_code == 200, approved.json()
    [approval] = approved.json()["approvals"]
    assert (approval["by"], approval["gate_status"], approval["counts"], approval["why_not"]) == (
        "bob", "insufficient", True, None)
    assert approval["snapshot_hash"] == approved.json()["gate"]["snapshot_hash"]
    twice = bob.post("/api/v1/plans/mi300x-llama/approve/", JUSTIFIED, format="json")
    assert twice.status_code == 409 and "already approved" in error(twice)

    moved = bob.post("/api/v1/plans/mi300x-llama/advance/", {"reason": "gate approved"},
                     format="json")
    assert moved.status_code == 200, moved.json()
    assert (moved.json()["state"], moved.json()["gate"]["stage"]) == ("stage-2", 2)
    [move] = bob.get("/api/v1/plans/mi300x-llama/moves/").json()["results"]
    assert (move["kind"], move["from_state"], move["to_state"], move["by"]) == (
        "advance", "stage-1", "stage-2", "bob")
    assert move["approved_by"] == ["bob"] and move["gate_status"] == "insufficient"
    assert move["snapshot_hash"] == approval["snapshot_hash"] and move["drains"] == []
    history = bob.get("/api/v1/plans/mi300x-llama/approvals/").json()["results"]
    assert [(a["stage"], a["active"]) for a in history] == [(1, False)]
    assert history[0]["used_at"] is not None and history[0]["snapshot"]["stage"] == 1


def test_an_approval_shows_the_evidence_it_bound_to_in_the_api_and_on_the_page(world, system):
    """An auditor asking "who approved this, on which evidence" gets both: each approval lists
    the evidence its snapshot bound to, with links, in GET /plans/<name>/ and on the page."""
    from django.test import Client

    world.plan()
    services.evidence_record(actor=system, pool=world.candidate, kind="conformance",
                             verdict="pass", summary="20 of 20 cases pass",
                             url="/conformance/runs/7/", source="conformance run 7")
    row = Evidence.objects.get(kind="conformance")
    bob = signed_in(world.lead)
    assert bob.post("/api/v1/plans/mi300x-llama/approve/", JUSTIFIED,
                    format="json").status_code == 200
    [approval] = bob.get("/api/v1/plans/mi300x-llama/").json()["approvals"]
    [seen] = [e for e in approval["evidence"] if e["ref"] == f"evidence:{row.pk}"]
    assert (seen["check"], seen["check_status"], seen["kind"], seen["url"]) == (
        "conformance", "pass", "conformance", "/conformance/runs/7/")
    assert "20 of 20 cases pass" in seen["label"] and seen["observed_at"]

    page = Client()
    page.force_login(world.lead)
    html = page.get("/plans/mi300x-llama/").content.decode()
    assert "Evidence it saw" in html
    assert 'href="/conformance/runs/7/"' in html


def test_a_plan_needing_two_approvers_waits_for_the_second(world):
    world.plan(required_approvals=2)
    base = "/api/v1/plans/mi300x-llama"
    assert signed_in(world.lead).post(f"{base}/approve/", JUSTIFIED,
                                      format="json").status_code == 200
    waiting = signed_in(world.lead).post(f"{base}/advance/", {}, format="json")
    assert waiting.status_code == 409 and "needs 2 approval(s)" in error(waiting)
    assert "it has 1" in error(waiting)
    both = signed_in(world.lead2).post(f"{base}/approve/", JUSTIFIED, format="json").json()
    assert sorted(a["by"] for a in both["approvals"] if a["counts"]) == ["bob", "carol"]
    moved = signed_in(world.lead2).post(f"{base}/advance/", {}, format="json")
    assert moved.status_code == 200 and moved.json()["state"] == "stage-2"
    assert StageMove.objects.get().approvals.count() == 2


def test_an_approval_stops_counting_when_the_evidence_changes_and_says_why(world, system):
    world.plan()
    bob = signed_in(world.lead)
    bob.post("/api/v1/plans/mi300x-llama/approve/", JUSTIFIED, format="json")
    services.evidence_record(actor=system, pool=world.candidate, kind="conformance",
                             verdict="pass", summary="42/42 contract probes pass")
    [approval] = bob.get("/api/v1/plans/mi300x-llama/").json()["approvals"]
    assert approval["counts"] is False
    assert "Passes the OpenAI-contract conformance probe" in approval["why_not"]
    assert "insufficient data to pass" in approval["why_not"]


# --- leaving a stage --------------------------------------------------------------------------

def test_regress_pause_resume_and_abandon_over_the_api(world):
    plan = walk_to(world, world.plan(), 2)
    base = "/api/v1/plans/mi300x-llama"
    bob, olga = signed_in(world.lead), signed_in(world.oncall)

    forward = bob.post(f"{base}/regress/", {"stage": 3, "reason": "wrong way"}, format="json")
    assert forward.status_code == 400 and "Regress goes back" in error(forward)
    unsaid = olga.post(f"{base}/pause/", {}, format="json")
    assert unsaid.status_code == 400 and "Say why" in error(unsaid)
    assert denied(plan, "plan.pause")
    back = bob.post(f"{base}/regress/", {"stage": 1, "reason": "conformance regressed"},
                    format="json")
    assert back.status_code == 200 and back.json()["state"] == "stage-1"

    paused = olga.post(f"{base}/pause/", {"reason": "incident on the candidate"}, format="json")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    assert olga.post(f"{base}/approve/", JUSTIFIED, format="json").status_code == 403
    not_at_stage = bob.post(f"{base}/approve/", JUSTIFIED, format="json")
    assert not_at_stage.status_code == 409 and "resume it first" in error(not_at_stage)
    resumed = bob.post(f"{base}/resume/", {"reason": "incident closed"}, format="json")
    assert resumed.status_code == 200 and resumed.json()["state"] == "stage-1"

    gone = bob.post(f"{base}/abandon/", {"reason": "vendor withdrew the pool"}, format="json")
    assert gone.status_code == 200
    assert (gone.json()["state"], gone.json()["closed_at"] is not None) == ("abandoned", True)
    closed = bob.patch(f"{base}/", {"notes": "too late"}, format="json")
    assert closed.status_code == 409 and "a closed plan cannot be changed" in error(closed)
    moves = bob.get(f"{base}/moves/").json()["results"]
    assert [m["kind"] for m in moves] == ["abandon", "resume", "pause", "regress", "advance"]
    timeline = bob.get(f"{base}/timeline/").json()["results"]
    refused = [e for e in timeline if e["outcome"] == "denied"]
    assert {e["action"] for e in refused} >= {"plan.regress", "plan.pause", "plan.approve",
                                              "plan.update"}


# --- editing terms and gates ------------------------------------------------------------------

def test_a_lead_changes_the_terms_but_not_what_the_plan_is(world):
    world.plan()
    bob = signed_in(world.lead)
    changed = bob.patch("/api/v1/plans/mi300x-llama/",
                        {"required_approvals": 2, "slo_ttft_p95_ms": 900, "owner": "carol"},
                        format="json")
    assert changed.status_code == 200, changed.json()
    body = changed.json()
    assert (body["required_approvals"], body["slo_ttft_p95_ms"], body["owner"]) == (2, 900, "carol")
    fixed = bob.patch("/api/v1/plans/mi300x-llama/", {"candidate_pool": "h200-us"},
                      format="json")
    assert fixed.status_code == 400 and "candidate_pool" in fixed.json()["error"]["fields"]
    assert "cannot be changed once the plan is open" in error(fixed)
    typo = bob.patch("/api/v1/plans/mi300x-llama/", {"slo_ttft_ms": 900}, format="json")
    assert typo.status_code == 400 and "slo_ttft_ms: Unknown field" in error(typo)
    out_of_range = bob.patch("/api/v1/plans/mi300x-llama/", {"required_approvals": 9},
                             format="json")
    assert out_of_range.status_code == 400
    assert "required_approvals" in out_of_range.json()["error"]["fields"]
    empty = bob.patch("/api/v1/plans/mi300x-llama/", {}, format="json")
    assert empty.status_code == 400 and "Nothing to change" in error(empty)
    assert signed_in(world.viewer).patch("/api/v1/plans/mi300x-llama/", {"notes": "x"},
                                         format="json").status_code == 403
    assert Plan.objects.get().owner == world.lead2


def test_gate_checks_are_added_tuned_removed_and_attested_with_the_record_kept(world):
    plan = world.plan()
    bob = signed_in(world.lead)
    base = "/api/v1/plans/mi300x-llama/checks"
    added = bob.post(f"{base}/", {"stage": 1, "rule": "pool.healthy_for",
                                  "params": {"hours": 48}}, format="json")
    assert added.status_code == 201, added.json()
    check = added.json()
    assert (check["title"], check["params"], check["added_by"]) == (
        "Candidate healthy for 48 h", {"hours": 48.0}, "bob")

    unknown = bob.post(f"{base}/", {"stage": 1, "rule": "gpu.vibes"}, format="json")
    assert unknown.status_code == 400 and "Unknown rule 'gpu.vibes'" in error(unknown)
    assert "pool.healthy_for" in error(unknown)
    bad_param = bob.post(f"{base}/", {"stage": 1, "rule": "pool.healthy_for",
                                      "params": {"hours": -1}}, format="json")
    assert bad_param.status_code == 400 and "hours: at least 0.01" in error(bad_param)
    both = bob.post(f"{base}/", {"stage": 1, "title": "x", "rule": "pool.healthy_for",
                                 "attest_role": "on-call"}, format="json")
    assert both.status_code == 400 and "either evidence-backed" in error(both)

    tuned = bob.patch(f"{base}/{check['id']}/", {"params": {"hours": 12}}, format="json")
    assert tuned.status_code == 200 and tuned.json()["params"] == {"hours": 12.0}
    unsaid = bob.post(f"{base}/{check['id']}/remove/", {}, format="json")
    assert unsaid.status_code == 400 and "Say why" in error(unsaid)
    removed = bob.post(f"{base}/{check['id']}/remove/", {"reason": "duplicate of healthy"},
                       format="json")
    assert removed.status_code == 200
    assert (removed.json()["removed_by"], removed.json()["removed_reason"]) == (
        "bob", "duplicate of healthy")
    again = bob.post(f"{base}/{check['id']}/remove/", {"reason": "twice"}, format="json")
    assert again.status_code == 409

    listed = bob.get(f"{base}/", {"page_size": 100}).json()
    assert listed["count"] == DEFAULT_CHECKS + 1
    assert any(c["id"] == check["id"] and c["removed_at"] for c in listed["results"])
    assert bob.patch(f"{base}/999999/", {"title": "x"}, format="json").status_code == 404

    dashboards = plan.checks.get(stage=2, key="dashboards")
    by_oncall = signed_in(world.oncall).post(f"{base}/{dashboards.pk}/attest/",
                                             {"note": "dashboards exist"}, format="json")
    assert by_oncall.status_code == 403 and "attested by a platform-lead" in error(by_oncall)
    attested = bob.post(f"{base}/{dashboards.pk}/attest/",
                        {"note": "Grafana board and alerts exist"}, format="json")
    assert attested.status_code == 201, attested.json()
    assert attested.json()["attestations"][0]["by"] == "bob"
    stage2 = bob.get("/api/v1/plans/mi300x-llama/gates/2/").json()
    shown = next(c for c in stage2["checks"] if c["key"] == "dashboards")
    assert shown["status"] == "pass" and shown["attestation"]["note"] == (
        "Grafana board and alerts exist")
    evidence_backed = plan.checks.get(stage=1, key="conformance")
    wrong_kind = bob.post(f"{base}/{evidence_backed.pk}/attest/", {"note": "looks fine"},
                          format="json")
    assert wrong_kind.status_code == 400 and "its rule decides it" in error(wrong_kind)
    assert {"plan.check.add", "plan.check.update", "plan.check.remove", "plan.attest"} <= set(
        AuditEvent.objects.filter(outcome="ok").values_list("action", flat=True))


# --- evidence ---------------------------------------------------------------------------------

def test_a_measured_kind_cannot_be_posted_and_the_answer_says_what_to_post(world, system):
    world.plan()
    bot = service_token(system, "read", "jobs")
    for kind, measured_by in (("conformance", "nothing in this version"),
                              ("benchmark", "benchmark runs"), ("shadow", "none"),
                              ("eval", "none"), ("soak", "none"), ("ramp-slo", "none"),
                              ("checkpoint-resume", "none"), ("cost-arbitrage", "none"),
                              ("health", "the health probe")):
        response = bot.post("/api/v1/evidence/", {
            "pool": "mi300x-us", "kind": kind, "verdict": "pass", "summary": "42/42 pass"},
            format="json")
        assert response.status_code == 400, (kind, response.json())
        body = response.json()["error"]
        assert list(body["fields"]) == ["kind"]
        assert body["message"].startswith(f"kind: {kind} is measured by fleetctl, not posted")
        assert f"post kind 'external' with about={kind!r}" in body["message"]
        if measured_by != "none" and measured_by != "nothing in this version":
            assert measured_by in body["message"]
    assert not Evidence.objects.exists()
    checks = checks_by_key(bot.get("/api/v1/plans/mi300x-llama/").json())
    assert checks["conformance"]["status"] == "insufficient"
    assert AuditEvent.objects.filter(action="evidence.record", outcome="denied").count() == 9


def test_a_report_is_shown_as_reported_by_its_system_and_never_satisfies_a_measured_check(
    world, system
):
    world.plan()
    bot = service_token(system, "read", "jobs")
    response = bot.post("/api/v1/evidence/", {
        "pool": "mi300x-us", "kind": "external", "reported_by": "ci-contract-suite",
        "about": "conformance", "verdict": "pass", "summary": "42/42 contract probes pass",
        "data": {"probes": 42, "failed": 0}, "url": "https://ci.example/runs/7",
        "ttl_hours": 72}, format="json")
    assert response.status_code == 201, response.json()
    row = response.json()
    assert (row["kind"], row["origin"], row["reported_by"], row["about"], row["source"]) == (
        "external", "reported", "ci-contract-suite", "conformance", "service:evidence-bot")
    assert row["source_label"] == "reported by ci-contract-suite"
    assert row["pool_fingerprint"]["driver"] == "6.4.1" and row["expires_at"]
    conformance = checks_by_key(bot.get("/api/v1/plans/mi300x-llama/").json())["conformance"]
    assert conformance["status"] == "insufficient"
    assert ("Reported by ci-contract-suite: pass — not measured by fleetctl (42/42 contract "
            "probes pass).") in conformance["summary"]
    [ref] = conformance["evidence"]
    assert (ref["ref"], ref["origin"], ref["source"], ref["source_label"], ref["url"]) == (
        f"evidence:{row['id']}", "reported", "ci-contract-suite",
        "reported by ci-contract-suite", "https://ci.example/runs/7")
    listed = bot.get("/api/v1/evidence/", {"kind": "external", "pool": "mi300x-us"}).json()
    assert [e["id"] for e in listed["results"]] == [row["id"]]
    assert bot.get("/api/v1/evidence/", {"kind": "conformance"}).json()["count"] == 0
    assert bot.get("/api/v1/evidence/", {"about": "conformance"}).json()["count"] == 1
    assert bot.get("/api/v1/evidence/", {"reported_by": "someone-else"}).json()["count"] == 0
    event = AuditEvent.objects.get(action="evidence.record", outcome="ok")
    assert event.actor == "service:evidence-bot"
    assert "reported by ci-contract-suite about conformance" in event.message


def test_measured_evidence_names_the_job_that_measured_it(world, system):
    world.plan()
    services.evidence_record(actor=Actor.for_system("conformance-probe"), pool=world.candidate,
                             kind="conformance", verdict="pass", summary="42/42 cases",
                             url="/conformance/runs/3/", source="conformance run 3")
    viewer = signed_in(world.viewer)
    [ref] = checks_by_key(viewer.get("/api/v1/plans/mi300x-llama/").json())[
        "conformance"]["evidence"]
    assert (ref["origin"], ref["source"], ref["source_label"], ref["source_url"]) == (
        "measured", "conformance run 3", "measured by conformance run 3",
        "/conformance/runs/3/")
    healthy = checks_by_key(viewer.get("/api/v1/plans/mi300x-llama/").json())["healthy"]
    assert healthy["evidence"][0]["source_label"] == "measured by the health probe"


def test_only_fleetctls_own_jobs_record_measured_evidence(world):
    with pytest.raises(ValidationError, match="only its own jobs record it, not bob"):
        services.evidence_record(actor=world.actor("lead"), pool=world.candidate,
                                 kind="conformance", verdict="pass", summary="trust me")
    with pytest.raises(ValidationError, match="what other systems report"):
        services.evidence_record(actor=Actor.for_system("x"), pool=world.candidate,
                                 kind="external", verdict="pass", summary="trust me")
    assert not Evidence.objects.exists()


REPORT = {"pool": "mi300x-us", "kind": "external", "reported_by": "grafana-slo-bot",
          "about": "slo-burn", "verdict": "pass", "summary": "ok"}


@pytest.mark.parametrize(("change", "status", "words"), [
    ({"kind": "vibes"}, 400, "Unknown evidence kind 'vibes'"),
    ({"verdict": "great"}, 400, "Verdict is one of pass, warn, fail, info"),
    ({"pool": "nope"}, 400, "No pool named nope"),
    ({"route": "nope"}, 400, "No route named nope"),
    ({"model_id": "gpt-5"}, 400, "mi300x-us does not serve gpt-5"),
    ({"data": [1, 2]}, 400, "An object of numbers"),
    ({"ttl_hours": 0}, 400, "Between 0 and 8760 hours"),
    ({"summary": "  "}, 400, "Say what was found"),
    ({"reported_by": " "}, 400, "Name the system that reports it"),
    ({"about": ""}, 400, "Say what the report speaks to"),
    ({"data": {"nested": {"a": 1}}}, 400,
     "data: Does not match the external kind's data schema (GET /api/v1/evidence-kinds/): "
     "$.nested: {'a': 1} is not of type 'string', 'number', 'boolean', 'null'"),
    ({"data": {"note": "x" * 1001}}, 400, "$.note: "),
])
def test_bad_evidence_is_refused_naming_the_field(world, system, change, status, words):
    bot = service_token(system, "read", "jobs")
    response = bot.post("/api/v1/evidence/", {**REPORT, **change}, format="json")
    assert response.status_code == status, response.json()
    assert words in error(response)
    assert not Evidence.objects.exists()


def test_recording_evidence_needs_the_jobs_scope(world, system):
    response = service_token(system, "read").post("/api/v1/evidence/", REPORT, format="json")
    assert response.status_code == 403 and "lacks the scope for 'jobs'" in error(response)
    assert not Evidence.objects.exists()
    assert AuditEvent.objects.filter(action="evidence.record", outcome="denied").exists()


def test_the_evidence_registry_lists_kinds_and_rules_with_their_parameters(world):
    viewer = signed_in(world.viewer)
    kinds = {k["name"]: k for k in viewer.get("/api/v1/evidence-kinds/").json()}
    assert {"health", "conformance", "drain-rehearsal", "benchmark"} <= set(kinds)
    assert kinds["drain-rehearsal"]["rules"] == ["drain.rehearsed"]
    rules = {r["name"]: r for r in viewer.get("/api/v1/evidence-rules/").json()}
    hours = rules["pool.healthy_for"]["params"]["hours"]
    assert (hours["type"], hours["default"], hours["min"], hours["max"]) == (
        "float", 24.0, 0.01, 2160)
    assert "conformance" in rules["evidence.latest"]["params"]["kind"]["choices"]
    assert rules["routing.only_through_route"]["params"] == {}


def test_the_openapi_schema_describes_the_plan_endpoints(world):
    response = signed_in(world.viewer).get("/api/schema/",
                                           HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ("/api/v1/plans/", "/api/v1/plans/{name}/", "/api/v1/plans/{name}/approve/",
                 "/api/v1/plans/{name}/gates/{stage}/", "/api/v1/plans/{name}/checks/",
                 "/api/v1/plans/{name}/checks/{check_id}/attest/", "/api/v1/evidence/",
                 "/api/v1/evidence-kinds/", "/api/v1/evidence-rules/"):
        assert path in paths, path
    assert set(paths["/api/v1/plans/{name}/"]) >= {"get", "patch"}
    assert "put" not in paths["/api/v1/plans/{name}/"]
    assert "delete" not in paths["/api/v1/plans/{name}/"]


def test_a_drain_rehearsal_is_an_evidence_job_tokens_may_start(world, token_client):
    """Before stage 4 there is no live traffic to drain: 409 with the reason. (The rehearsal
    itself runs through real Envoy in test_stage4_envoy.py.)"""
    world.plan()
    bot = token_client(["read", "jobs"], service=True)
    response = bot.post("/api/v1/plans/mi300x-llama/rehearse-drain/", {}, format="json")
    assert response.status_code == 409, response.json()
    assert "only in stage 4" in response.json()["error"]["message"]
    reader = token_client(["read"], service=True)
    assert reader.post("/api/v1/plans/mi300x-llama/rehearse-drain/", {},
                       format="json").status_code == 403
