"""Soaks (fleetctl/batch/soak.py) on a real simulator pool, a plan walked to stage 3 through
its gates, and real worker processes for the schedule: jobs start on the schedule (the tick is
called with a later `now` to travel past `every_s` and `ends_at`; the model keeps every_s ≥ 10
and duration_s ≥ 60), the soak passes with its `soak` and `cost-arbitrage` evidence, a
slowed candidate fails it, and every manual intervention — a person pausing a job, editing or
stopping the soak, draining the candidate, pausing the plan — fails it naming the person."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from fleetctl.batch import services as batch
from fleetctl.batch.models import BatchJob, Soak
from fleetctl.batch.soak import soak_create, soak_edit, soak_stop, soak_summary, soaks_tick
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Drain
from fleetctl.webhooks.models import Delivery, Webhook
from migrations_plan import evidence as ev
from migrations_plan import services as plans
from migrations_plan.models import Evidence, Plan
from tests.conftest import SYSTEM
from tests.migrations_plan.conftest import World
from tests.migrations_plan.helpers import walk_to
from tests.support.waiting import wait_until

from .factory import MODEL, upload, write_input
from .workerproc import WorkerProcess


@pytest.fixture
def make_world(sim_pool: Pool, sim_primary_pool: Pool,
               make_user: Callable[..., Any]) -> Callable[..., tuple[World, Plan]]:
    """A plan of the simulator's "batch" pool (candidate) against its "primary", walked
    through its gates to `stage` by people: alice opens it, bob approves and advances."""

    def make(stage: int = 3, **terms: Any) -> tuple[World, Plan]:
        route = traffic.route_create(actor=SYSTEM, name="llama", model_id=MODEL,
                                     primary_pool=sim_primary_pool)
        traffic.gateway_create(actor=SYSTEM, name="envoy-a", kind="envoy",
                               admin_address="http://127.0.0.1:1",
                               options={"config_dir": "/tmp/x"}, routes=[route])
        world = World(primary=sim_primary_pool, candidate=sim_pool, route=route,
                      author=make_user("alice", "platform-lead"),
                      lead=make_user("bob", "platform-lead"),
                      lead2=make_user("carol", "platform-lead"),
                      oncall=make_user("olga", "on-call"), viewer=make_user("vic", "viewer"),
                      admin=make_user("ada", "admin"))
        fields = {"slo_error_rate": 0.05, "latency_margin_pct": 90.0, **terms}
        plan = walk_to(world, world.plan(name="batch-plan", **fields), stage)
        return world, plan

    return make


@pytest.fixture
def stage3(make_world: Callable[..., tuple[World, Plan]]) -> tuple[World, Plan]:
    return make_world(3)


@pytest.fixture
def input_file(tmp_path: Path) -> Any:
    return upload(SYSTEM, write_input(tmp_path / "soak.jsonl", 20))


def start(world: World, plan: Plan, input_file: Any, **options: Any) -> Soak:
    fields = {"every_s": 10, "duration_s": 60, "concurrency": 4, "chunk_size": 10, **options}
    return soak_create(actor=world.actor("author"), plan=plan, input_file=input_file,
                       **fields)


def state_of(row: Any) -> str:
    row.refresh_from_db()
    return str(row.state)


@pytest.fixture
def workers(tmp_path: Path, transactional_db: None) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def begin(name: str = "w") -> WorkerProcess:
        worker = WorkerProcess(tmp_path, name)
        started.append(worker)
        return worker

    yield begin
    for worker in started:
        worker.stop()


def run_next_job(soak: Soak, worker: WorkerProcess) -> BatchJob:
    """Travel to when the next job is due, tick, and wait for the worker to finish it."""
    before = set(soak.jobs.values_list("pk", flat=True))
    soak.refresh_from_db()
    assert soak.next_job_at is not None
    soaks_tick(now=soak.next_job_at + timedelta(seconds=1))
    job = soak.jobs.exclude(pk__in=before).get()
    wait_until(lambda: state_of(job) == "completed", timeout_s=30, what=worker.log())
    return job


# --- the schedule, end to end ----------------------------------------------------------------

@pytest.mark.slow
def test_a_soak_runs_its_schedule_and_passes_with_its_evidence(stage3, input_file, workers):
    world, plan = stage3
    plans.plan_update(actor=world.actor("lead"), plan=plan, predicted_cost_per_1m="1000",
                      predicted_cost_currency="USD", predicted_cost_source="capacity plan")
    soak = start(world, plan, input_file)
    first = soak.jobs.get()  # started at once
    assert first.pool_id == world.candidate.pk and first.plan_id == plan.pk
    worker = workers("soaker")
    wait_until(lambda: state_of(first) == "completed", timeout_s=30, what=worker.log())

    soaks_tick(now=first.created_at + timedelta(seconds=5))  # every_s has not passed
    assert soak.jobs.count() == 1
    second = run_next_job(soak, worker)
    assert second.pk != first.pk

    soaks_tick(now=soak.ends_at + timedelta(seconds=1))
    soak.refresh_from_db()
    assert soak.state == "passed", soak_summary(soak).reasons
    row = soak.evidence
    assert row is not None and (row.kind, row.verdict, row.pool_id) == (
        "soak", "pass", world.candidate.pk)
    assert row.url == f"/batch/soaks/{soak.pk}/" and row.source == f"batch soak {soak.pk}"
    jobs = row.data["jobs"]
    assert [j["job"] for j in jobs] == [first.pk, second.pk]
    assert all(j["state"] == "completed" and j["error_rate"] == 0 and j["total"] == 20
               and j["output_tokens_per_s"] > 0 and j["requests_per_s"] > 0 for j in jobs)
    assert row.data["interventions"] == [] and row.data["reasons"] == []
    cost = soak.cost_evidence
    assert cost is not None and (cost.kind, cost.verdict) == ("cost-arbitrage", "pass")
    assert cost.data["predicted_cost_per_1m"] == "1000.0000"
    assert cost.data["measured_currency"] == "USD" and cost.data["jobs"] == [first.pk,
                                                                             second.pk]
    outcomes = {o.check.key: o for o in ev.evaluate_gate(plan).outcomes}
    assert outcomes["cost-arbitrage"].status == "pass"
    # The check measures the soak on the clock: seconds of jobs are not the 7 days it asks.
    assert outcomes["soak"].status == "insufficient"
    assert "passed but covered" in outcomes["soak"].result.summary
    assert outcomes["soak"].result.summary.endswith("of the 7.0 days asked.")
    check = plan.checks.get(stage=3, key="soak")
    plans.check_update(actor=world.actor("lead"), check=check, params={"min_days": 0})  # any
    soak_check = next(o for o in ev.evaluate_gate(plan).outcomes if o.check.key == "soak")
    assert soak_check.status == "pass", soak_check.result.summary
    soaks_tick(now=soak.ends_at + timedelta(seconds=60))  # an ended soak is left alone
    assert Evidence.objects.filter(kind="soak").count() == 1


@pytest.mark.slow
def test_a_candidate_that_slows_down_fails_the_soak(stage3, input_file, workers):
    world, plan = stage3
    plans.plan_update(actor=world.actor("lead"), plan=plan, latency_margin_pct=50)
    soak = start(world, plan, input_file)
    first = soak.jobs.get()
    worker = workers("soaker")
    wait_until(lambda: state_of(first) == "completed", timeout_s=30, what=worker.log())
    faults = f"{world.candidate.base_urls[0]}/admin/faults"
    httpx.post(faults, json={"added_latency_ms": 1000}, timeout=5).raise_for_status()
    try:
        second = run_next_job(soak, worker)
    finally:
        httpx.post(faults, json={"added_latency_ms": 0}, timeout=5).raise_for_status()
    soaks_tick(now=soak.ends_at + timedelta(seconds=1))
    soak.refresh_from_db()
    assert soak.state == "failed"
    assert f"job {second.pk}:" in soak.state_reason
    assert "the candidate slowed down over the soak" in soak.state_reason
    assert soak.evidence.verdict == "fail"


# --- manual interventions --------------------------------------------------------------------

@pytest.mark.django_db
def test_a_person_pausing_a_soak_job_fails_the_soak_naming_them(stage3, input_file):
    world, plan = stage3
    soak = start(world, plan, input_file)
    job = soak.jobs.get()
    batch.job_pause(actor=world.actor("oncall"), job=job, reason="the pool looks hot")
    soaks_tick()
    soak.refresh_from_db()
    assert soak.state == "failed"
    assert soak.state_reason.startswith("manual intervention by olga at ")
    assert "olga paused the job: the pool looks hot" in soak.state_reason
    summary = soak_summary(soak)
    assert summary.verdict == "fail"
    assert [(i.who, i.source) for i in summary.interventions] == [("olga", f"job {job.pk}")]
    assert soak.evidence.verdict == "fail"
    assert soak.evidence.data["interventions"][0]["who"] == "olga"
    assert soak.events.filter(kind="failed").exists()
    assert state_of(job) == "paused"  # the person's job is left as they left it


@pytest.mark.django_db
def test_editing_a_soak_is_an_intervention(stage3, input_file):
    world, plan = stage3
    soak = start(world, plan, input_file)
    edited = soak_edit(actor=world.actor("lead"), soak=soak, reason="fewer at once",
                       concurrency=2)
    assert edited.concurrency == 2 and edited.state == "running"
    event = soak.events.get(kind="edited")
    assert event.manual and "concurrency 4 → 2" in event.message
    soaks_tick()
    soak.refresh_from_db()
    assert soak.state == "failed" and "bob" in soak.state_reason
    with pytest.raises(ConflictError, match="only a running soak can be edited"):
        soak_edit(actor=world.actor("lead"), soak=soak, reason="again", concurrency=3)


@pytest.mark.django_db
def test_stopping_a_soak_cancels_its_job_and_records_a_failing_verdict(stage3, input_file):
    world, plan = stage3
    soak = start(world, plan, input_file)
    job = soak.jobs.get()
    with pytest.raises(ValidationError):
        soak_stop(actor=world.actor("lead"), soak=soak, reason="  ")
    stopped = soak_stop(actor=world.actor("lead"), soak=soak, reason="wrong input file")
    assert stopped.state == "stopped" and "bob" in stopped.state_reason
    assert state_of(job) == "cancelled"
    assert stopped.evidence.verdict == "fail" and stopped.cost_evidence is not None
    with pytest.raises(ConflictError, match="only a running soak can be stopped"):
        soak_stop(actor=world.actor("lead"), soak=soak, reason="again")


def test_a_running_soaks_input_file_is_not_deleted_until_the_soak_ends(stage3, input_file):
    """DELETE /openai/v1/files/{id}'s service: a running soak reads its file again at every
    job, so the file stays (409 naming the soak and its job) until the soak has ended."""
    world, plan = stage3
    soak = start(world, plan, input_file)
    job = soak.jobs.get()
    with pytest.raises(ConflictError, match=rf"still used by {job.public_id} \(queued\), "
                                            rf"soak {soak.pk} \(running\)"):
        batch.file_delete(actor=world.actor("author"), batch_file=input_file)
    input_file.refresh_from_db()
    assert input_file.deleted_at is None and batch.file_path(input_file).is_file()
    soak_stop(actor=world.actor("lead"), soak=soak, reason="done with this input")
    deleted = batch.file_delete(actor=world.actor("author"), batch_file=input_file)
    assert deleted.deleted_at is not None and deleted.deleted_by == "alice"
    with pytest.raises(ValidationError, match="was deleted by alice"):
        start(world, plan, input_file)


@pytest.mark.django_db
def test_a_persons_drain_of_the_candidate_fails_the_soak(stage3, input_file):
    world, plan = stage3
    soak = start(world, plan, input_file)
    # The rows a drain request leaves (traffic.drain_request needs live weight to move):
    # the health policy's own drain is the platform's, not an intervention; oncall's is.
    Drain.objects.create(pool=world.candidate, requested_by="system:health-policy",
                         reason="probe failed", drained_pools=[world.candidate.name])
    soaks_tick()
    assert state_of(soak) == "running"
    Drain.objects.create(pool=world.candidate, requested_by="olga", reason="latency spike",
                         drained_pools=[world.candidate.name])
    soaks_tick()
    soak.refresh_from_db()
    assert soak.state == "failed"
    assert "olga" in soak.state_reason and "latency spike" in soak.state_reason


@pytest.mark.django_db
def test_pausing_the_plan_fails_the_soak(stage3, input_file):
    world, plan = stage3
    soak = start(world, plan, input_file)
    plans.pause(actor=world.actor("oncall"), plan=plan, reason="incident on the candidate")
    soaks_tick()
    soak.refresh_from_db()
    assert soak.state == "failed"
    assert "olga" in soak.state_reason and "incident on the candidate" in soak.state_reason


@pytest.mark.django_db
def test_an_expired_job_fails_the_soak(stage3, input_file):
    world, plan = stage3
    soak = start(world, plan, input_file, completion_window_s=60)
    job = soak.jobs.get()
    batch.jobs_expire(now=timezone.now() + timedelta(seconds=61))
    soaks_tick()
    soak.refresh_from_db()
    assert soak.state == "failed" and f"job {job.pk} expired" in soak.state_reason


@pytest.mark.django_db
def test_a_finished_soak_tells_the_webhooks(stage3, input_file):
    world, plan = stage3
    Webhook.objects.create(name="ops", url="http://127.0.0.1:9/", events=["batch.soak"],
                           created_by="ada")
    soak = start(world, plan, input_file)
    soak_stop(actor=world.actor("lead"), soak=soak, reason="wrong input file")
    delivery = Delivery.objects.get(event="batch.soak")
    assert delivery.payload["data"]["soak"] == soak.pk
    assert delivery.payload["data"]["verdict"] == "fail"


# --- refusals --------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_soak_needs_the_plan_at_stage_3(make_world, input_file):
    world, plan = make_world(2)
    with pytest.raises(ConflictError, match=r"batch-plan is at stage 2 \(shadow\).*stage 3"):
        start(world, plan, input_file)
    assert not Soak.objects.exists() and not BatchJob.objects.exists()


@pytest.mark.django_db
def test_a_paused_plan_and_a_second_soak_are_refused(stage3, input_file):
    world, plan = stage3
    soak = start(world, plan, input_file)
    with pytest.raises(ConflictError, match=f"already has a running soak: soak {soak.pk}"):
        start(world, plan, input_file)
    soak_stop(actor=world.actor("lead"), soak=soak, reason="done looking")
    plans.pause(actor=world.actor("oncall"), plan=plan, reason="incident")
    with pytest.raises(ConflictError, match=r"paused at stage 3"):
        start(world, plan, input_file)
    assert Soak.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(("options", "field", "words"), [
    ({"every_s": 5}, "every_s", "out of range: from 10"),
    ({"duration_s": 30}, "duration_s", "out of range: from 60"),
    ({"every_s": 60, "duration_s": 60}, "every_s", "at least two jobs"),
    ({"concurrency": 0}, "concurrency", "out of range"),
    ({"drill": "explode"}, "drill", "not a drill"),
    ({"every_s": "soon"}, "every_s", "whole number"),
])
def test_bad_options_are_refused_and_nothing_is_stored(stage3, input_file, options, field,
                                                       words):
    world, plan = stage3
    with pytest.raises(ValidationError) as refused:
        start(world, plan, input_file, **options)
    assert words in " ".join(refused.value.message_dict[field])
    assert not Soak.objects.exists() and not BatchJob.objects.exists()


@pytest.mark.django_db
def test_a_model_the_candidate_does_not_serve_is_refused(stage3, tmp_path):
    world, plan = stage3
    other = upload(SYSTEM, write_input(tmp_path / "other.jsonl", 3, model="qwen-2.5-7b"))
    with pytest.raises(ValidationError) as refused:
        start(world, plan, other)
    assert "line 1: model 'qwen-2.5-7b' is not served" in refused.value.message_dict[
        "input_file"][0]
    assert not Soak.objects.exists()


# --- REST ------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_soaks_api(stage3, input_file, client_for):
    _, plan = stage3
    base = "/api/v1/batch/soaks/"
    body = {"plan": plan.name, "input_file": input_file.pk, "every_s": 10, "duration_s": 60,
            "concurrency": 4, "chunk_size": 10}
    viewer = client_for("viewer", username="val")
    assert viewer.post(base, body, format="json").status_code == 403
    lead = client_for("platform-lead", username="dora")
    made = lead.post(base, body, format="json")
    assert made.status_code == 201, made.json()
    soak = made.json()
    assert soak["plan"] == plan.name and soak["state"] == "running"
    assert soak["summary"]["verdict"] == "running" and len(soak["summary"]["jobs"]) == 1
    assert soak["arbitrage"]["status"] == "insufficient"
    assert lead.post(base, body, format="json").status_code == 409
    assert viewer.get(base).json()["count"] == 1
    assert viewer.get(f"{base}?state=failed").json()["count"] == 0

    url = f"{base}{soak['id']}/"
    bad = lead.patch(url, {"reason": "x", "every_s": 5}, format="json")
    assert bad.status_code == 400 and "every_s" in str(bad.json())
    assert lead.patch(url, {"every_s": 20}, format="json").status_code == 400  # no reason
    edited = lead.patch(url, {"reason": "slower", "every_s": 20}, format="json")
    assert edited.status_code == 200 and edited.json()["every_s"] == 20
    assert any(e["manual"] and e["kind"] == "edited" for e in edited.json()["events"])
    stopped = lead.post(f"{url}stop/", {"reason": "done"}, format="json")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    assert lead.post(f"{url}stop/", {"reason": "again"}, format="json").status_code == 409
    assert viewer.get(f"{base}999999/").status_code == 404


# --- the demo ----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_demo_seeds_the_a100_plan_into_stage_3_with_a_soak_running(settings, tmp_path):
    import io

    from django.core.management import call_command

    from fleetctl.batch.models import BatchFile
    from fleetctl.fleet.models import CurrencyRate
    from fleetctl.traffic import selectors as traffic_selectors
    from fleetctl.traffic.models import Route

    args = ["demo_seed", "--password", "demo-pw", "--gateway-admin", "http://127.0.0.1:1",
            "--gateway-config-dir", str(tmp_path)]
    notes = io.StringIO()
    call_command(*args, stdout=io.StringIO(), stderr=notes)
    said = notes.getvalue()
    assert "a100-llama-8b" not in said and BATCH_WORDS not in said, said

    plan = Plan.objects.get(name="a100-llama-8b")
    assert plan.state == "stage-3"
    assert [m.by for m in plan.moves.order_by("at")] == ["lead2", "lead2"]
    assert (str(plan.predicted_cost_per_1m), plan.predicted_cost_currency) == ("15.0000", "EUR")
    assert "capacity plan" in plan.predicted_cost_source
    route = Route.objects.get(name="llama-8b-batch")
    assert route.latency_class == "batch" and route.primary_pool.name == "h200-us-east"
    assert set(plan.routes.values_list("name", flat=True)) == {"llama-8b", "llama-8b-batch"}
    weights = traffic_selectors.revision_current(route=route).weights
    assert weights == {"h200-us-east": 8000, "a100-eu-central": 2000}
    assert CurrencyRate.objects.get().label == "1.08 USD/EUR"
    # The soak's pool is interruptible: its drill prices the tax of every cost of it.
    assert soak_pool_tax() == (True, "8.00", "10.00")

    soak = Soak.objects.get()
    assert (soak.plan, soak.pool.name, soak.state, soak.created_by) == (
        plan, "a100-eu-central", "running", "lead")
    assert (soak.every_s, soak.duration_s, soak.concurrency, soak.drill) == (
        60, 480, 8, "kill-worker")
    assert soak.input_file.requests == 200
    job = soak.jobs.get()
    assert (job.drill, job.drill_at, job.concurrency, job.state) == (
        "kill-worker", 0.4, 8, "queued")

    again = io.StringIO()
    call_command(*args, stdout=io.StringIO(), stderr=again)
    assert Soak.objects.count() == 1 and BatchFile.objects.count() == 1
    assert route.revisions.count() == 2 and CurrencyRate.objects.count() == 1


def soak_pool_tax() -> tuple[bool, str, str]:
    from fleetctl.fleet.models import Pool

    pool = Pool.objects.get(name="a100-eu-central")
    return pool.interruptible, str(pool.reclaims_per_month), str(pool.standby_pct)


BATCH_WORDS = "llama-8b-batch"
