"""The evidence jobs' one lifecycle (migrations_plan/jobs.py): the plan's targets resolved
with one set of refusals, taking a run, beating, cancelling, failing, finishing once with
the evidence hook, and reaping with each kind's policy."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from fleetctl.audit.models import AuditEvent
from fleetctl.conformance.models import ConformanceRun
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from migrations_plan import jobs
from migrations_plan.models import Plan
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db


def refusal(field: str, call: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        call()
    assert field in caught.value.message_dict, caught.value.message_dict
    return " ".join(caught.value.message_dict[field])


# --- targets ----------------------------------------------------------------------------------

def test_a_plans_targets_are_its_pools_and_its_routes_model(world: World):  # noqa: F811
    plan = world.plan()
    targets = jobs.resolve_plan_targets(plan, noun="runs")
    assert (targets.candidate, targets.primary, targets.model_id) == (
        world.candidate, world.primary, MODEL)
    assert [(t.field, t.role) for t in targets.targets] == [
        ("candidate", "candidate"), ("primary", "primary")]
    # The plan's own pools named again are fine; the caller's field names are kept.
    named = jobs.resolve_plan_targets(plan, noun="runs", candidate=world.candidate,
                                      primary=world.primary, fields={"candidate": "pool"})
    assert named.targets[0].field == "pool"


def test_refusals_are_filed_under_the_callers_field(world: World, make_pool, system):  # noqa: F811
    plan = world.plan()
    other = make_pool(name="other")
    assert "Plan mi300x-llama migrates to mi300x-us, not other" in refusal(
        "pool", lambda: jobs.resolve_plan_targets(plan, noun="runs", candidate=other,
                                                  fields={"candidate": "pool"}))
    assert "Plan mi300x-llama's primary is h200-us" in refusal(
        "primary", lambda: jobs.resolve_plan_targets(plan, noun="runs", primary=other))
    assert "Name the candidate pool" in refusal(
        "candidate", lambda: jobs.resolve_plan_targets(None, noun="runs"))
    assert "named twice (as candidate and primary)" in refusal(
        "primary", lambda: jobs.resolve_plan_targets(None, noun="runs",
                                                     candidate=world.candidate,
                                                     primary=world.candidate))
    Pool.objects.filter(pk=other.pk).update(base_urls=[" "])
    assert "Pool other has no endpoints" in refusal(
        "others", lambda: jobs.resolve_plan_targets(
            None, noun="runs", candidate=world.candidate,
            others=[Pool.objects.get(pk=other.pk)]))


def test_the_model_is_the_one_all_serve_else_the_candidates_only_one(
        world: World, make_pool, system):  # noqa: F811
    bare = make_pool(name="bare")
    # The candidate's only model; the pool lacking it is named.
    assert "Pool bare does not serve llama-3.1-8b-instruct (it serves no model)" in refusal(
        "primary", lambda: jobs.resolve_plan_targets(None, noun="runs",
                                                     candidate=world.candidate, primary=bare))
    assert "bare serves no model yet" in refusal(
        "model", lambda: jobs.resolve_plan_targets(None, noun="runs", candidate=bare))
    pool_model_create(actor=system, pool=world.candidate, model_id="qwen-7b",
                      max_context_tokens=4096)
    pool_model_create(actor=system, pool=bare, model_id="mistral-7b", max_context_tokens=4096)
    assert "No model is served by all of mi300x-us, bare" in refusal(
        "model", lambda: jobs.resolve_plan_targets(None, noun="runs",
                                                   candidate=world.candidate, primary=bare))
    pool_model_create(actor=system, pool=world.primary, model_id="qwen-7b",
                      max_context_tokens=4096)
    assert "The pools serve llama-3.1-8b-instruct, qwen-7b in common: name the model" in \
        refusal("model", lambda: jobs.resolve_plan_targets(
            None, noun="runs", candidate=world.candidate, primary=world.primary))
    # A plan's routes say which.
    assert jobs.resolve_plan_targets(world.plan(), noun="runs").model_id == MODEL
    assert "does not serve gpt-5" in refusal(
        "candidate", lambda: jobs.resolve_plan_targets(None, noun="runs",
                                                       candidate=world.candidate,
                                                       model_id="gpt-5"))


def test_a_closed_plan_feeds_no_job(world: World):  # noqa: F811
    plan = world.plan()
    Plan.objects.filter(pk=plan.pk).update(state=Plan.State.ABANDONED)
    with pytest.raises(ConflictError, match=re.escape(
            "Plan mi300x-llama is abandoned: runs are for open plans; leave the plan out.")):
        jobs.resolve_plan_targets(Plan.objects.get(pk=plan.pk), noun="runs")


# --- lifecycle --------------------------------------------------------------------------------

def _run(world: World, **fields: Any) -> ConformanceRun:  # noqa: F811
    return ConformanceRun.objects.create(**{"pool": world.candidate, "model_id": MODEL,
                                            "created_by": "x", **fields})


def test_take_beat_and_take_over(world: World):  # noqa: F811
    run = _run(world)
    assert jobs.take(ConformanceRun, run.pk, worker="w1")
    assert not jobs.take(ConformanceRun, run.pk, worker="w2")  # one taker wins
    run.refresh_from_db()
    assert (run.status, run.worker) == ("running", "w1") and run.started_at
    assert jobs.heartbeat(run, worker="w1") and not jobs.heartbeat(run, worker="w2")
    # Fresh: not taken over. Stale: taken over, the caller's extra fields set.
    assert not jobs.take(ConformanceRun, run.pk, worker="w2", resume_after_s=60)
    ConformanceRun.objects.filter(pk=run.pk).update(
        heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert jobs.take(ConformanceRun, run.pk, worker="w2", resume_after_s=60, summary="again")
    run.refresh_from_db()
    assert (run.worker, run.summary, run.started_at is not None) == ("w2", "again", True)
    assert not jobs.heartbeat(run, worker="w1")  # the old driver stops at its next beat


def test_cancel_once_with_who_and_then_the_driver_stops(world: World):  # noqa: F811
    run = _run(world)
    with pytest.raises(PermissionDeniedError):
        jobs.cancel(world.actor("viewer"), run, action="x.cancel", noun="Run")
    cancelled = jobs.cancel(world.actor("oncall"), run, action="x.cancel", noun="Run",
                            after=lambda r: {"extra": 1})
    assert (cancelled.status, cancelled.cancelled_by, cancelled.error) == (
        "cancelled", "olga", "cancelled by olga") and cancelled.finished_at
    event = AuditEvent.objects.exclude(outcome="denied").get(action="x.cancel")
    assert (event.before, event.after) == ({"status": "queued"},
                                           {"status": "cancelled", "extra": 1})
    with pytest.raises(ConflictError, match=r"Run \d+ is cancelled; only a queued or running"):
        jobs.cancel(world.actor("oncall"), cancelled, action="x.cancel", noun="Run")
    assert not jobs.heartbeat(cancelled)
    assert not jobs.fail(cancelled, "too late")


def test_finish_once_in_one_transaction_with_the_evidence_hook(world: World):  # noqa: F811
    run = _run(world, status="running")
    seen: list[str] = []

    def evidence(locked: ConformanceRun) -> dict[str, Any]:
        seen.append(locked.status)
        return {"evidence": 7}

    done = jobs.finish(run, actor=world.actor("oncall"), action="x.finish", evidence=evidence,
                       fields={"verdict": "pass"}, after={"verdict": "pass"})
    assert (done.status, done.verdict, seen) == ("complete", "pass", ["complete"])
    assert AuditEvent.objects.get(action="x.finish").after == {
        "status": "complete", "verdict": "pass", "evidence": 7}
    again = jobs.finish(done, actor=world.actor("oncall"), action="x.finish", evidence=evidence)
    assert again.status == "complete" and seen == ["complete"]  # once

    def broken(locked: ConformanceRun) -> dict[str, Any]:
        raise RuntimeError("the evidence could not be written")

    other = _run(world, status="running", pool=world.primary)
    with pytest.raises(RuntimeError):
        jobs.finish(other, actor=world.actor("oncall"), action="x.finish", evidence=broken)
    assert ConformanceRun.objects.get(pk=other.pk).status == "running"  # nothing half-done


def test_reap_fails_or_resumes_by_policy(world: World):  # noqa: F811
    long_ago = timezone.now() - timedelta(hours=1)
    stuck = _run(world, status="running", heartbeat_at=long_ago)
    never = _run(world)
    ConformanceRun.objects.filter(pk=never.pk).update(created_at=long_ago)
    fresh = _run(world, status="running", heartbeat_at=timezone.now())
    tidied: list[int] = []
    assert jobs.reap(ConformanceRun, policy=jobs.Reap.FAIL, stale_after_s=300,
                     queued_after_s=900, queue="probe", kept="what it did is kept",
                     on_failed=lambda r: tidied.append(r.pk)) == 2
    stuck.refresh_from_db()
    assert stuck.status == "failed" and "no heartbeat since" in stuck.error
    assert "what it did is kept" in stuck.error and tidied == [stuck.pk]
    assert "within 15 minutes: is a Celery worker consuming the probe queue" in \
        ConformanceRun.objects.get(pk=never.pk).error
    assert ConformanceRun.objects.get(pk=fresh.pk).status == "running"

    ConformanceRun.objects.filter(pk=fresh.pk).update(heartbeat_at=long_ago)
    queued = _run(world)
    ConformanceRun.objects.filter(pk=queued.pk).update(created_at=long_ago)
    resumed: list[int] = []
    assert jobs.reap(ConformanceRun, policy=jobs.Reap.RESUME, stale_after_s=60,
                     queued_after_s=60, resume=resumed.append) == 2
    assert sorted(resumed) == sorted([fresh.pk, queued.pk])
    assert ConformanceRun.objects.get(pk=fresh.pk).status == "running"  # left to a taker
    # A queued one is sent again at most once per stale period (its heartbeat marks when).
    assert jobs.reap(ConformanceRun, policy=jobs.Reap.RESUME, stale_after_s=60,
                     queued_after_s=60, resume=resumed.append) == 1
