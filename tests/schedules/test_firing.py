"""Firing, on a controllable clock (`schedules_due(now=…)`): one occurrence starts one job
however often or concurrently it is fired; an occurrence past its window is recorded missed
and notifies, without a job; a re-benchmark the same day as the last is skipped; a refused
start is failed and notifies; a started job's end is followed."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.bench import services as bench
from fleetctl.bench.models import Run
from fleetctl.conformance.models import ConformanceRun
from fleetctl.schedules import services
from fleetctl.schedules.models import Schedule, ScheduleRun
from fleetctl.traffic.models import Drain
from fleetctl.webhooks.models import Delivery
from tests.migrations_plan.conftest import MODEL
from tests.schedules.conftest import T0, World, next_run

LEAD = "author"


def _schedule(world: World, plan, **fields) -> Schedule:
    fields = {"kind": "conformance", "cron": "*/5 * * * *", "window_minutes": 3, **fields}
    return services.schedule_create(actor=world.actor(LEAD), plan=plan, now=T0, **fields)


def _timeline(plan) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(object_type="migrations_plan.plan",
                                          object_id=plan.pk, action="schedule.run")
                .order_by("pk"))


def test_an_occurrence_fired_twice_with_the_same_now_starts_one_job(world: World, hook):
    plan = world.plan()
    schedule = _schedule(world, plan)
    assert schedule.next_run_at == T0 + timedelta(minutes=5)
    now = next_run(schedule) + timedelta(seconds=20)
    first = services.schedules_due(now)
    again = services.schedules_due(now)
    assert [r.outcome for r in first] == ["started"] and again == []
    run = ConformanceRun.objects.get()
    assert run.created_by == "system:schedule" and run.plan_id == plan.pk
    row = ScheduleRun.objects.get()
    assert (row.job_kind, row.job_id, row.due_at) == ("conformance.run", run.pk,
                                                      T0 + timedelta(minutes=5))
    schedule.refresh_from_db()
    assert schedule.next_run_at == T0 + timedelta(minutes=10)
    assert schedule.last_run_at == now
    [event] = _timeline(plan)
    assert event.actor == "system:schedule"
    assert f"conformance run {run.pk}" in event.message
    assert not Delivery.objects.exists()  # a start is not news


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_beats_start_one_job(world: World):
    """Two threads, each on its own database connection, fire the same occurrence at once:
    the conditional UPDATE lets one through."""
    plan = world.plan()
    schedule = _schedule(world, plan)
    now = next_run(schedule) + timedelta(seconds=1)
    start = threading.Barrier(2)
    results: list[list[ScheduleRun]] = []
    errors: list[BaseException] = []

    def fire() -> None:
        try:
            start.wait(timeout=10)
            results.append(services.schedules_due(now))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=fire) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sorted(len(r) for r in results) == [0, 1]
    assert ConformanceRun.objects.count() == 1
    assert ScheduleRun.objects.count() == 1


def test_occurrences_past_their_window_are_one_missed_row_that_notifies_and_start_nothing(
        world: World, hook):
    plan = world.plan()
    schedule = _schedule(world, plan)
    first = schedule.next_run_at
    # Beat was down two hours: the last occurrence (first + 2 h) is 4 min old, past its 3.
    now = first + timedelta(hours=2, minutes=4)
    made = services.schedules_due(now)
    assert [r.outcome for r in made] == ["missed"]
    missed = made[0]
    assert missed.occurrences == 25 and missed.due_at == first
    assert "25 occurrences" in missed.detail and "not run late" in missed.detail
    assert not ConformanceRun.objects.exists()
    schedule.refresh_from_db()
    assert schedule.next_run_at == first + timedelta(hours=2, minutes=5)
    delivery = Delivery.objects.get(webhook=hook)
    assert delivery.event == "schedule.missed"
    assert delivery.payload["data"]["occurrences"] == 25
    assert delivery.payload["data"]["plan"] == plan.name
    [event] = _timeline(plan)
    assert event.actor == "system:schedule" and "missed" in event.message
    # The next occurrence, on time, starts its job.
    assert [r.outcome for r in services.schedules_due(next_run(schedule))] == ["started"]
    assert ConformanceRun.objects.count() == 1


def test_a_late_beat_inside_the_window_runs_once_for_the_occurrences_it_covers(world: World):
    plan = world.plan()
    schedule = _schedule(world, plan, cron="* * * * *", window_minutes=10)
    now = next_run(schedule) + timedelta(minutes=3, seconds=30)
    [run] = services.schedules_due(now)
    assert run.outcome == "started" and run.occurrences == 4
    assert ConformanceRun.objects.count() == 1


def test_a_refused_start_is_failed_audited_and_notified(world: World, hook):
    """A re-benchmark of a pool that was never benchmarked: nothing to repeat, refused."""
    plan = world.plan()
    schedule = _schedule(world, plan, kind="benchmark", cron="0 10 * * *")
    [run] = services.schedules_due(next_run(schedule) + timedelta(seconds=5))
    assert run.outcome == "failed"
    assert "no benchmark run to repeat" in run.detail, run.detail
    assert not Run.objects.exists()
    delivery = Delivery.objects.get(webhook=hook)
    assert delivery.event == "schedule.failed"
    assert "no benchmark run to repeat" in delivery.payload["text"]
    assert any("failed" in e.message for e in _timeline(plan))


def test_a_rehearsal_scheduled_before_stage_4_waits_visibly_without_draining(world: World,
                                                                            hook):
    """A rehearsal drains live traffic, which the candidate carries only in stage 4: each
    occurrence before that is skipped with the reason, and nothing notifies or drains."""
    plan = world.plan()
    schedule = _schedule(world, plan, kind="rehearsal", cron="*/10 * * * *")
    [run] = services.schedules_due(next_run(schedule) + timedelta(seconds=5))
    assert run.outcome == "skipped"
    assert f"is in stage {plan.stage}" in run.detail and "stage 4" in run.detail, run.detail
    assert not Drain.objects.exists()
    assert not Delivery.objects.filter(webhook=hook).exists()
    assert any("skipped" in e.message for e in _timeline(plan))


def test_a_started_job_that_fails_is_followed_and_notifies(world: World, hook):
    plan = world.plan()
    schedule = _schedule(world, plan)
    [run] = services.schedules_due(next_run(schedule))
    ConformanceRun.objects.filter(pk=run.job_id).update(status="failed", error="probe fell over")
    assert services.schedule_runs_follow() == 1
    assert services.schedule_runs_follow() == 0  # once
    run.refresh_from_db()
    assert run.outcome == "failed" and "probe fell over" in run.detail
    assert Delivery.objects.get(webhook=hook).event == "schedule.failed"


def _benchmark_of(world: World, at) -> Run:
    system = Actor.for_system("test")
    trace = bench.trace_generate(actor=system, name="short-chat", n=50, seed=7,
                                 prompt_tokens={"kind": "uniform", "lo": 50, "hi": 150},
                                 completion_tokens={"kind": "uniform", "lo": 16, "hi": 32},
                                 arrival={"kind": "poisson", "rate": 50.0})
    run = bench.run_create(actor=system, trace=trace, pools=[world.candidate], model_id=MODEL,
                           mode="levels", levels=[1, 4], slo_ttft_p95_ms=800,
                           slo_tpot_p95_ms=60, slo_error_rate=0.01, warmup_s=1, window_s=3)
    Run.objects.filter(pk=run.pk).update(created_at=at, status="complete")
    return Run.objects.get(pk=run.pk)


def test_a_rebenchmark_on_the_same_day_as_the_last_is_skipped_in_the_schedules_time_zone(
        world: World, hook):
    plan = world.plan()
    # The last benchmark: 23:30 UTC on the 10th, which is the 11th in Tokyo.
    last = _benchmark_of(world, T0.replace(hour=23, minute=30))
    schedule = _schedule(world, plan, kind="benchmark", cron="0 10 * * *",
                         timezone="Asia/Tokyo", window_minutes=60)
    # 10:00 in Tokyo on the 11th = 01:00 UTC on the 11th: another day in UTC, not in Tokyo.
    due = schedule.next_run_at
    assert due == T0.replace(day=11, hour=1, minute=0)
    [skipped] = services.schedules_due(due + timedelta(minutes=1))
    assert skipped.outcome == "skipped"
    assert f"run {last.pk}" in skipped.detail and "same day" in skipped.detail
    assert Run.objects.count() == 1
    assert not Delivery.objects.exists()  # a skip is the rule working, not news
    # The next day's occurrence repeats the last run, by system:schedule.
    [started] = services.schedules_due(due + timedelta(days=1, minutes=1))
    assert started.outcome == "started" and started.job_kind == "bench.run"
    repeat = Run.objects.get(pk=started.job_id)
    assert repeat.created_by == "system:schedule"
    assert (repeat.trace_id, repeat.model_id, repeat.levels, repeat.window_s) == (
        last.trace_id, last.model_id, last.levels, last.window_s)
    assert [p.pk for p in repeat.pools.all()] == [world.candidate.pk]


def test_a_disabled_spell_is_not_reported_missed(world: World, hook):
    plan = world.plan()
    schedule = _schedule(world, plan)
    services.schedule_update(actor=world.actor(LEAD), schedule=schedule, enabled=False, now=T0)
    assert services.schedules_due(T0 + timedelta(days=2)) == []
    back = services.schedule_update(actor=world.actor(LEAD), schedule=schedule, enabled=True,
                                    now=T0 + timedelta(days=2))
    assert back.next_run_at == T0 + timedelta(days=2, minutes=5)
    assert not ScheduleRun.objects.exists() and not Delivery.objects.exists()


def test_a_tick_with_nothing_due_costs_one_query_and_follows_jobs_by_kind_not_by_run(
        world: World, django_assert_num_queries, django_assert_max_num_queries):
    plan = world.plan()
    schedule = _schedule(world, plan)
    quiet = next_run(schedule) - timedelta(seconds=1)
    with django_assert_num_queries(1):  # nothing due, no run open: the one query
        assert services.schedules_due(quiet) == []
    [run] = services.schedules_due(next_run(schedule))
    # Seven more runs whose jobs still run (copies of the started one's job).
    job = ConformanceRun.objects.get(pk=run.job_id)
    for _ in range(7):
        job.pk = None
        job.save()
        ScheduleRun.objects.create(schedule=schedule, due_at=run.due_at, outcome="started",
                                   job_kind=run.job_kind, job_id=job.pk)
    quiet = next_run(Schedule.objects.get(pk=schedule.pk)) - timedelta(seconds=1)
    # The query, the rehearsals left starting, the started runs, their jobs (one kind).
    with django_assert_max_num_queries(4):
        assert services.schedules_due(quiet) == []
    assert ScheduleRun.objects.filter(outcome="started").count() == 8
    # A tick with nothing due still follows a job that ended.
    ConformanceRun.objects.filter(pk=job.pk).update(status="failed", error="probe fell over")
    services.schedules_due(quiet)
    ended = ScheduleRun.objects.get(job_id=job.pk)
    assert ended.outcome == "failed" and "probe fell over" in ended.detail
    assert ScheduleRun.objects.filter(outcome="started").count() == 7
