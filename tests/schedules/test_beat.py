"""End to end with real parts: a real `celery beat` (the project's beat schedule, its
`schedules.due` entry every second here) and the session's real worker fire a schedule that
is due; the conformance probe it starts runs against a real simulator, as
`system:schedule`, and the schedule's run follows the job to its end."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection
from django.utils import timezone

from fleetctl.audit.models import AuditEvent
from fleetctl.conformance.models import ConformanceRun
from fleetctl.schedules import services
from fleetctl.schedules.models import Schedule, ScheduleRun
from tests.conformance.conftest import conformance_sim  # noqa: F401 - the fixture
from tests.conformance.test_runs import point
from tests.conftest import ROOT, _worker_env
from tests.schedules.conftest import World
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_real_beat_and_worker_fire_a_due_schedule(celery_worker, world: World,
                                                  conformance_sim, tmp_path):  # noqa: F811
    point(world.candidate, conformance_sim, "good")
    point(world.primary, conformance_sim, "twin")
    plan = world.plan()
    schedule = services.schedule_create(actor=world.actor("oncall"), kind="conformance",
                                        plan=plan, cron="0 0 1 1 *", window_minutes=5)
    # Due now (its cron's next occurrence is next year: no other occurrence meanwhile).
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=timezone.now())
    env = _worker_env(connection.settings_dict["NAME"]) | {"SCHEDULES_TICK_S": "1"}
    log = (tmp_path / "beat.log").open("wb")
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "fleetctl", "beat", "-l", "INFO",
         "-s", str(tmp_path / "beat-schedule")],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        fired = wait_until(lambda: ScheduleRun.objects.filter(schedule=schedule).first(),
                           timeout_s=90, what="beat and the worker to fire the schedule")
        assert fired.outcome in ("started", "complete"), fired.detail
        run = ConformanceRun.objects.get(pk=fired.job_id)
        assert run.created_by == "system:schedule" and run.plan_id == plan.pk
        assert AuditEvent.objects.filter(object_type="migrations_plan.plan", object_id=plan.pk,
                                         action="schedule.run",
                                         actor="system:schedule").exists()
        done = wait_until(
            lambda: ScheduleRun.objects.filter(pk=fired.pk, outcome="complete").first(),
            timeout_s=120, what="the schedule's run to follow its probe to the end")
        assert "verdict pass" in done.detail, done.detail
        # One occurrence, one run: later ticks of beat started nothing more for it.
        assert ConformanceRun.objects.filter(plan=plan).count() == 1
    finally:
        beat.terminate()
        beat.wait(timeout=10)
        log.close()
