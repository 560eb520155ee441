"""Fixtures for the batch pages: the plans' small world (a primary and a candidate serving
MODEL, a viewer `vic`, an on-call `olga`, platform leads), jobs made through the services
from real uploaded files, and their progress written as the checkpoint store writes it
(a result row and its chunk's counters in one transaction), so the pages read real rows
without a worker."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.test import Client
from django.utils import timezone

from fleetctl.batch.models import BatchChunk, BatchJob, BatchResult
from tests.batch.factory import make_job
from tests.migrations_plan.conftest import World, world

__all__ = ["World", "world"]


@pytest.fixture
def login_as() -> Callable[[User], Client]:
    def client_for(user: User) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return client_for


@pytest.fixture
def viewer(world: World, login_as: Callable[[User], Client]) -> Client:
    return login_as(world.viewer)


@pytest.fixture
def oncall(world: World, login_as: Callable[[User], Client]) -> Client:
    return login_as(world.oncall)


@pytest.fixture
def job(world: World, tmp_path: Path) -> BatchJob:
    """A 12-request job on the plan world's primary (no plan open yet), chunks of 5."""
    return make_job(world.actor("oncall"), world.primary, n=12, tmp_path=tmp_path,
                    chunk_size=5)


def write_results(job: BatchJob, indices: range | list[int], *, status: int = 200,
                  worker: str = "w1", seconds_apart: float = 1.0,
                  start_offset_s: float = 0.0) -> None:
    """Results for `indices` as the checkpoint store writes them: each with its chunk's
    counters in one transaction; the job running since its first result."""
    started = job.started_at or timezone.now() - timedelta(seconds=60)
    if job.started_at is None:
        BatchJob.objects.filter(pk=job.pk).update(state="running", started_at=started)
        job.refresh_from_db()
    for n, index in enumerate(indices):
        chunk = BatchChunk.objects.get(job=job, first_index__lte=index, last_index__gte=index)
        ok = 200 <= status < 300
        body = ('{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": '
                '{"role": "assistant", "content": "answer"}, "finish_reason": "stop"}], '
                '"usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}'
                if ok else '{"error": {"message": "overloaded"}}')
        with transaction.atomic():
            BatchResult.objects.create(
                job=job, index=index, custom_id=f"req-{index}", status_code=status, body=body,
                error_code="" if ok else "retries_exhausted",
                error_message="" if ok else "overloaded", prompt_tokens=7,
                output_tokens=5 if ok else 0, worker=worker,
                finished_at=started + timedelta(seconds=start_offset_s + n * seconds_apart))
            BatchChunk.objects.filter(pk=chunk.pk).update(
                succeeded=F("succeeded") + int(ok), failed=F("failed") + int(not ok),
                prompt_tokens=F("prompt_tokens") + 7, output_tokens=F("output_tokens") + 5 * ok)


def finish(job: BatchJob, state: str = "completed", **fields: Any) -> BatchJob:
    BatchChunk.objects.filter(job=job).update(state="done")
    BatchJob.objects.filter(pk=job.pk).update(state=state, finished_at=timezone.now(), **fields)
    job.refresh_from_db()
    return job
