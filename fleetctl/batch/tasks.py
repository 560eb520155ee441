"""Batch tasks (fleetctl/celery.py routes them): `batch.tick` on `watch`, beat every
BATCH_TICK_INTERVAL_S — expire jobs past their window, judge the drills of ended jobs that
have no verdict yet, drive the soaks' schedules; `batch.compare` on `evals` — a job's output
sample against the plan's primary. Neither raises out: a failing part is logged and the
others still run; the next beat tries again."""

from __future__ import annotations

import logging

from fleetctl.batch import services
from fleetctl.batch.models import BatchJob
from fleetctl.celery import app

log = logging.getLogger("fleetctl.batch")

# Ended states a drill is judged in (completed jobs are judged by the store when they
# finish; the tick catches any that were missed, and the expired/cancelled ones).
DRILL_ENDED = (BatchJob.State.COMPLETED, BatchJob.State.EXPIRED, BatchJob.State.CANCELLED,
               BatchJob.State.FAILED)


def drills_judge() -> int:
    """drill.drill_record for every ended drill job without a verdict."""
    try:
        from fleetctl.batch.drill import drill_record
    except ImportError:  # pragma: no cover - until the drill lands
        return 0
    judged = 0
    pending = BatchJob.objects.filter(state__in=DRILL_ENDED, drill_verdict="").exclude(
        drill="").order_by("pk")
    for job in pending:
        try:
            drill_record(job)
            judged += 1
        except Exception:
            log.exception("drill verdict of batch job %s failed", job.pk)
    return judged


def soaks_run() -> None:
    try:
        from fleetctl.batch.soak import soaks_tick
    except ImportError:  # pragma: no cover - until soaks land
        return
    soaks_tick()


@app.task(name="batch.tick", ignore_result=True)
def tick() -> dict[str, int]:
    """Beat, every BATCH_TICK_INTERVAL_S."""
    done = {"expired": 0, "drills": 0}
    try:
        done["expired"] = services.jobs_expire()
    except Exception:
        log.exception("batch.tick: expiring jobs failed")
    try:
        done["drills"] = drills_judge()
    except Exception:
        log.exception("batch.tick: drill verdicts failed")
    try:
        soaks_run()
    except Exception:
        log.exception("batch.tick: the soak schedules failed")
    return done


@app.task(name="batch.compare", ignore_result=True)
def compare(job_id: int) -> int:
    """Send the job's sample to the plan's primary and store the comparisons."""
    try:
        from fleetctl.batch.compare import job_compare

        return job_compare(job_id)
    except Exception:
        log.exception("batch.compare(%s) failed", job_id)
        return 0
