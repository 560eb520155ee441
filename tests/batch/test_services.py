"""Batch services: uploads, job creation and its refusals (nothing stored), the plan a job
belongs to, a person's pause / resume / cancel / edit (manual events, audit, 409s), and the
tick's expiry with partial output kept."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.batch import outputs, selectors, services, tasks
from fleetctl.batch.models import BatchChunk, BatchFile, BatchJob, BatchJobEvent, BatchResult
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from tests.migrations_plan.conftest import World, world  # noqa: F401
from tests.migrations_plan.helpers import walk_to

from .factory import make_job, request_line, upload, write_input


def _person(make_user, *roles: str) -> Actor:
    return Actor(user=make_user("-".join(roles) or "nobody", *roles))


def test_a_job_is_created_on_the_sim_pool_split_into_chunks(sim_pool, tmp_path, system):
    job = make_job(system, sim_pool, n=23, tmp_path=tmp_path, chunk_size=10)
    assert job.state == BatchJob.State.QUEUED and job.total == 23
    assert job.expires_at == job.created_at + timedelta(seconds=86400)
    chunks = list(BatchChunk.objects.filter(job=job).order_by("number"))
    assert [(c.first_index, c.last_index, c.first_line) for c in chunks] == [
        (0, 9, 1), (10, 19, 11), (20, 22, 21)]
    # The byte ranges cover the file's lines exactly, one after the other.
    data = services.file_path(job.input_file).read_bytes()
    assert chunks[0].byte_start == 0 and chunks[-1].byte_end == len(data)
    assert all(a.byte_end == b.byte_start for a, b in itertools.pairwise(chunks))
    assert data[chunks[1].byte_start:].startswith(b'{"custom_id": "req-10"')
    event = BatchJobEvent.objects.get(job=job)
    assert event.kind == "created" and not event.manual and event.data["chunks"] == 3
    assert AuditEvent.objects.filter(action="batch.job_create", outcome="ok").count() == 1


def test_chunks_are_stored_in_batches_for_a_large_file(sim_pool, tmp_path, system,
                                                       monkeypatch):
    monkeypatch.setattr(services, "CHUNK_INSERT_BATCH", 7)
    job = make_job(system, sim_pool, n=100, tmp_path=tmp_path, chunk_size=3)
    numbers = list(job.chunks.order_by("number").values_list("number", "first_index"))
    assert len(numbers) == 34 and numbers[-1] == (33, 99)
    assert numbers == [(n, 3 * n) for n in range(34)]


def test_a_model_the_pool_does_not_serve_is_refused_naming_the_first_line(sim_pool,
                                                                          tmp_path, system):
    path = tmp_path / "in.jsonl"
    rows = [request_line(0), request_line(1, model="qwen-72b"), request_line(2),
            request_line(3, model="qwen-72b")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    batch_file = upload(system, path)
    assert batch_file.model_lines == {"llama-3.1-8b-instruct": 1, "qwen-72b": 2}
    with pytest.raises(ValidationError) as refused:
        services.job_create(actor=system, input_file=batch_file, pool=sim_pool)
    message = refused.value.message_dict["input_file"][0]
    assert message.startswith("line 2: model 'qwen-72b' is not served by pool batch-sim (it "
                              "serves llama-3.1-8b-instruct)")
    assert not BatchJob.objects.exists() and not BatchChunk.objects.exists()
    assert not BatchJobEvent.objects.exists()


@pytest.mark.parametrize(("options", "field"), [
    ({"concurrency": 0}, "concurrency"), ({"concurrency": 2.5}, "concurrency"),
    ({"chunk_size": 10_001}, "chunk_size"), ({"max_attempts": 0}, "max_attempts"),
    ({"completion_window_s": 8 * 86400}, "completion_window_s"),
    ({"rate_limit_rps": float("nan")}, "rate_limit_rps"), ({"rate_limit_rps": 0}, "rate_limit_rps"),
    ({"drill": "nuke"}, "drill"), ({"drill_at": 0.01}, "drill_at"),
    ({"compare_sample": 501}, "compare_sample"), ({"request_timeout_s": 0}, "request_timeout_s"),
    ({"concurrency": True}, "concurrency"),
])
def test_options_out_of_range_are_refused_before_anything_is_stored(sim_pool, tmp_path,
                                                                    system, options, field):
    batch_file = upload(system, write_input(tmp_path / "in.jsonl", 3))
    with pytest.raises(ValidationError) as refused:
        services.job_create(actor=system, input_file=batch_file, pool=sim_pool, **options)
    assert list(refused.value.message_dict) == [field]
    assert not BatchJob.objects.exists()


def test_a_file_gone_from_disk_is_refused(sim_pool, tmp_path, system):
    batch_file = upload(system, write_input(tmp_path / "in.jsonl", 3))
    services.file_path(batch_file).unlink()
    with pytest.raises(ValidationError, match="no longer on disk"):
        services.job_create(actor=system, input_file=batch_file, pool=sim_pool)


def test_a_viewer_cannot_upload_or_create(sim_pool, tmp_path, system, make_user,
                                          batch_files_dir):
    viewer = _person(make_user, "viewer")
    path = write_input(tmp_path / "in.jsonl", 3)
    with pytest.raises(PermissionDeniedError), path.open("rb") as stream:
        services.file_upload(actor=viewer, name="in.jsonl", stream=stream)
    assert list(batch_files_dir.iterdir()) == []
    batch_file = upload(system, path)
    with pytest.raises(PermissionDeniedError):
        services.job_create(actor=viewer, input_file=batch_file, pool=sim_pool)
    assert AuditEvent.objects.filter(action="batch.job_create", outcome="denied").exists()


def test_a_bad_upload_stores_no_row_and_no_file(db, system, batch_files_dir, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(request_line(0)) + "\n" + json.dumps(request_line(0)) + "\n")
    with pytest.raises(ValidationError) as refused, path.open("rb") as stream:
        services.file_upload(actor=system, name="bad.jsonl", stream=stream)
    assert refused.value.message_dict["file"] == [
        'line 2: custom_id "req-0" is already on line 1; each request needs its own custom_id']
    assert not BatchFile.objects.exists() and list(batch_files_dir.iterdir()) == []


def test_submit_in_one_step_keeps_nothing_when_the_job_is_refused(sim_pool, tmp_path, system,
                                                                  batch_files_dir):
    path = write_input(tmp_path / "in.jsonl", 3, model="mystery")
    with pytest.raises(ValidationError) as refused, path.open("rb") as stream:
        services.job_submit(actor=system, name="in.jsonl", stream=stream, pool=sim_pool)
    assert refused.value.message_dict["file"][0].startswith("line 1: model 'mystery'")
    assert not BatchFile.objects.exists() and list(batch_files_dir.iterdir()) == []


# --- plans and the stage rule -----------------------------------------------------------------

def test_the_stage_rule_refuses_a_candidate_below_stage_3_and_the_job_joins_its_plan(
        world: World, tmp_path, system):  # noqa: F811
    plan = world.plan()
    with pytest.raises(ValidationError) as refused:
        make_job(system, world.candidate, n=3, tmp_path=tmp_path)
    assert "need stage 3 (batch)" in refused.value.message_dict["pool"][0]
    assert not BatchJob.objects.exists()
    plan = walk_to(world, plan, 3)
    job = make_job(system, world.candidate, n=3, tmp_path=tmp_path)
    assert job.plan_id == plan.pk
    # A job on the primary is the plan's too (its baseline), and never refused.
    assert make_job(system, world.primary, n=3, tmp_path=tmp_path).plan_id == plan.pk


def test_a_plan_sent_back_below_stage_3_pauses_its_candidates_jobs_and_says_why(
        world: World, tmp_path, system):  # noqa: F811
    from migrations_plan import services as plans

    plan = walk_to(world, world.plan(), 3)
    queued = make_job(system, world.candidate, n=3, tmp_path=tmp_path)
    running = make_job(system, world.candidate, n=3, tmp_path=tmp_path)
    BatchJob.objects.filter(pk=running.pk).update(state="running")
    baseline = make_job(system, world.primary, n=3, tmp_path=tmp_path)
    # A pause at stage 3 keeps the candidate's batch work going (it proved stage 2).
    plan = plans.pause(actor=world.actor("oncall"), plan=plan, reason="look at the p95")
    plan = plans.resume(actor=world.actor("lead"), plan=plan, reason="p95 fine")
    assert {j.state for j in BatchJob.objects.filter(pool=world.candidate)} == {
        "queued", "running"}

    plans.regress(actor=world.actor("lead"), plan=plan, to_stage=2, reason="shadow regressed")

    for job in (queued, running):
        job.refresh_from_db()
        assert job.state == "paused"
        assert "moved from stage-3 to stage-2" in job.state_reason
        assert "shadow regressed" in job.state_reason and "need stage 3" in job.state_reason
        event = BatchJobEvent.objects.filter(job=job, kind="paused").get()
        assert event.actor == f"system:plan-{plan.name}" and not event.manual
        assert AuditEvent.objects.filter(action="batch.job_pause", object_id=str(job.pk),
                                         actor=f"system:plan-{plan.name}").exists()
    baseline.refresh_from_db()
    assert baseline.state == "queued"  # the primary's job is not the rule's business
    with pytest.raises(ConflictError, match="need stage 3"):
        services.job_resume(actor=system, job=queued, reason="try anyway")


def test_a_pool_in_no_plan_runs_jobs_without_one(sim_pool, tmp_path, system):
    assert make_job(system, sim_pool, n=2, tmp_path=tmp_path).plan is None


# --- a person's actions -----------------------------------------------------------------------

def test_pause_resume_edit_cancel_are_manual_audited_and_refused_in_the_wrong_state(
        sim_pool, tmp_path, system, make_user):
    lead = _person(make_user, "on-call")
    job = make_job(system, sim_pool, n=4, tmp_path=tmp_path)
    with pytest.raises(ConflictError, match="only a paused job can be resumed"):
        services.job_resume(actor=lead, job=job, reason="go")
    with pytest.raises(ValidationError) as no_reason:
        services.job_pause(actor=lead, job=job, reason="  ")
    assert "reason" in no_reason.value.message_dict
    assert services.job_pause(actor=lead, job=job, reason="cooling").state == "paused"
    # A running job resumes to running, a never-started one to queued.
    assert services.job_resume(actor=lead, job=job, reason="ok").state == "queued"
    BatchJob.objects.filter(pk=job.pk).update(state="running", started_at=timezone.now())
    services.job_pause(actor=lead, job=job, reason="again")
    assert services.job_resume(actor=lead, job=job, reason="ok").state == "running"

    edited = services.job_edit(actor=lead, job=job, concurrency=2, rate_limit_rps=1.5,
                               reason="gentler")
    assert (edited.concurrency, edited.rate_limit_rps) == (2, 1.5)
    assert services.job_edit(actor=lead, job=job, rate_limit_rps=0,
                             reason="no limit").rate_limit_rps is None
    with pytest.raises(ValidationError) as nothing:
        services.job_edit(actor=lead, job=job, reason="nothing")
    assert "concurrency" in nothing.value.message_dict
    with pytest.raises(ValidationError):
        services.job_edit(actor=lead, job=job, concurrency=257, reason="too many")

    assert services.job_cancel(actor=lead, job=job, reason="enough").state == "cancelled"
    for act in (services.job_pause, services.job_cancel):
        with pytest.raises(ConflictError):
            act(actor=lead, job=job, reason="late")
    with pytest.raises(ConflictError):
        services.job_edit(actor=lead, job=job, concurrency=1, reason="late")

    events = list(BatchJobEvent.objects.filter(job=job).values_list("kind", "manual", "actor"))
    assert [kind for kind, _, _ in events] == ["created", "paused", "resumed", "paused",
                                               "resumed", "edited", "edited", "cancelled"]
    assert all(manual and actor == "on-call" for kind, manual, actor in events[1:])
    assert AuditEvent.objects.filter(action__startswith="batch.job_", outcome="ok",
                                     actor="on-call").count() == 7
    job.refresh_from_db()
    assert job.finished_at is not None and job.state_reason == "enough"


def test_a_viewer_cannot_pause(sim_pool, tmp_path, system, make_user):
    job = make_job(system, sim_pool, n=2, tmp_path=tmp_path)
    with pytest.raises(PermissionDeniedError):
        services.job_pause(actor=_person(make_user, "viewer"), job=job, reason="x")
    assert BatchJob.objects.get(pk=job.pk).state == "queued"


def test_resume_after_the_window_is_refused(sim_pool, tmp_path, system):
    job = make_job(system, sim_pool, n=2, tmp_path=tmp_path)
    services.job_pause(actor=system, job=job, reason="hold")
    BatchJob.objects.filter(pk=job.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(ConflictError, match="completion window ended"):
        services.job_resume(actor=system, job=job, reason="go")


# --- expiry -----------------------------------------------------------------------------------

def test_jobs_past_their_window_expire_with_partial_output_kept(sim_pool, tmp_path, system):
    due = make_job(system, sim_pool, n=6, tmp_path=tmp_path, chunk_size=3,
                   completion_window_s=60)
    later = make_job(system, sim_pool, n=2, tmp_path=tmp_path, completion_window_s=3600)
    done = make_job(system, sim_pool, n=2, tmp_path=tmp_path, completion_window_s=60)
    BatchJob.objects.filter(pk=done.pk).update(state="completed")
    # The first chunk is held by a worker and has two results.
    BatchJob.objects.filter(pk=due.pk).update(state="running", started_at=timezone.now())
    first = due.chunks.get(number=0)
    BatchChunk.objects.filter(pk=first.pk).update(
        state="running", lease_owner="w1", lease_until=timezone.now() + timedelta(seconds=30),
        succeeded=2, dispatched_through=2)
    for index in (0, 1):
        BatchResult.objects.create(job=due, index=index, custom_id=f"req-{index}",
                                   status_code=200, body='{"ok": true}', worker="w1")

    assert services.jobs_expire(timezone.now()) == 0
    now = timezone.now() + timedelta(seconds=61)
    assert services.jobs_expire(now) == 1
    assert services.jobs_expire(now) == 0  # once only
    due.refresh_from_db()
    assert due.state == "expired" and due.finished_at == now
    assert "with 2 of 6 requests done" in due.state_reason
    chunk = BatchChunk.objects.get(pk=first.pk)
    assert (chunk.state, chunk.lease_owner, chunk.lease_until) == ("pending", "", None)
    assert BatchJob.objects.get(pk=later.pk).state == "queued"
    assert BatchJob.objects.get(pk=done.pk).state == "completed"
    event = BatchJobEvent.objects.get(job=due, kind="expired")
    assert not event.manual and event.data == {"done": 2, "total": 6}
    # The partial output stays.
    assert [json.loads(line)["custom_id"] for line in outputs.output_lines(due)] == [
        "req-0", "req-1"]
    progress = selectors.job_progress(due)
    assert (progress.done, progress.fraction, progress.eta_s) == (2, 2 / 6, None)


def test_the_tick_expires_jobs(sim_pool, tmp_path, system):
    job = make_job(system, sim_pool, n=2, tmp_path=tmp_path, completion_window_s=10)
    BatchJob.objects.filter(pk=job.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert tasks.tick()["expired"] == 1
    assert BatchJob.objects.get(pk=job.pk).state == "expired"
