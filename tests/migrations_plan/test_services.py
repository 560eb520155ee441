"""The rules of plans and gates, through the service layer (the API and dashboard call the
same functions): separation of duties, N approvers, three-valued gates, approvals bound to
evidence, gate edits, stage moves and the live-weight rule of stage 4."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from fleetctl.fleet.services import pool_model_create, pool_update, region_create
from fleetctl.traffic import services as traffic
from migrations_plan import evidence as ev
from migrations_plan import services
from migrations_plan.models import Approval, GateCheck, Plan, StageMove
from tests.migrations_plan.conftest import MODEL
from tests.migrations_plan.helpers import attest_all, gate_status, pass_gate, walk_to

PROBE = Actor.for_system("conformance-probe")


def denied(plan: Plan, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(object_type="migrations_plan.plan",
                                          object_id=str(plan.pk), action=action,
                                          outcome="denied"))


# --- opening a plan ---------------------------------------------------------------------------

def test_a_new_plan_starts_at_stage_1_with_the_default_gates(world):
    plan = world.plan()
    assert (plan.state, plan.stage) == ("stage-1", 1)
    keys = {stage: list(plan.checks.filter(stage=stage).values_list("key", flat=True))
            for stage in (1, 2, 3, 4)}
    assert keys[1] == ["conformance", "only-through-route", "cost-reported", "healthy",
                       "same-revision"]
    assert "dashboards" in keys[2] and "incident" in keys[3] and "drain-rehearsed" in keys[4]
    assert AuditEvent.objects.filter(action="plan.create", object_id=str(plan.pk)).exists()


def test_a_primary_that_does_not_serve_the_model_is_refused(world, make_pool):
    other = make_pool(name="a100-us")
    with pytest.raises(ValidationError) as refused:
        world.plan(primary_pool=other)
    assert "Primary a100-us does not serve model llama-3.1-8b-instruct" in str(refused.value)
    assert not Plan.objects.exists()


def test_a_candidate_outside_the_routes_pin_is_refused(world, make_pool, system):
    eu = region_create(actor=system, code="eu-west", name="EU", jurisdiction="EU")
    eu_pool = make_pool(name="h200-eu", region=eu)
    pool_model_create(actor=system, pool=eu_pool, model_id=MODEL, max_context_tokens=8192)
    pinned = traffic.route_create(actor=system, name="llama-eu", model_id=MODEL,
                                  residency="EU", primary_pool=eu_pool, force=True)
    with pytest.raises(ValidationError) as refused:
        world.plan(primary_pool=eu_pool, routes=[pinned])
    assert "candidate mi300x-us is in jurisdiction US, route llama-eu is pinned to EU" in str(
        refused.value)


def test_one_open_plan_per_candidate_and_route(world):
    world.plan()
    with pytest.raises(ConflictError, match=r"Plan mi300x-llama .* already takes mi300x-us "
                                            "onto llama"):
        world.plan(name="again")
    services.abandon(actor=world.actor("lead"), plan=Plan.objects.get(), reason="start over")
    assert world.plan(name="again").state == "stage-1"


def test_a_candidate_already_carrying_live_weight_is_refused(world, system):
    traffic.revision_create(actor=system, route=world.route, base_revision=1,
                            weights={"h200-us": 90, "mi300x-us": 10}, reason="before plans")
    with pytest.raises(ConflictError, match=r"already carries 10 % of route llama"):
        world.plan()


def test_service_tokens_cannot_author_a_plan(world):
    from fleetctl.accounts.actor import Actor
    from fleetctl.accounts.services import token_create_service

    issued = token_create_service(actor=Actor.for_system("t"), name="bot", scopes=["fleet"])
    with pytest.raises(PermissionDeniedError, match=r"needs a named person"):
        services.plan_create(
            actor=Actor(token=issued.token), name="x", candidate_pool=world.candidate,
            primary_pool=world.primary, routes=[world.route], slo_ttft_p95_ms=1,
            slo_tpot_p95_ms=1, slo_error_rate=0)


# --- separation of duties and approvals -------------------------------------------------------

def test_the_author_and_the_owner_cannot_approve(world):
    plan = world.plan(owner=world.lead2)
    for who, words in (("author", "You opened plan"), ("lead2", "You own plan")):
        with pytest.raises(PermissionDeniedError, match=words):
            services.approve(actor=world.actor(who), plan=plan,
                             justification="this would be my own sign-off")
    assert not Approval.objects.exists()
    assert len(denied(plan, "plan.approve")) == 2


def test_the_author_and_the_owner_cannot_advance_a_plan_another_lead_approved(world):
    plan = world.plan(owner=world.lead2)
    attest_all(world, plan)
    services.approve(actor=world.actor("lead"), plan=plan,
                     justification="conformance arrives with a later issue")
    for who, words in (("author", "You opened plan mi300x-llama"),
                       ("lead2", "You own plan mi300x-llama")):
        with pytest.raises(PermissionDeniedError,
                           match=words + "; separation of duties: another platform lead "
                                         "must advance it."):
            services.advance(actor=world.actor(who), plan=plan, reason="my own plan")
    plan.refresh_from_db()
    assert plan.state == "stage-1" and not StageMove.objects.exists()
    assert [e.actor for e in denied(plan, "plan.advance")] == ["carol", "alice"]
    assert Approval.objects.get().used_at is None  # still there for the approver to use
    assert services.advance(actor=world.actor("lead"), plan=plan).state == "stage-2"


@pytest.mark.parametrize("who", ["viewer", "oncall"])
def test_approving_needs_the_platform_lead_role(world, who):
    plan = world.plan()
    with pytest.raises(PermissionDeniedError, match=r"'plan.approve' needs a role"):
        services.approve(actor=world.actor(who), plan=plan,
                         justification="I would like to approve this")
    assert not Approval.objects.exists()
    assert denied(plan, "plan.approve")


def test_three_valued_gates(world):
    plan = world.plan()
    # Stage 1: insufficient data (no conformance run, no cost, not healthy 24 h yet).
    assert ev.evaluate_gate(plan).status == ev.INSUFFICIENT
    with pytest.raises(ValidationError) as no_reason:
        services.approve(actor=world.actor("lead"), plan=plan)
    assert "not a clean pass" in str(no_reason.value)
    assert "conformance" in str(no_reason.value).lower()
    assert not Approval.objects.exists()
    # Fail blocks, justification or not.
    services.evidence_record(actor=PROBE, pool=world.candidate,
                             kind="conformance", verdict="fail",
                             summary="3 of 40 contract cases fail (logprobs)")
    assert gate_status(plan)["conformance"] == ev.FAIL
    with pytest.raises(ConflictError, match=r"cannot be approved: .*3 of 40 contract cases"):
        services.approve(actor=world.actor("lead"), plan=plan,
                         justification="ship it anyway, please")
    # Warn asks a human: approvable with a justification.
    services.evidence_record(actor=PROBE, pool=world.candidate,
                             kind="conformance", verdict="warn",
                             summary="logprobs missing; everything else conforms")
    assert gate_status(plan)["conformance"] == ev.WARN
    approval = services.approve(actor=world.actor("lead"), plan=plan,
                                justification="no caller uses logprobs on this route")
    assert approval.gate_status == ev.INSUFFICIENT  # the healthy check still wants time
    assert approval.snapshot["checks"][0]["status"] == ev.WARN
    assert len(approval.snapshot_hash) == 64


def test_a_clean_pass_needs_no_justification(world, system):
    plan = world.plan()
    for key in ("conformance", "cost-reported", "healthy", "same-revision"):
        services.check_remove(actor=world.actor("lead"),
                              check=plan.checks.get(stage=1, key=key),
                              reason="covered elsewhere for this test")
    assert ev.evaluate_gate(plan).status == ev.PASS
    approval = services.approve(actor=world.actor("lead"), plan=plan)
    assert approval.justification == ""
    assert services.advance(actor=world.actor("lead2"), plan=plan).state == "stage-2"


def test_attested_checks_block_until_a_person_with_the_role_attests(world):
    plan = walk_to(world, world.plan(), 2)
    dashboards = plan.checks.get(stage=2, key="dashboards")
    assert gate_status(plan)["dashboards"] == ev.AWAITING
    with pytest.raises(ConflictError, match=r"Awaiting attestation by a platform-lead"):
        services.approve(actor=world.actor("lead"), plan=plan,
                         justification="approving without the attestation")
    with pytest.raises(PermissionDeniedError, match=r"attested by a platform-lead"):
        services.attest(actor=world.actor("oncall"), check=dashboards, note="looks fine to me")
    services.attest(actor=world.actor("lead2"), check=dashboards,
                    note="Grafana board fleet/mi300x and 3 alerts exist")
    assert gate_status(plan)["dashboards"] == ev.PASS


def test_n_approver_plans(world):
    plan = world.plan(required_approvals=2)
    attest_all(world, plan)
    services.approve(actor=world.actor("lead"), plan=plan,
                     justification="conformance arrives with a later issue")
    with pytest.raises(ConflictError, match=r"needs 2 approval\(s\) .* it has 1"):
        services.advance(actor=world.actor("lead"), plan=plan)
    with pytest.raises(ConflictError, match=r"already approved"):
        services.approve(actor=world.actor("lead"), plan=plan,
                         justification="conformance arrives with a later issue")
    services.approve(actor=world.actor("lead2"), plan=plan,
                     justification="agree: conformance comes with a later issue")
    plan = services.advance(actor=world.actor("lead2"), plan=plan, reason="two sign-offs")
    assert plan.state == "stage-2"
    move = StageMove.objects.get(plan=plan, kind="advance")
    assert {a.by.username for a in move.approvals.all()} == {"bob", "carol"}
    assert move.gate_snapshot["stage"] == 1 and move.snapshot_hash
    assert Approval.objects.filter(used_at__isnull=False).count() == 2


def test_an_approval_is_voided_when_its_evidence_changes(world):
    plan = world.plan()
    services.evidence_record(actor=PROBE, pool=world.candidate,
                             kind="conformance", verdict="pass", summary="40/40 cases")
    approval = services.approve(actor=world.actor("lead"), plan=plan,
                                justification="cost and health are not in yet, that's fine")
    services.evidence_record(actor=PROBE, pool=world.candidate,
                             kind="conformance", verdict="fail", summary="38/40 cases")
    with pytest.raises(ConflictError, match=r"Stage 1 gate blocks: .*38/40"):
        services.advance(actor=world.actor("lead"), plan=plan)
    approval.refresh_from_db()
    assert approval.voided_at is not None
    assert "went from pass to fail" in approval.void_reason
    assert AuditEvent.objects.filter(action="plan.approval.void",
                                     object_id=str(plan.pk)).exists()
    assert Plan.objects.get(pk=plan.pk).state == "stage-1"


def test_an_approval_is_voided_when_the_pools_runtime_changes(world, system):
    plan = world.plan()
    services.evidence_record(actor=PROBE, pool=world.candidate,
                             kind="conformance", verdict="pass", summary="40/40 cases")
    approval = services.approve(actor=world.actor("lead"), plan=plan,
                                justification="cost and health are not in yet, that's fine")
    pool_update(actor=system, pool=world.candidate, runtime_version="rocm-6.5")
    plan = Plan.objects.get(pk=plan.pk)
    outcome = ev.evaluate_gate(plan).outcomes[0]
    assert outcome.status == ev.INSUFFICIENT
    assert "runtime version changed from rocm-6.4 to rocm-6.5" in outcome.result.summary
    with pytest.raises(ConflictError, match=r"needs 1 approval.*Voided: bob — check "):
        services.advance(actor=world.actor("lead"), plan=plan)
    approval.refresh_from_db()
    assert "Passes the OpenAI-contract conformance probe" in approval.void_reason


def test_an_approval_is_voided_when_its_evidence_expires(world, monkeypatch):
    plan = world.plan()
    services.evidence_record(actor=PROBE, pool=world.candidate,
                             kind="conformance", verdict="pass", summary="40/40 cases",
                             ttl_hours=1)
    services.approve(actor=world.actor("lead"), plan=plan,
                     justification="cost and health are not in yet, that's fine")
    # Two hours on. The clock is moved rather than slept on: with a 1.5 s TTL and a sleep, a
    # slow machine could let the evidence expire before the approval saw it.
    later = timezone.now() + timedelta(hours=2)
    monkeypatch.setattr(timezone, "now", lambda: later)
    with pytest.raises(ConflictError, match=r"it has 0"):
        services.advance(actor=world.actor("lead"), plan=plan)
    assert "expired" in Approval.objects.get().void_reason


def test_the_refresh_task_voids_stale_approvals_and_logs_status_changes(world):
    plan = world.plan()
    assert services.plan_refresh(plan=plan) == []  # first look: statuses recorded silently
    services.approve(actor=world.actor("lead"), plan=plan,
                     justification="cost and health are not in yet, that's fine")
    services.evidence_record(actor=PROBE, pool=world.candidate,
                             kind="conformance", verdict="pass", summary="40/40 cases")
    changes = services.plan_refresh(plan=plan)
    assert any("insufficient data → pass: 40/40 cases" in line for line in changes)
    assert Approval.objects.get().voided_at is not None
    assert AuditEvent.objects.filter(action="plan.check.status", object_id=str(plan.pk),
                                     actor="system:plan-gate").exists()


def test_a_plan_whose_passed_gate_lost_its_evidence_is_at_risk_until_it_is_back(world):
    """Stage 1 was approved on a passing conformance probe; a runtime upgrade expires that
    evidence while the plan is at stage 2. The refresh marks the plan at risk (audited, a
    `plan.at_risk` webhook, the API, the board and the plan page), and a new passing probe
    clears it."""
    from django.test import Client

    from fleetctl.webhooks.models import Delivery
    from fleetctl.webhooks.services import webhook_create

    hook = webhook_create(actor=Actor.for_system("test"), name="risk", events=["plan.at_risk"],
                          url="http://127.0.0.1:9/hook")
    services.evidence_record(actor=PROBE, pool=world.candidate, kind="conformance",
                             verdict="pass", summary="40/40 cases")
    plan = walk_to(world, world.plan(), 2)
    services.plan_refresh(plan=plan)
    assert Plan.objects.get(pk=plan.pk).risk == [], Plan.objects.get(pk=plan.pk).risk

    pool_update(actor=Actor.for_system("test"), pool=world.candidate,
                runtime_version="rocm-7.0")
    services.plan_refresh(plan=Plan.objects.get(pk=plan.pk))
    plan = Plan.objects.get(pk=plan.pk)
    assert plan.at_risk_since is not None
    [risk] = plan.risk
    assert risk.startswith("stage 1: Passes the OpenAI-contract conformance probe was pass "
                           "when approved, now insufficient data"), risk
    assert "runtime version changed" in risk
    assert AuditEvent.objects.filter(action="plan.at_risk", object_id=str(plan.pk)).exists()
    [sent] = Delivery.objects.filter(webhook=hook)
    assert sent.payload["data"]["at_risk"] is True and sent.payload["data"]["risk"] == [risk]
    since = plan.at_risk_since
    services.plan_refresh(plan=plan)  # the same risk again: nothing new is sent
    assert Delivery.objects.filter(webhook=hook).count() == 1
    assert Plan.objects.get(pk=plan.pk).at_risk_since == since

    viewer = Client()
    viewer.force_login(world.lead)
    assert "at risk" in viewer.get("/plans/").content.decode()
    assert "a gate this plan already passed lost what it was approved on" in \
        viewer.get(f"/plans/{plan.name}/").content.decode()

    world.candidate.refresh_from_db()
    services.evidence_record(actor=PROBE, pool=world.candidate, kind="conformance",
                             verdict="pass", summary="40/40 cases on rocm-7.0")
    services.plan_refresh(plan=Plan.objects.get(pk=plan.pk))
    plan = Plan.objects.get(pk=plan.pk)
    assert plan.at_risk_since is None and plan.risk == [], plan.risk
    assert Delivery.objects.filter(webhook=hook).count() == 2


# --- gate edits -------------------------------------------------------------------------------

def test_gate_edits_are_audited_and_void_approvals(world):
    plan = world.plan()
    services.approve(actor=world.actor("lead"), plan=plan,
                     justification="cost and health are not in yet, that's fine")
    healthy = plan.checks.get(stage=1, key="healthy")
    services.check_update(actor=world.actor("author"), check=healthy, params={"hours": 48})
    assert GateCheck.objects.get(pk=healthy.pk).params == {"hours": 48.0}
    added = services.check_add(actor=world.actor("author"), plan=plan, stage=1,
                               title="Runbook reviewed", attest_role="on-call")
    assert added.key == "runbook-reviewed" and added.kind == "attested"
    services.check_remove(actor=world.actor("author"), check=added, reason="merged into QA")
    with pytest.raises(ConflictError, match=r"it has 0"):
        services.advance(actor=world.actor("lead"), plan=plan)
    assert "thresholds of check 'Candidate healthy for 24 h' changed" in \
        Approval.objects.get().void_reason
    actions = list(AuditEvent.objects.filter(object_id=str(plan.pk), outcome="ok")
                   .order_by("at", "id").values_list("action", flat=True))
    assert actions[-4:] == ["plan.check.update", "plan.check.add", "plan.check.remove",
                            "plan.approval.void"]


@pytest.mark.parametrize(("params", "message"), [
    ({"hours": -1}, "hours: at least 0.01"),
    ({"hours": "soon"}, "hours: expected float"),
    ({"minutes": 3}, "has no parameter minutes"),
])
def test_bad_thresholds_are_refused(world, params, message):
    plan = world.plan()
    with pytest.raises(ValidationError, match=message):
        services.check_add(actor=world.actor("author"), plan=plan, stage=1, title="",
                           rule="pool.healthy_for", params=params)
    assert plan.checks.filter(stage=1).count() == 5


def test_closed_plans_and_passed_stages_cannot_be_edited(world):
    plan = walk_to(world, world.plan(), 2)
    with pytest.raises(ConflictError, match=r"Stage 1 .* cannot be edited"):
        services.check_add(actor=world.actor("author"), plan=plan, stage=1, title="late",
                           attest_role="admin")
    services.abandon(actor=world.actor("lead"), plan=plan, reason="vendor withdrew")
    with pytest.raises(ConflictError, match=r"abandoned; a closed plan cannot be changed"):
        services.check_add(actor=world.actor("author"), plan=plan, stage=3, title="late",
                           attest_role="admin")
    with pytest.raises(ConflictError, match=r"closed plan"):
        services.plan_update(actor=world.actor("lead"), plan=plan, notes="edit")
    assert denied(plan, "plan.check.add")


# --- stage moves and live weight --------------------------------------------------------------

def _ramp(world, percent: float):
    from fleetctl.traffic.models import Route

    route = Route.objects.get(pk=world.route.pk)
    return traffic.revision_create(
        actor=world.actor("oncall"), route=route, base_revision=route.revision_number,
        weights={"h200-us": 100 - percent, "mi300x-us": percent}, reason=f"{percent} %")


def test_live_weight_only_from_stage_4(world):
    plan = walk_to(world, world.plan(), 3)
    with pytest.raises(ValidationError, match=r"candidate of plan mi300x-llama, which is at "
                                              "stage 3 \\(batch\\); live weight needs stage 4"):
        _ramp(world, 1)
    plan = pass_gate(world, plan)
    assert plan.state == "stage-4"
    assert _ramp(world, 5).weights == {"h200-us": 9500, "mi300x-us": 500}


def test_pause_from_stage_4_drains_the_candidate_and_blocks_ramps(world):
    plan = walk_to(world, world.plan(), 4)
    _ramp(world, 10)
    plan = services.pause(actor=world.actor("oncall"), plan=plan, reason="p95 regression")
    assert plan.state == "paused" and plan.stage == 4
    move = StageMove.objects.get(plan=plan, kind="pause")
    drain = move.drains.get()
    assert drain.drained_pools == ["mi300x-us"]
    assert drain.revisions.get().weights == {"h200-us": 10000}
    with pytest.raises(ValidationError, match=r"plan mi300x-llama is paused at stage 4"):
        _ramp(world, 1)
    plan = services.resume(actor=world.actor("lead"), plan=plan, reason="fixed")
    assert plan.state == "stage-4"
    assert _ramp(world, 1).weights["mi300x-us"] == 100


def test_regress_needs_an_earlier_stage_and_voids_approvals(world):
    plan = walk_to(world, world.plan(), 2)
    attest_all(world, plan)
    services.approve(actor=world.actor("lead"), plan=plan,
                     justification="signed off by hand")
    with pytest.raises(ValidationError, match=r"Regress goes back"):
        services.regress(actor=world.actor("lead"), plan=plan, to_stage=3, reason="x")
    plan = services.regress(actor=world.actor("lead"), plan=plan, to_stage=1,
                            reason="conformance regressed")
    assert (plan.state, plan.stage) == ("stage-1", 1)
    assert "plan regressed: conformance regressed" in Approval.objects.filter(
        stage=2).get().void_reason


def test_pausing_needs_drain_rights(world):
    plan = world.plan()
    with pytest.raises(PermissionDeniedError):
        services.pause(actor=world.actor("viewer"), plan=plan, reason="why not")
    assert services.pause(actor=world.actor("oncall"), plan=plan,
                          reason="incident").state == "paused"
    with pytest.raises(ConflictError, match=r"resume it first"):
        services.approve(actor=world.actor("lead"), plan=plan,
                         justification="approving a paused plan")


def test_the_audit_trail_of_a_whole_plan_from_stage_1_to_completed(world, system):
    plan = world.plan(required_approvals=1)
    with pytest.raises(PermissionDeniedError):
        services.approve(actor=world.actor("author"), plan=plan, justification="mine, mine")
    plan = walk_to(world, plan, 4)
    _ramp(world, 50)
    plan = pass_gate(world, plan)
    assert plan.state == "completed" and plan.closed_at is not None
    trail = list(AuditEvent.objects.filter(object_type="migrations_plan.plan",
                                           object_id=str(plan.pk)).order_by("at", "id")
                 .values_list("action", "outcome", "actor"))
    assert trail[0] == ("plan.create", "ok", "alice")
    assert trail[1] == ("plan.approve", "denied", "alice")
    advances = [a for a, o, _ in trail if a in ("plan.advance", "plan.complete")]
    assert advances == ["plan.advance"] * 3 + ["plan.complete"]
    assert [a for a, _, _ in trail].count("plan.approve") == 5  # one denied + four stages
    assert ("plan.attest", "ok", "olga") in trail  # the on-call incident, stage 3
    moves = list(StageMove.objects.filter(plan=plan).order_by("at", "id")
                 .values_list("from_state", "to_state"))
    assert moves == [("stage-1", "stage-2"), ("stage-2", "stage-3"), ("stage-3", "stage-4"),
                     ("stage-4", "completed")]
    # Completed: the pool is no longer held back on the route.
    assert _ramp(world, 100).weights["mi300x-us"] == 10_000
