"""Where each piece of evidence comes from, what its data may hold, what the pool was when it
was measured, and one status vocabulary: the gate page, the API, the metrics and the stored
approvals say the same thing."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from fleetctl.accounts.actor import Actor
from fleetctl.fleet.models import HealthTransition, Pool, PoolModel
from fleetctl.fleet.services import pool_model_update
from migrations_plan import evidence as ev
from migrations_plan import services
from migrations_plan.models import Approval, Evidence, GateCheck, Plan
from migrations_plan.rules import healthy_for
from tests.migrations_plan.test_api import checks_by_key, error, service_token, signed_in
from tests.test_metrics import URL, key, samples

PROBE = Actor.for_system("conformance-probe")


def conformance(world, verdict: str = "pass", **extra) -> Evidence:
    return services.evidence_record(actor=PROBE, pool=world.candidate, kind="conformance",
                                    verdict=verdict, summary="42/42 cases", **extra)


# --- a data schema per kind --------------------------------------------------------------------

def test_a_kind_whose_data_schema_is_not_json_schema_is_refused_at_registration():
    with pytest.raises(ValueError, match="'broken': its data schema is not valid JSON Schema"):
        ev.register_kind(ev.EvidenceKind("broken", "broken", "a job",
                                         data_schema={"type": "nonsense"}))
    assert "broken" not in ev.KINDS


def test_a_kind_without_a_schema_takes_no_data_and_a_bad_row_is_refused_with_its_path(world):
    with pytest.raises(ValidationError) as refused:
        services.evidence_record(actor=Actor.for_system("rehearsal"), pool=world.candidate,
                                 kind="drain-rehearsal", verdict="pass", summary="ok",
                                 data={"days": 7})
    assert refused.value.message_dict["data"] == [
        "Does not match the drain-rehearsal kind's data schema (GET /api/v1/evidence-kinds/): "
        "$: the drain-rehearsal kind declares no data schema, so it takes no data (send {} or "
        "leave data out)"]
    assert not Evidence.objects.exists()


@pytest.fixture
def soak_with_a_schema():
    """The soak kind as a job that measures it would register it, with its data schema."""
    before = ev.KINDS["soak"]
    ev.register_kind(ev.EvidenceKind("soak", "batch soak", "soak runs", data_schema={
        "type": "object", "required": ["run", "slo"], "additionalProperties": False,
        "properties": {"run": {"type": "integer", "minimum": 1},
                       "slo": {"type": "object",
                               "properties": {"ttft_p95_ms": {"type": ["number", "null"]}}}}}))
    yield
    ev.KINDS["soak"] = before


def test_data_that_does_not_match_the_kinds_schema_is_refused_naming_each_path(
    world, soak_with_a_schema
):
    with pytest.raises(ValidationError) as bad:
        services.evidence_record(actor=Actor.for_system("soak"), pool=world.candidate,
                                 kind="soak", verdict="pass", summary="ok",
                                 data={"run": 0, "slo": {"ttft_p95_ms": "fast"}, "x": 1})
    prefix = "Does not match the soak kind's data schema (GET /api/v1/evidence-kinds/): "
    assert bad.value.message_dict["data"] == [
        prefix + "$: Additional properties are not allowed ('x' was unexpected)",
        prefix + "$.run: 0 is less than the minimum of 1",
        prefix + "$.slo.ttft_p95_ms: 'fast' is not of type 'number', 'null'"]
    assert not Evidence.objects.exists()
    row = services.evidence_record(actor=Actor.for_system("soak"), pool=world.candidate,
                                   kind="soak", verdict="pass", summary="ok",
                                   data={"run": 3, "slo": {"ttft_p95_ms": 700}})
    assert row.data == {"run": 3, "slo": {"ttft_p95_ms": 700}}


def test_the_kinds_endpoint_lists_who_measures_each_kind_and_its_data_schema(world):
    kinds = {k["name"]: k for k in signed_in(world.viewer).get("/api/v1/evidence-kinds/").json()}
    assert kinds["external"]["measured"] is False
    assert all(k["measured"] for name, k in kinds.items() if name != "external")
    assert kinds["benchmark"]["data_schema"]["type"] == "object"
    # A kind read from fleetctl's own records (no Evidence rows of its own) accepts no data;
    # one with its job has the job's schema.
    assert kinds["drain-rehearsal"]["data_schema"] == {"type": "object", "maxProperties": 0}
    assert kinds["soak"]["data_schema"]["type"] == "object"
    assert kinds["eval"]["data_schema"]["properties"]["suite_sha256"] == {"type": "string"}
    assert kinds["shadow"]["data_schema"]["properties"]["pairs"] == {"type": "integer",
                                                                      "minimum": 0}
    assert kinds["external"]["rules"] == ["external.reported"]


# --- reports ----------------------------------------------------------------------------------

def report(system, **fields):
    body = {"pool": "mi300x-us", "kind": "external", "reported_by": "grafana-slo-bot",
            "about": "slo-burn", "verdict": "pass", "summary": "burn rate 0.2 over 28 d",
            **fields}
    return service_token(system, "read", "jobs").post("/api/v1/evidence/", body, format="json")


def test_a_report_about_a_measured_kind_stays_insufficient_and_binds_the_approval(
    world, system
):
    plan = world.plan()
    assert report(system, about="conformance", reported_by="ci-suite",
                  summary="42/42").status_code == 201
    gate = ev.evaluate_gate(plan)
    check = next(o for o in gate.outcomes if o.check.key == "conformance")
    assert check.status == ev.INSUFFICIENT
    assert check.result.summary.endswith(
        "Reported by ci-suite: pass — not measured by fleetctl (42/42).")
    # An approver sees it, and must justify: the gate asks for a justification.
    assert check in gate.needs_justification
    with pytest.raises(ValidationError, match="write why you approve anyway"):
        services.approve(actor=world.actor("lead"), plan=plan, justification="")
    approval = services.approve(actor=world.actor("lead"), plan=plan,
                                justification="the CI suite is what we trust until the probe runs")
    [bound] = next(c for c in approval.snapshot["checks"] if c["key"] == "conformance")[
        "evidence"]
    assert (bound["origin"], bound["source_label"]) == ("reported", "reported by ci-suite")
    # Measured evidence, when it comes, decides alone (and the approval no longer holds).
    conformance(world)
    assert next(o for o in ev.evaluate_gate(plan).outcomes
                if o.check.key == "conformance").status == ev.PASS


def test_an_organisations_own_check_is_answered_by_reports_and_says_who_reported(
    world, system
):
    plan = world.plan()
    lead = signed_in(world.lead)
    refused = lead.post(f"/api/v1/plans/{plan.name}/checks/", {
        "stage": 1, "rule": "external.reported", "params": {"about": "conformance"}},
        format="json")
    assert refused.status_code == 400
    assert "about: conformance is measured by fleetctl; a report cannot stand in" in (
        error(refused))
    missing = lead.post(f"/api/v1/plans/{plan.name}/checks/", {
        "stage": 1, "rule": "external.reported", "params": {}}, format="json")
    assert missing.status_code == 400 and "about: required" in error(missing)
    added = lead.post(f"/api/v1/plans/{plan.name}/checks/", {
        "stage": 1, "rule": "external.reported", "params": {"about": "slo-burn"}},
        format="json")
    assert added.status_code == 201, added.json()
    assert added.json()["title"] == "Reported by another system: slo-burn"
    check = checks_by_key(lead.get(f"/api/v1/plans/{plan.name}/").json())[added.json()["key"]]
    assert check["status"] == "insufficient"
    assert report(system, about="other-thing").status_code == 201
    assert report(system, verdict="warn").status_code == 201
    check = checks_by_key(lead.get(f"/api/v1/plans/{plan.name}/").json())[added.json()["key"]]
    assert check["status"] == "warn"
    assert check["summary"] == "Reported by grafana-slo-bot: warn — burn rate 0.2 over 28 d"
    assert check["evidence"][0]["source_label"] == "reported by grafana-slo-bot"


# --- fingerprint: quantisation and weight format -----------------------------------------------

@pytest.mark.parametrize(("change", "reason"), [
    ({"quantisation": "int4-awq"}, "quantisation changed from fp8 to int4-awq"),
    ({"weight_format": "gguf"}, "weight format changed from safetensors to gguf"),
])
def test_a_new_quantisation_or_weight_format_expires_the_evidence_with_the_reason(
    world, system, change, reason
):
    plan = world.plan()
    entry = PoolModel.objects.get(pool=world.candidate)
    pool_model_update(actor=system, entry=entry, quantisation="fp8",
                      weight_format="safetensors")
    row = conformance(world)
    assert (row.pool_fingerprint["quantisation"], row.pool_fingerprint["weight_format"]) == (
        "fp8", "safetensors")
    assert ev.evaluate_gate(plan).outcomes[0].status == ev.PASS
    pool_model_update(actor=system, entry=entry, **change)
    outcome = ev.evaluate_gate(plan).outcomes[0]
    assert outcome.status == ev.INSUFFICIENT
    assert outcome.result.summary == (
        f"The latest OpenAI-contract conformance evidence no longer counts: {reason}.")


def test_evidence_stored_before_the_fingerprint_had_those_keys_stays_valid(world, system):
    plan = world.plan()
    row = conformance(world)
    assert {"quantisation", "weight_format"} <= set(row.pool_fingerprint)
    old = {k: v for k, v in row.pool_fingerprint.items()
           if k not in ("quantisation", "weight_format")}
    Evidence.objects.filter(pk=row.pk).update(pool_fingerprint=old)
    pool_model_update(actor=system, entry=PoolModel.objects.get(pool=world.candidate),
                      quantisation="int8", weight_format="gguf")
    assert ev.evaluate_gate(plan).outcomes[0].status == ev.PASS


# --- rounding ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "limit", "decimals", "shown"), [
    (0.0999, 0.1, 1, "0.0"), (0.1, 0.1, 1, "0.1"), (0.1004, 0.1, 1, "0.1004"),
    (23.96, 24, 1, "23.9"), (500.4, 500, 0, "500.4"), (499.9, 500, 0, "499"),
    (30.2, 30, 0, "30.2"),
])
def test_a_figure_read_against_a_limit_never_crosses_it_when_shown(value, limit, decimals,
                                                                    shown):
    assert ev.honest(value, limit, decimals) == shown
    assert (float(shown) < limit) == (value < limit)
    assert (float(shown) > limit) == (value > limit)


@pytest.mark.parametrize(("healthy_s", "hours", "words"), [
    (5.99 * 60, 0.1, "healthy for 5.9 min of the 6 min required"),
    (0.0999 * 3600, 0.1, "healthy for 5.9 min of the 6 min required"),
    (23.97 * 3600, 24, "healthy for 23.9 h of the 24 h required"),
    (0.5 * 60, 0.01, "healthy for 0.5 min of the 0.6 min required"),
])
def test_healthy_x_of_y_never_shows_the_requirement_while_it_is_unmet(world, healthy_s, hours,
                                                                      words):
    plan = world.plan()
    now = timezone.now()
    Pool.objects.filter(pk=world.candidate.pk).update(
        health_changed_at=now - timedelta(seconds=healthy_s))
    HealthTransition.objects.filter(pool=world.candidate).update(at=now - timedelta(
        seconds=healthy_s))
    ctx = ev.RuleContext(plan=plan, candidate=Pool.objects.get(pk=world.candidate.pk),
                         primary=world.primary, routes=[world.route], now=now)
    result = healthy_for(ctx, {"hours": hours})
    assert result.status == ev.INSUFFICIENT
    assert words in result.summary
    have, need = re.search(r"for ([\d.]+) (?:min|h) of the ([\d.]+)", result.summary).groups()
    assert float(have) < float(need)


# --- one vocabulary ---------------------------------------------------------------------------

def only_attested_gate(world) -> Plan:
    """A stage-1 gate whose one check is an attestation nobody has given yet."""
    plan = world.plan()
    for check in plan.checks.filter(stage=1):
        services.check_remove(actor=world.actor("lead"), check=check, reason="not for this test")
    services.check_add(actor=world.actor("lead"), plan=plan, stage=1,
                       title="Runbook reviewed", attest_role="on-call")
    return plan


def test_the_page_the_api_and_the_metrics_say_the_same_gate_status(world, system):
    plan = only_attested_gate(world)
    services.plan_refresh(plan=plan)

    api = signed_in(world.viewer).get(f"/api/v1/plans/{plan.name}/").json()
    assert (api["gate"]["status"], api["gate"]["status_label"], api["gate"]["blocks_advance"]) \
        == ("awaiting-attestation", "awaiting attestation", True)
    listed = signed_in(world.viewer).get("/api/v1/plans/").json()["results"][0]["gate"]
    assert (listed["status"], listed["status_label"], listed["blocks_advance"]) == (
        "awaiting-attestation", "awaiting attestation", True)

    client = Client()
    client.force_login(world.lead)
    page = client.get(f"/plans/{plan.name}/").content.decode()
    title = page[page.index('id="gate-title"'):page.index("</h2>", page.index('id="gate-title"'))]
    assert "awaiting attestation" in title and "fail" not in title
    assert "blocked: nothing can be approved until the attestation is given" in page
    board = client.get("/plans/").content.decode()
    assert "awaiting attestation" in board and ">▲ blocked<" not in board

    found = samples(signed_in(world.viewer).get(URL, HTTP_ACCEPT="text/plain"))
    assert found[key("fleetctl_plan_gate_status", plan=plan.name, stage="1",
                     status="awaiting-attestation")] == 1
    assert found[key("fleetctl_plan_gate_status", plan=plan.name, stage="1",
                     status="fail")] == 0
    assert found[key("fleetctl_plan_gate_blocks_advance", plan=plan.name, stage="1")] == 1
    assert GateCheck.objects.get(plan=plan, stage=1, removed_at__isnull=True).last_status == (
        "awaiting-attestation")

    # Attested: every surface moves to pass together.
    services.attest(actor=world.actor("oncall"), check=plan.checks.get(
        stage=1, removed_at__isnull=True), note="read it, it works")
    services.plan_refresh(plan=plan)
    assert signed_in(world.viewer).get(f"/api/v1/plans/{plan.name}/").json()["gate"][
        "status"] == "pass"
    found = samples(signed_in(world.viewer).get(URL, HTTP_ACCEPT="text/plain"))
    assert found[key("fleetctl_plan_gate_status", plan=plan.name, stage="1",
                     status="pass")] == 1
    assert found[key("fleetctl_plan_gate_blocks_advance", plan=plan.name, stage="1")] == 0
    approval = services.approve(actor=world.actor("lead"), plan=plan)
    assert approval.gate_status == "pass" == approval.snapshot["status"]


def test_an_approval_stored_with_an_older_status_word_reads_in_todays(world):
    plan = world.plan()
    services.approve(actor=world.actor("lead"), plan=plan,
                     justification="cost and health come later, conformance is enough now")
    Approval.objects.update(gate_status="pending")
    viewer = signed_in(world.viewer)
    [approval] = viewer.get(f"/api/v1/plans/{plan.name}/approvals/").json()["results"]
    assert approval["gate_status"] == "awaiting-attestation"
    [standing] = viewer.get(f"/api/v1/plans/{plan.name}/").json()["approvals"]
    assert (standing["gate_status"], standing["gate_status_label"]) == (
        "awaiting-attestation", "awaiting attestation")


def test_the_schema_types_the_gate_status_and_the_plan_state(world):
    schema = APIClient()
    schema.force_login(world.viewer)
    components = schema.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json"
                            ).json()["components"]["schemas"]
    text = str(components)
    assert "awaiting-attestation" in text
    gate = components["Gate"]["properties"]
    assert gate["blocks_advance"]["type"] == "boolean"
    plan = components["Plan"]["properties"]
    assert "$ref" in str(plan["gate"]) and "GateBrief" in str(plan["gate"])
    assert "stage-1" in str(components) and "completed" in str(components)


# --- existing rows: the migration ---------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_migration_turns_posted_measured_rows_into_reports(make_pool):
    executor = MigrationExecutor(connection)
    before = [("migrations_plan", "0002_evidence_url_is_a_safe_link")]
    after = [("migrations_plan", "0003_evidence_sources_and_one_status_vocabulary")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    pool = old.get_model("fleet", "Pool").objects.get(pk=make_pool(name="mi300x-us").pk)
    OldEvidence = old.get_model("migrations_plan", "Evidence")
    common = {"pool": pool, "verdict": "pass", "summary": "ok", "pool_fingerprint": {}}
    posted = OldEvidence.objects.create(kind="shadow", source="service:ci-bot", **common)
    typed = OldEvidence.objects.create(kind="conformance", source="alice", **common)
    measured = OldEvidence.objects.create(kind="benchmark", source="system:benchmark", **common)
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        rows = {row.pk: row for row in Evidence.objects.all()}
        assert (rows[posted.pk].kind, rows[posted.pk].about, rows[posted.pk].reported_by) == (
            "external", "shadow", "service:ci-bot")
        assert (rows[typed.pk].kind, rows[typed.pk].about) == ("external", "conformance")
        assert (rows[measured.pk].kind, rows[measured.pk].about) == ("benchmark", "")
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
