"""A job's sample compared with the plan's primary, on real simulated pools: the job's answers
come from the candidate pool (a simulator), the sample is sent again to the primary (another
simulator pool), and each pair is compared with fleetctl/inference/compare.py.

Two pools of one profile answer a greedy request identically; the "flip" profile diverges on
every greedy answer, so each test knows what the comparison must find."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.utils import timezone

from fleetctl.batch import compare
from fleetctl.batch.models import BatchChunk, BatchComparison, BatchFile, BatchJob, BatchResult
from fleetctl.fleet.models import Pool
from migrations_plan.models import Plan
from tests.conftest import SYSTEM
from tests.core.hostile import recording_server
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

from .factory import make_job as factory_make_job
from .workerproc import WorkerProcess, worker_starter

pytestmark = pytest.mark.slow

SIM_POOLS = {"cand": "quick", "prim": "quick", "flip": "flip"}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    proc = sim_with_profiles(tmp_path_factory.mktemp("compare-sim"), TEST_PROFILES, SIM_POOLS)
    yield proc
    proc.stop()


@pytest.fixture
def plan(world: World, sim: SimProcess) -> Plan:  # noqa: F811 - the fixture
    Pool.objects.filter(pk=world.primary.pk).update(base_urls=[sim.url("prim")])
    Pool.objects.filter(pk=world.candidate.pk).update(base_urls=[sim.url("cand")])
    return world.plan()


def _body(i: int, temperature: float, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": 24, "temperature": temperature, **extra}


def make_job(pool: Pool, plan: Plan | None, *, n: int = 12, answered_by: str,
             chunk_size: int = 5, compare_sample: int = 5, temperature: float = 0,
             fail: frozenset[int] = frozenset(), **extra: Any) -> BatchJob:
    """A finished job of n requests whose answers came from `answered_by` (a URL), stored as
    the worker stores them; the indices in `fail` got a 500 instead. The file goes to the
    test's BATCH_FILES_DIR (conftest's batch_files_dir). Input file, chunks and
    results are rows and a file as the upload and the worker leave them (blank line included,
    to check that indices count requests, not lines). `extra`: more of each request body."""
    folder = Path(settings.BATCH_FILES_DIR)
    name = f"in-{BatchFile.objects.count()}.jsonl"
    lines = [json.dumps({"custom_id": f"req-{i}", "method": "POST",
                         "url": "/v1/chat/completions", "body": _body(i, temperature, **extra)}
                        ).encode() + b"\n" for i in range(n)]
    data = b"\n".join(lines[:3]) + b"".join(lines[3:])  # blank lines between the first three
    (folder / name).write_bytes(data)
    batch_file = BatchFile.objects.create(name=name, sha256="0" * 64, path=name,
                                          size_bytes=len(data), requests=n, uploaded_by="t")
    job = BatchJob.objects.create(
        input_file=batch_file, pool=pool, plan=plan, total=n, created_by="t",
        state=BatchJob.State.COMPLETED, compare_sample=compare_sample,
        expires_at=timezone.now() + timedelta(hours=1), finished_at=timezone.now())
    offsets = _offsets(data)
    for number, first in enumerate(range(0, n, chunk_size)):
        last = min(n, first + chunk_size) - 1
        BatchChunk.objects.create(
            job=job, number=number, first_index=first, last_index=last, first_line=first + 1,
            byte_start=offsets[first][0], byte_end=offsets[last][1],
            state=BatchChunk.State.DONE, dispatched_through=last)
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            if i in fail:
                status, text = 500, json.dumps({"error": {"message": "boom"}})
            else:
                reply = client.post(f"{answered_by}/v1/chat/completions",
                                    json=_body(i, temperature, **extra))
                status, text = reply.status_code, reply.text
            BatchResult.objects.create(job=job, index=i, custom_id=f"req-{i}",
                                       status_code=status, body=text, worker="w")
    return job


def _offsets(data: bytes) -> list[tuple[int, int]]:
    """(start, end) bytes of each non-blank line."""
    out, pos = [], 0
    for line in data.splitlines(keepends=True):
        if line.strip():
            out.append((pos, pos + len(line)))
        pos += len(line)
    return out


def test_same_profile_is_identical_and_a_rerun_changes_nothing(plan: Plan, sim: SimProcess,
                                                               ) -> None:
    job = make_job(plan.candidate_pool, plan, answered_by=sim.url("cand"), compare_sample=5)

    assert compare.job_compare(job.pk) == 5
    rows = list(BatchComparison.objects.filter(job=job))
    assert [r.index for r in rows] == compare.sample_indices(job)
    assert all(r.identical is True and r.similarity == 1.0 and r.primary_status == 200
               for r in rows)
    assert all(r.primary_pool_id == plan.primary_pool_id for r in rows)
    assert [r.custom_id for r in rows] == [f"req-{r.index}" for r in rows]

    summary = compare.comparison_summary(job)
    assert (summary.n, summary.compared, summary.identical_count) == (5, 5, 5)
    assert summary.identical is not None and summary.identical.estimate == 1.0
    assert summary.identical.lower < 1.0  # five of five is not a certainty
    assert summary.mean_similarity == 1.0 and summary.diverged == 0
    assert summary.why_not == "" and summary.pending == ""

    at = {r.index: r.at for r in rows}
    assert compare.job_compare(job.pk) == 0
    assert {r.index: r.at for r in BatchComparison.objects.filter(job=job)} == at


def test_a_stored_request_whose_schemas_point_outside_is_compared_without_them_fetching_nothing(
        plan: Plan, sim: SimProcess) -> None:
    # A file stored before uploads checked schemas: the comparison builds no validator that
    # reaches out, and compares the answers as JSON.
    with recording_server() as server:
        ref = {"$ref": f"{server.url}/answer.json"}
        job = make_job(plan.candidate_pool, plan, answered_by=sim.url("cand"), compare_sample=4,
                       response_format={"type": "json_schema", "json_schema": {
                           "name": "answer", "schema": {"type": "object", "properties": {
                               "a": ref}}}},
                       tools=[{"type": "function", "function": {
                           "name": "lookup", "parameters": {"$ref": "file:///etc/hostname"}}}])

        assert compare.job_compare(job.pk) == 4
        rows = list(BatchComparison.objects.filter(job=job))
        assert len(rows) == 4 and all(r.primary_status == 200 for r in rows)
        assert all(r.outcome["json_checked"] for r in rows)
        assert server.hits == []


def test_divergent_candidate_is_found(plan: Plan, sim: SimProcess) -> None:
    job = make_job(plan.candidate_pool, plan, answered_by=sim.url("flip"), compare_sample=6)

    assert compare.job_compare(job.pk) == 6
    summary = compare.comparison_summary(job)
    assert summary.compared == 6
    assert summary.identical_count < 6 and summary.diverged > 0
    assert summary.mean_similarity is not None and summary.mean_similarity < 1.0
    first = summary.rows[0]  # the most divergent first
    assert first.diverged and first.identical is False and first.first_divergence is not None


def test_sample_is_deterministic_among_successes_and_bounded(plan: Plan, sim: SimProcess
                                                             ) -> None:
    job = make_job(plan.candidate_pool, plan, n=14, answered_by=sim.url("cand"),
                   compare_sample=8, fail=frozenset(range(6)))
    sample = compare.sample_indices(job)
    assert sample == compare.sample_indices(job)
    assert sample == list(range(6, 14))  # the only 8 successes
    assert set(compare.sample_indices(job, 3)) <= set(sample)

    BatchJob.objects.filter(pk=job.pk).update(compare_sample=3)
    assert compare.job_compare(job.pk) == 3
    assert sorted(BatchComparison.objects.filter(job=job).values_list("index", flat=True)) \
        == compare.sample_indices(job, 3)


def test_nothing_to_compare_says_why(plan: Plan, sim: SimProcess) -> None:
    alone = make_job(plan.candidate_pool, None, n=3, answered_by=sim.url("cand"))
    on_primary = make_job(plan.primary_pool, plan, n=3, answered_by=sim.url("prim"))
    none = make_job(plan.candidate_pool, plan, n=3, answered_by=sim.url("cand"),
                    compare_sample=0)
    failed = make_job(plan.candidate_pool, plan, n=3, answered_by=sim.url("cand"),
                      fail=frozenset({0, 1, 2}))

    for job in (alone, on_primary, none, failed):
        assert compare.job_compare(job.pk) == 0
        assert not BatchComparison.objects.filter(job=job).exists()
    assert "no plan" in compare.comparison_summary(alone).why_not
    assert "primary of plan" in compare.comparison_summary(on_primary).why_not
    assert "sample of 0" in compare.comparison_summary(none).why_not
    summary = compare.comparison_summary(failed)
    assert summary.why_not == "" and "No request of the job succeeded" in summary.pending
    assert summary.identical is None and summary.n == 0


def test_primary_down_is_recorded_then_redone_on_rerun(plan: Plan, sim: SimProcess) -> None:
    job = make_job(plan.candidate_pool, plan, n=6, answered_by=sim.url("cand"),
                   compare_sample=3)
    Pool.objects.filter(pk=plan.primary_pool_id).update(base_urls=["http://127.0.0.1:9"])

    assert compare.job_compare(job.pk) == 3
    summary = compare.comparison_summary(job)
    assert summary.primary_errors == 3 and summary.compared == 0 and summary.identical is None
    assert all(r.primary_status == 0 and r.note.startswith("the primary failed: unreachable")
               for r in summary.rows)

    Pool.objects.filter(pk=plan.primary_pool_id).update(base_urls=[sim.url("prim")])
    assert compare.job_compare(job.pk) == 3
    summary = compare.comparison_summary(job)
    assert (summary.n, summary.primary_errors, summary.identical_count) == (3, 0, 3)


def test_sampled_requests_compare_only_the_distribution(plan: Plan, sim: SimProcess) -> None:
    job = make_job(plan.candidate_pool, plan, n=4, answered_by=sim.url("cand"),
                   compare_sample=2, temperature=0.7)

    assert compare.job_compare(job.pk) == 2
    summary = compare.comparison_summary(job)
    assert summary.n == 2 and summary.compared == 0 and summary.identical is None
    assert all(r.identical is None and r.similarity is None and "not greedy" in r.note
               for r in summary.rows)
    assert summary.as_dict()["rows"][0]["primary_status"] == 200


@pytest.fixture
def workers(tmp_path: Path, transactional_db: None) -> Iterator[Callable[..., WorkerProcess]]:
    with worker_starter(tmp_path) as start:
        yield start


def test_a_job_run_by_a_worker_is_compared_with_its_plans_primary(
        sim_pool: Pool, sim_primary_pool: Pool, tmp_path: Path, make_user: Callable[..., Any],
        workers: Callable[..., WorkerProcess]) -> None:
    """End to end: a job on a stage-3 plan's candidate, created through the services (which
    link the plan), run by a real worker process, then compared: the two simulated pools have
    one profile, so every greedy answer is identical."""
    user = make_user("lead-h6", "platform-lead")
    plan = Plan.objects.create(
        name="batch-compare", candidate_pool=sim_pool, primary_pool=sim_primary_pool,
        slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01, owner=user,
        created_by=user, state=Plan.State.STAGE_3, stage=3)
    job = factory_make_job(SYSTEM, sim_pool, n=30, tmp_path=tmp_path, chunk_size=10,
                           concurrency=4, compare_sample=6)
    assert job.plan_id == plan.pk
    worker = workers("cmp")
    wait_until(lambda: BatchJob.objects.get(pk=job.pk).state == "completed", timeout_s=30,
               what=worker.log())

    assert compare.job_compare(job.pk) in (0, 6)  # 0: a Celery worker already ran it
    summary = compare.comparison_summary(BatchJob.objects.get(pk=job.pk))
    assert (summary.n, summary.compared, summary.identical_count) == (6, 6, 6)
    assert summary.primary_pool == sim_primary_pool.name and summary.why_not == ""
    assert set(BatchComparison.objects.filter(job=job).values_list("primary_pool", flat=True)) \
        == {sim_primary_pool.pk}
