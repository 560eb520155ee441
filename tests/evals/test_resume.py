"""A worker killed in the middle of an eval run, and the run resumed by another: every (item,
pool) row scored exactly once, none lost, the rows that were in flight when the worker died
each with an "interrupted" attempt, and the run counting one resumption.

All real: a Celery worker process of its own on the evals queue (the victim), killed with
SIGKILL while it runs `evals.run` against simulated pools; then `runs_reap` (what beat runs
every 30 s) queues the run again and a second worker process (the rescuer) takes it over. The
session's worker also consumes the evals queue, so for this test it is told to stop consuming
it (Celery's cancel_consumer) and to start again afterwards; the run is driven only by the
two processes started here.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.celery import app
from fleetctl.evals import services
from fleetctl.evals.models import EvalResult, EvalRun
from fleetctl.fleet.models import Region
from fleetctl.fleet.services import pool_create, pool_model_create
from tests.conftest import SYSTEM, _worker_env
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.celery_worker import start_celery_worker
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

MODEL = "llama-3.1-8b-instruct"
STALE_S = 3  # EVAL_HEARTBEAT_STALE_S for the reaper and the rescuer


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    # Slow enough that a run of 600 rows at concurrency 8 takes some 20 s (each answer
    # ~0.3 s), so there is a moment with rows scored, rows in flight and rows pending to kill
    # it in.
    sim = sim_with_profiles(tmp_path_factory.mktemp("evals-resume"), TEST_PROFILES,
                            {"a": "slow-15ms:task_accuracy=0.9",
                             "b": "slow-15ms:task_accuracy=0.9"})
    yield sim
    sim.stop()


def session_worker() -> str:
    active = app.control.inspect(timeout=5).active_queues() or {}
    [name] = [name for name in active if name.startswith("test-")]
    return name


@pytest.fixture
def evals_queue_to_ourselves(celery_worker: Any) -> Iterator[None]:
    """The session's worker stops consuming `evals` for the test (and starts again after)."""
    name = session_worker()
    app.control.cancel_consumer("evals", destination=[name], reply=True, timeout=5)

    def consumes_evals() -> bool:
        queues = (app.control.inspect(destination=[name], timeout=5).active_queues() or {})
        return any(q["name"] == "evals" for q in queues.get(name, []))

    assert not consumes_evals()
    try:
        yield
    finally:
        app.control.add_consumer("evals", destination=[name], reply=True, timeout=5)
        assert consumes_evals()


class Worker:
    """`celery -A fleetctl worker -Q evals` as a process of its own, on the test database."""

    def __init__(self, node: str, log: Path, **env: str) -> None:
        """Returns once the worker answers a ping."""
        with connection.cursor():
            database = connection.settings_dict["NAME"]
        self.node = f"{node}-{os.getpid()}@%h"
        self.log = log
        self.proc = start_celery_worker({**_worker_env(database), **env}, log, node=self.node,
                                        queues=["evals"], concurrency=2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def test_a_worker_killed_mid_run_is_resumed_by_another_and_no_row_is_scored_twice(
        evals_queue_to_ourselves, sims, workers, region: Region, make_user, settings,
        tmp_path):
    settings.EVAL_HEARTBEAT_STALE_S = STALE_S  # for runs_reap, called here
    pools = []
    for name in ("a", "b"):
        pool = pool_create(actor=SYSTEM, name=f"sim-{name}", runtime="cuda",
                           accelerator="H200", region=region, base_urls=[sims.url(name)],
                           max_context_tokens=32768, node_hourly_rate="30")
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pools.append(pool)
    [suite] = services.suite_install_bundled(actor=SYSTEM, names=["fleetctl-arithmetic"])

    victim = Worker("evals-victim", tmp_path / "victim.log")
    workers.append(victim)
    lead = Actor(user=make_user("lead", "platform-lead"))
    run = services.run_create(actor=lead, suite=suite, candidate=pools[0], primary=pools[1],
                              model_id=MODEL, concurrency=8)
    assert run.total == 600

    def mid_run() -> bool:
        current = EvalRun.objects.get(pk=run.pk)
        claimed = EvalResult.objects.filter(run=run, status="claimed").count()
        return current.status == "running" and current.done >= 100 and claimed > 0

    wait_until(mid_run, timeout_s=120, every_s=0.05, what="the run to be under way")
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(timeout=15)
    assert victim.proc.returncode == -signal.SIGKILL

    at_kill = EvalRun.objects.get(pk=run.pk)
    in_flight = set(EvalResult.objects.filter(run=run, status="claimed")
                    .values_list("pk", flat=True))
    scored_before = dict(EvalResult.objects.filter(run=run, status="done")
                         .values_list("pk", "scored_at"))
    assert in_flight and 0 < len(scored_before) < run.total
    assert at_kill.status == "running" and at_kill.resumed == 0

    # Nobody drives the run now: once its heartbeat is stale, the reaper queues it again.
    beat_at = at_kill.heartbeat_at
    assert beat_at is not None
    wait_until(lambda: (timezone.now() - beat_at).total_seconds() > STALE_S + 0.5,
               timeout_s=STALE_S + 5, what="the heartbeat to go stale")
    assert EvalRun.objects.get(pk=run.pk).heartbeat_at == at_kill.heartbeat_at  # nobody beat
    rescuer = Worker("evals-rescuer", tmp_path / "rescuer.log",
                     EVAL_HEARTBEAT_STALE_S=str(STALE_S))
    workers.append(rescuer)
    assert services.runs_reap() == 1
    wait_until(lambda: EvalRun.objects.get(pk=run.pk).status == "complete", timeout_s=180,
               every_s=0.2, what=f"the rescuer to finish the run ({tmp_path}/rescuer.log)")

    run = EvalRun.objects.get(pk=run.pk)
    assert run.resumed == 1
    assert run.worker != at_kill.worker
    rows = list(EvalResult.objects.filter(run=run))
    # None lost: one row per (item, pool), every one scored, and counted once.
    assert len(rows) == run.total == run.done == 600
    assert {(r.item_id, r.run_pool_id) for r in rows} == {
        (item, rp) for item in suite.items.values_list("pk", flat=True)
        for rp in run.run_pools.values_list("pk", flat=True)}
    assert all(r.status == "done" and r.score is not None and r.scored_at for r in rows)
    # Scored exactly once: one answered attempt per row, and a row scored before the kill
    # kept its score time (the rescuer did not send it again).
    for r in rows:
        answered = [a for a in r.attempts if not a.get("error")]
        assert len(answered) == 1, (r.pk, r.attempts)
        if r.pk in scored_before:
            assert r.scored_at == scored_before[r.pk]
            assert not any("interrupted" in a.get("error", "") for a in r.attempts)
    # The rows in flight when the worker died say so, and were then answered once.
    for r in rows:
        if r.pk in in_flight:
            assert any("interrupted" in a.get("error", "") for a in r.attempts), r.attempts
    pending_then = {r.pk for r in rows} - in_flight - set(scored_before)
    assert all(not any("interrupted" in a.get("error", "") for a in r.attempts)
               for r in rows if r.pk in pending_then)
    assert run.verdict in {"pass", "warn", "fail", "insufficient"}
