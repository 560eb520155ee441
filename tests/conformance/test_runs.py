"""Conformance runs end to end: a real Celery worker (probe queue) probes simulated pools
case by case, stores a row per case per endpoint, judges the verdict and records the
`conformance` evidence the plan's stage-1 check reads."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleetctl.conformance import services
from fleetctl.conformance.models import ConformanceCase, ConformanceRun
from fleetctl.fleet.models import Pool
from migrations_plan import evidence as ev
from migrations_plan.models import Evidence
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def point(pool: Pool, sim, *names: str) -> Pool:
    Pool.objects.filter(pk=pool.pk).update(base_urls=[sim.url(n) for n in names])
    return Pool.objects.get(pk=pool.pk)


def finished(run: ConformanceRun) -> ConformanceRun:
    wait_until(lambda: ConformanceRun.objects.get(pk=run.pk).status
               not in ConformanceRun.ACTIVE, timeout_s=120, what="the conformance run")
    return ConformanceRun.objects.get(pk=run.pk)


def failing(run: ConformanceRun) -> set[str]:
    return {row.key for row in ConformanceCase.objects.filter(run=run, role="pool")
            if row.status in ("fail", "error")}


def conformance_check(plan) -> ev.CheckOutcome:
    gate = ev.evaluate_gate(plan, stage=1)
    return next(o for o in gate.outcomes if o.check.key == "conformance")


def test_a_conforming_pool_passes_and_the_gate_check_reads_the_evidence(
        celery_worker, world: World, conformance_sim):  # noqa: F811
    candidate = point(world.candidate, conformance_sim, "good")
    point(world.primary, conformance_sim, "twin")
    plan = world.plan()
    assert conformance_check(plan).status == ev.INSUFFICIENT
    run = finished(services.run_create(actor=world.actor("oncall"), pool=candidate, plan=plan))
    assert (run.status, run.verdict) == ("complete", "pass"), (run.error, run.summary)
    assert run.primary == world.primary and run.model_id == "llama-3.1-8b-instruct"
    rows = ConformanceCase.objects.filter(run=run)
    mine = rows.filter(role="pool")
    assert {r.status for r in mine} == {"pass"}, [(r.key, r.got) for r in mine
                                                 if r.status != "pass"]
    # Side by side: every case that is not a comparison also ran on the reference.
    keys = {c.key for c in services.cases_for(run)}
    assert {r.key for r in mine} == keys
    assert {r.key for r in rows.filter(role="primary")} == {
        c.key for c in services.cases_for(run) if not c.parity}
    assert "errors.rate_limit" not in keys  # opt-in, off by default
    assert run.counts["pass"] == len(keys) and run.summary.startswith(
        f"{len(keys)} of {len(keys)} cases pass")
    evidence = Evidence.objects.get(kind="conformance", pool=candidate)
    assert evidence.pk == run.evidence_id and evidence.verdict == "pass"
    assert evidence.url == f"/conformance/runs/{run.pk}/"
    assert evidence.data["run"] == run.pk and evidence.data["failing"] == []
    assert evidence.data["cases"]["tools.required"] == "pass"
    check = conformance_check(plan)
    assert check.status == ev.PASS
    assert run.summary in check.result.summary


def test_the_legacy_a100_fails_tools_and_prompt_token_parity_and_blocks_the_gate(
        celery_worker, world: World, conformance_sim):  # noqa: F811
    candidate = point(world.candidate, conformance_sim, "legacy")
    point(world.primary, conformance_sim, "good")
    plan = world.plan()
    run = finished(services.run_create(actor=world.actor("oncall"), pool=candidate, plan=plan))
    assert (run.status, run.verdict) == ("complete", "fail"), run.error
    assert failing(run) == {"tools.required", "tools.named", "parity.prompt_tokens"}
    assert "required failing: tools, tool_choice required (no tool_calls)" in run.summary
    assert "prompt-token parity (+" in run.summary or "prompt-token parity (-" in run.summary
    assert "tokens vs h200-us" in run.summary
    parity = ConformanceCase.objects.get(run=run, key="parity.prompt_tokens")
    assert parity.required and parity.numbers["pool"] != parity.numbers["reference"]
    # The reference got the same tool requests and answered them.
    assert ConformanceCase.objects.get(run=run, key="tools.required",
                                       role="primary").status == "pass"
    evidence = Evidence.objects.get(kind="conformance", pool=candidate)
    assert evidence.verdict == "fail"
    assert set(evidence.data["required_failing"]) == failing(run)
    check = conformance_check(plan)
    assert check.status == ev.FAIL and "tool_calls" in check.result.summary


@pytest.mark.parametrize(("sim", "expected", "verdict"), [
    ("no-usage", {"chat.stream_usage"}, "fail"),
    ("no-json", {"response_format.json_object", "response_format.json_schema"}, "warn"),
])
def test_a_switched_off_feature_fails_exactly_its_cases(
        celery_worker, sim_pool, conformance_sim, system, sim, expected, verdict):
    pool = sim_pool(f"{sim}-pool", sim)
    reference = sim_pool("reference", "good")
    run = finished(services.run_create(actor=system, pool=pool, primary=reference))
    assert run.status == "complete", run.error
    assert failing(run) == expected
    assert run.verdict == verdict
    assert Evidence.objects.get(kind="conformance", pool=pool).verdict == verdict


def test_every_endpoint_is_probed_so_a_drifting_replica_is_caught(
        celery_worker, sim_pool, system):
    pool = sim_pool("mixed", "good", "legacy")
    reference = sim_pool("reference", "twin")
    run = finished(services.run_create(actor=system, pool=pool, primary=reference))
    assert run.verdict == "fail"
    tools = ConformanceCase.objects.filter(run=run, key="tools.required", role="pool")
    assert sorted(r.status for r in tools) == ["fail", "pass"]
    assert len({r.endpoint for r in tools}) == 2
    assert "no tool_calls; on 1 of 2 endpoints" in run.summary
    # The reference is probed on one endpoint only.
    assert ConformanceCase.objects.filter(run=run, key="tools.required",
                                          role="primary").count() == 1


def test_the_saturation_case_runs_only_when_asked_and_sees_retry_after(
        celery_worker, sim_pool, system):
    tiny = sim_pool("tiny-pool", "tiny")
    plain = finished(services.run_create(actor=system, pool=tiny))
    assert not ConformanceCase.objects.filter(run=plain, key="errors.rate_limit").exists()
    # Without a reference the parity cases are skipped, not failed.
    assert {r.key for r in ConformanceCase.objects.filter(run=plain, status="skip")} == {
        "parity.prompt_tokens", "parity.max_context"}
    flooded = finished(services.run_create(actor=system, pool=tiny, include_saturation=True,
                                           required_keys=["errors.rate_limit"]))
    row = ConformanceCase.objects.get(run=flooded, key="errors.rate_limit")
    assert row.required and row.status == "pass", row.got
    assert "Retry-After" in row.got


def test_a_pool_that_does_not_answer_fails_with_the_reason(celery_worker, make_pool, system):
    from fleetctl.fleet.services import pool_model_create

    down = make_pool(name="down", base_urls=["http://127.0.0.1:9"])
    pool_model_create(actor=system, pool=down, model_id="llama-3.1-8b-instruct",
                      max_context_tokens=8192)
    run = finished(services.run_create(actor=system, pool=down))
    assert (run.status, run.verdict) == ("complete", "fail")
    chat = ConformanceCase.objects.get(run=run, key="chat.basic")
    assert chat.status == "error" and "could not connect" in chat.got
    assert Evidence.objects.get(kind="conformance", pool=down).verdict == "fail"


def test_a_run_whose_worker_died_is_resumed_from_its_rows_or_failed(db, sim_pool, system):
    pool = sim_pool("resumed", "good")
    run = services.run_create(actor=system, pool=pool)  # no commit in this test: not queued
    long_ago = timezone.now() - timedelta(hours=1)
    ConformanceRun.objects.filter(pk=run.pk).update(status="running", heartbeat_at=long_ago,
                                                    started_at=long_ago)
    ConformanceCase.objects.create(run=run, pool=pool, role="pool", key="chat.basic",
                                   title="stored before the worker died", status="pass",
                                   endpoint=pool.base_urls[0].rstrip("/"), got="kept")
    # The reaper would fail it; a redelivered task takes it over first and resumes it.
    services.run_execute(run_id=run.pk)
    run.refresh_from_db()
    # Every case passes, but with no reference pool the required parity case was not
    # judged: a warn (approvable only with a reason), never a pass.
    assert (run.status, run.verdict) == ("complete", "warn"), run.error
    assert "required but not judged: prompt-token parity" in run.summary, run.summary
    assert run.summary.endswith("no reference pool")
    assert Evidence.objects.get(pk=run.evidence_id).data["required_skipped"] == [
        "parity.prompt_tokens"]
    kept = ConformanceCase.objects.get(run=run, key="chat.basic")
    assert kept.got == "kept"
    assert ConformanceCase.objects.filter(run=run).count() == len(services.cases_for(run))

    stuck = services.run_create(actor=system, pool=pool)
    ConformanceRun.objects.filter(pk=stuck.pk).update(status="running", heartbeat_at=long_ago)
    old = services.run_create(actor=system, pool=sim_pool("never-started", "good"))
    ConformanceRun.objects.filter(pk=old.pk).update(created_at=long_ago)
    fresh = services.run_create(actor=system, pool=sim_pool("just-queued", "good"))
    assert services.runs_reap() == 2
    stuck.refresh_from_db()
    old.refresh_from_db()
    assert stuck.status == "failed" and "no heartbeat since" in stuck.error
    assert old.status == "failed" and "probe queue" in old.error
    assert ConformanceRun.objects.get(pk=fresh.pk).status == "queued"
    assert not Evidence.objects.filter(pool=pool, source__contains=str(stuck.pk)).exists()
