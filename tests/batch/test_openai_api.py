"""The OpenAI Batch API (/openai/v1/), driven by the official `openai` client against the live
test server: a chat batch and an embeddings batch run by a real batch worker process on the
simulator, polled with batches.retrieve and downloaded with files.content; list pagination;
cancel; and every refusal raised by the client as the exception OpenAI's status maps to,
with nothing stored."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from django.core.exceptions import ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.batch.models import BatchFile, BatchJob, BatchJobEvent
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from fleetctl.traffic.models import Route
from fleetctl.traffic.services.writes import route_create
from migrations_plan.services.plans import plan_create
from tests.conftest import SYSTEM

from .factory import MODEL, request_line
from .workerproc import WorkerProcess, worker_starter

pytestmark = pytest.mark.slow
TERMINAL = ("completed", "failed", "expired", "cancelled")


def _jsonl(n: int, url: str = "/v1/chat/completions", **kw: Any) -> bytes:
    return b"".join(json.dumps(request_line(i, url=url, **kw)).encode() + b"\n"
                    for i in range(n))


@pytest.fixture
def token(make_user: Callable[..., Any]) -> Callable[..., str]:
    def make(*scopes: str) -> str:
        user = make_user(f"oa-{'-'.join(scopes) or 'none'}-{time.monotonic_ns()}", "on-call")
        return token_create_personal(actor=Actor(user=user), name="openai",
                                     scopes=list(scopes)).secret
    return make


@pytest.fixture
def client_as(live_server: Any, token: Callable[..., str]) -> Callable[..., openai.OpenAI]:
    def make(*scopes: str, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{live_server.url}/openai/v1",
                             api_key=key or token(*scopes), max_retries=0, timeout=30)
    return make


@pytest.fixture
def client(client_as: Callable[..., openai.OpenAI]) -> openai.OpenAI:
    return client_as("read", "jobs")


@pytest.fixture
def batch_route(transactional_db: None, sim_pool: Pool) -> Route:
    return route_create(actor=SYSTEM, name="llama-batch", model_id=MODEL, primary_pool=sim_pool,
                        latency_class="batch", reason="the batch API's route")


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    with worker_starter(tmp_path) as start:
        yield start("oa-1")


def _wait_done(client: openai.OpenAI, batch_id: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in TERMINAL:
            return batch
        assert time.monotonic() < deadline, f"{batch_id} still {batch.status}: {batch}"
        time.sleep(0.2)


def _upload(client: openai.OpenAI, content: bytes, name: str = "in.jsonl") -> Any:
    return client.files.create(file=(name, content, "application/jsonl"), purpose="batch")


# --- end to end -----------------------------------------------------------------------------

def test_a_chat_batch_runs_through_the_route_and_its_output_downloads(
        client: openai.OpenAI, batch_route: Route, sim_pool: Pool, worker: WorkerProcess):
    uploaded = _upload(client, _jsonl(12), "nightly.jsonl")
    assert (uploaded.object, uploaded.purpose, uploaded.filename) == ("file", "batch",
                                                                      "nightly.jsonl")
    assert client.files.retrieve(uploaded.id).bytes == len(_jsonl(12))
    assert client.files.content(uploaded.id).content == _jsonl(12)

    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                    completion_window="24h", metadata={"team": "search"})
    assert created.status == "in_progress" and created.request_counts is not None
    assert created.metadata == {"team": "search"}
    done = _wait_done(client, created.id)

    assert done.status == "completed", worker.log()
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (12, 12, 0)
    assert done.error_file_id is None and done.output_file_id
    assert done.completed_at and done.completed_at >= done.created_at
    lines = [json.loads(line) for line in
             client.files.content(done.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(12)]
    assert all(line["response"]["status_code"] == 200 and line["error"] is None
               and line["response"]["body"]["choices"][0]["message"]["content"]
               for line in lines)
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    job = BatchJob.objects.get(pk=int(created.id.removeprefix("batch_")))
    assert (job.route_id, job.pool_id, job.endpoint) == (batch_route.pk, sim_pool.pk,
                                                         "/v1/chat/completions")
    assert "through route llama-batch" in job.events.get(kind="created").message


def test_an_embeddings_batch_runs_on_the_simulator(client: openai.OpenAI, batch_route: Route,
                                                   worker: WorkerProcess):
    uploaded = _upload(client, _jsonl(6, url="/v1/embeddings"), "backfill.jsonl")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                    completion_window="24h")
    done = _wait_done(client, created.id)

    assert done.status == "completed", worker.log()
    lines = [json.loads(line) for line in
             client.files.content(done.output_file_id or "").text.splitlines()]
    assert len(lines) == 6
    bodies = [line["response"]["body"] for line in lines]
    assert all(len(b["data"][0]["embedding"]) == 8 and b["usage"]["prompt_tokens"] > 0
               for b in bodies)
    job = BatchJob.objects.get(pk=int(created.id.removeprefix("batch_")))
    assert job.results.filter(prompt_tokens__gt=0).count() == 6


# --- list, cancel ----------------------------------------------------------------------------

def test_batches_and_files_page_with_after_and_limit(client: openai.OpenAI,
                                                     batch_route: Route):
    ids = []
    for _ in range(3):
        uploaded = _upload(client, _jsonl(2))
        ids.append(client.batches.create(input_file_id=uploaded.id,
                                         endpoint="/v1/chat/completions",
                                         completion_window="24h").id)
    newest_first = ids[::-1]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == newest_first[:2] and first.has_more
    second = client.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in second.data] == newest_first[2:] and not second.has_more
    assert [b.id for b in client.batches.list(limit=1)] == newest_first  # auto-paging
    files = client.files.list(limit=2)
    assert len(files.data) == 2 and files.has_more
    assert len(list(client.files.list(limit=2))) == 3
    with pytest.raises(openai.BadRequestError, match="limit"):
        client.batches.list(limit=1000)


def test_cancel_ends_an_active_batch_and_refuses_a_finished_one(client: openai.OpenAI,
                                                                batch_route: Route):
    uploaded = _upload(client, _jsonl(3))
    created = client.batches.create(input_file_id=uploaded.id,
                                    endpoint="/v1/chat/completions", completion_window="24h")
    cancelled = client.batches.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at
    assert client.batches.retrieve(created.id).status == "cancelled"
    event = BatchJobEvent.objects.get(job_id=int(created.id.removeprefix("batch_")),
                                      kind="cancelled")
    assert event.manual and "OpenAI Batch API" in event.message
    with pytest.raises(openai.ConflictError, match="it is cancelled"):
        client.batches.cancel(created.id)


def test_files_delete_refuses_a_file_an_unfinished_batch_reads_then_deletes_it(
        client: openai.OpenAI, client_as: Callable[..., openai.OpenAI], batch_route: Route,
        batch_files_dir: Path):
    """client.files.delete: 409 in OpenAI's shape naming the batch while it is not finished;
    once it is, the file goes (its bytes too) and every path answers 404 for it, while the
    finished batch keeps its record."""
    from fleetctl.audit.models import AuditEvent

    uploaded = _upload(client, _jsonl(3), "to-delete.jsonl")
    created = client.batches.create(input_file_id=uploaded.id,
                                    endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.ConflictError, match=f"still used by {created.id} "
                                                   r"\(queued\)") as busy:
        client.files.delete(uploaded.id)
    assert busy.value.status_code == 409 and busy.value.code == "conflict"
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    with pytest.raises(openai.PermissionDeniedError):
        client_as("read").files.delete(uploaded.id)
    client.batches.cancel(created.id)
    stored = batch_files_dir / BatchFile.objects.get(pk=int(uploaded.id[5:])).path
    assert stored.is_file()

    deleted = client.files.delete(uploaded.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (uploaded.id, "file", True)
    assert not stored.exists()
    for gone in (lambda: client.files.retrieve(uploaded.id),
                 lambda: client.files.content(uploaded.id),
                 lambda: client.files.delete(uploaded.id),
                 lambda: client.batches.create(input_file_id=uploaded.id,
                                               endpoint="/v1/chat/completions",
                                               completion_window="24h")):
        with pytest.raises(openai.NotFoundError, match="No such File"):
            gone()
    assert uploaded.id not in [f.id for f in client.files.list()]
    assert client.batches.retrieve(created.id).input_file_id == uploaded.id
    event = AuditEvent.objects.get(action="batch.file_delete", outcome="ok")
    assert event.before["name"] == "to-delete.jsonl"
    with pytest.raises(openai.NotFoundError, match="No such File") as unknown:
        client.files.delete("file-999999")
    assert unknown.value.body["param"] == "file_id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="only input files"):
        client.files.delete(f"file-{created.id}-output")
    assert BatchJob.objects.count() == 1


# --- refusals ---------------------------------------------------------------------------------

def test_every_refusal_is_the_clients_exception_and_stores_nothing(
        client: openai.OpenAI, client_as: Callable[..., openai.OpenAI], batch_route: Route,
        sim_pool: Pool, make_pool: Callable[..., Pool], make_user: Callable[..., Any],
        batch_files_dir: Path):
    with pytest.raises(openai.AuthenticationError):
        client_as(key="not-a-token").batches.list()
    with pytest.raises(openai.PermissionDeniedError):
        _upload(client_as("read"), _jsonl(1))
    with pytest.raises(openai.NotFoundError, match="No batch found"):
        client.batches.retrieve("batch_999999")
    with pytest.raises(openai.NotFoundError, match="No such File"):
        client.files.retrieve("file-999999")
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-batch_999999-output")
    with pytest.raises(openai.BadRequestError, match="purpose") as wrong:
        client.files.create(file=("in.jsonl", _jsonl(1)), purpose="fine-tune")
    assert wrong.value.param == "purpose"
    with pytest.raises(openai.BadRequestError, match="line 2: is not valid JSON") as bad:
        _upload(client, _jsonl(1) + b"{oops\n")
    assert bad.value.code == "invalid_file"
    assert not BatchFile.objects.exists() and list(batch_files_dir.iterdir()) == []

    chat = _upload(client, _jsonl(2))
    refusals = [
        ({"endpoint": "/v1/moderations"}, "endpoint", "not supported"),
        ({"completion_window": "1h"}, "completion_window", "not supported"),
        ({"endpoint": "/v1/embeddings"}, "input_file_id", "line 1: url"),
        ({"metadata": {"route": "nope"}}, "metadata", "No route named 'nope'"),
        ({"input_file_id": "file-999999"}, "input_file_id", "No such File"),
    ]
    for change, param, message in refusals:
        args = {"input_file_id": chat.id, "endpoint": "/v1/chat/completions",
                "completion_window": "24h", **change}
        expected = openai.NotFoundError if "No such" in message else openai.BadRequestError
        with pytest.raises(expected, match=message) as refused:
            client.batches.create(**args)
        assert refused.value.param == param, (change, refused.value.body)

    # A route that is not batch-class; a pool the stage rules keep from batch work.
    route_create(actor=SYSTEM, name="llama-chat", model_id=MODEL, primary_pool=sim_pool,
                 latency_class="interactive", reason="interactive")
    with pytest.raises(openai.BadRequestError, match="batches run only on batch-class"):
        client.batches.create(input_file_id=chat.id, endpoint="/v1/chat/completions",
                              completion_window="24h", metadata={"route": "llama-chat"})
    candidate = make_pool(name="cand-sim", base_urls=sim_pool.base_urls)
    pool_model_create(actor=SYSTEM, pool=candidate, model_id=MODEL, max_context_tokens=4096)
    lead = Actor(user=make_user("lead", "platform-lead"))
    plan_create(actor=lead, name="cand-plan", candidate_pool=candidate, primary_pool=sim_pool,
                routes=[batch_route], slo_ttft_p95_ms=500, slo_tpot_p95_ms=50,
                slo_error_rate=0.01)
    with pytest.raises(openai.BadRequestError, match=r"at stage 1 .*need stage 3"):
        client.batches.create(input_file_id=chat.id, endpoint="/v1/chat/completions",
                              completion_window="24h", metadata={"pool": "cand-sim"})
    assert not BatchJob.objects.exists()


def test_a_file_over_the_size_limit_is_refused_and_nothing_is_stored(
        client: openai.OpenAI, settings: Any, batch_files_dir: Path, transactional_db: None):
    settings.BATCH_MAX_UPLOAD_BYTES = 2000
    just_over = _jsonl(30)  # read, then refused by its size
    far_over = _jsonl(2000)  # refused from the request's Content-Length, before it is read
    assert 2000 < len(just_over) < 2000 + 64 * 1024 < len(far_over)
    for content in (just_over, far_over):
        with pytest.raises(openai.BadRequestError, match="may be at most") as refused:
            _upload(client, content)
        assert refused.value.code == "file_too_large"
    assert not BatchFile.objects.exists() and list(batch_files_dir.iterdir()) == []


# --- the route's split, and the README's example on the demo's seed --------------------------

def test_a_batch_is_drawn_by_the_routes_weights_or_pinned_to_a_pool_with_weight(
        sim_pool: Pool, sim_primary_pool: Pool, batch_files_dir: Path):
    import random

    from fleetctl.batch import services
    from fleetctl.traffic.services.writes import revision_create

    from .factory import upload, write_input

    route = route_create(actor=SYSTEM, name="llama-batch", model_id=MODEL,
                         primary_pool=sim_primary_pool, latency_class="batch", reason="t",
                         weights={"primary-sim": 75, "batch-sim": 25})
    batch_file = upload(SYSTEM, write_input(batch_files_dir.parent / "in.jsonl", 2))
    rng = random.Random(7)
    pools = [services.batch_create(actor=SYSTEM, input_file=batch_file,
                                   endpoint="/v1/chat/completions", completion_window="24h",
                                   rng=rng).pool.name for _ in range(40)]
    assert {"primary-sim", "batch-sim"} == set(pools)
    assert 20 <= pools.count("primary-sim") <= 38  # 75 % of 40 = 30, seeded
    pinned = services.batch_create(actor=SYSTEM, input_file=batch_file,
                                   endpoint="/v1/chat/completions", completion_window="24h",
                                   metadata={"pool": "batch-sim"})
    assert (pinned.pool.name, pinned.route) == ("batch-sim", route)
    revision_create(actor=SYSTEM, route=route, weights={"primary-sim": 100},
                    base_revision=route.revision_number, reason="batch-sim off")
    before = BatchJob.objects.count()
    with pytest.raises(ValidationError, match="batch-sim carries no weight on route llama-batch"):
        services.batch_create(actor=SYSTEM, input_file=batch_file,
                              endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={"pool": "batch-sim"})
    assert BatchJob.objects.count() == before


def test_the_readme_example_submits_a_batch_on_the_demos_seed(
        live_server: Any, transactional_db: None, tmp_path: Path, settings: Any):
    """The README's client.files.create / client.batches.create against `make demo`'s seed:
    the batch lands on llama-8b-batch, on the H200 or the A100 (stage 3). No worker runs
    here (the demo's simulated pools are not started), so it stays in progress."""
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("demo_seed", "--password", "demo-pw", "--gateway-admin", "http://127.0.0.1:1",
                 "--gateway-config-dir", str(tmp_path), stdout=io.StringIO(),
                 stderr=io.StringIO())
    oncall = get_user_model().objects.get(username="oncall")
    secret = token_create_personal(actor=Actor(user=oncall), name="batch",
                                   scopes=["read", "jobs"]).secret
    (tmp_path / "nightly.jsonl").write_bytes(_jsonl(3))

    # As in the README:
    from openai import OpenAI
    client = OpenAI(base_url=f"{live_server.url}/openai/v1", api_key=secret)
    batch_input = client.files.create(file=open(tmp_path / "nightly.jsonl", "rb"),  # noqa: SIM115
                                      purpose="batch")
    batch = client.batches.create(input_file_id=batch_input.id,
                                  endpoint="/v1/chat/completions", completion_window="24h")
    assert client.batches.retrieve(batch.id).status == "in_progress"

    job = BatchJob.objects.get(pk=int(batch.id.removeprefix("batch_")))
    assert job.route is not None and job.route.name == "llama-8b-batch"
    assert job.pool.name in ("h200-us-east", "a100-eu-central")
    on_a100 = client.batches.create(input_file_id=batch_input.id,
                                    endpoint="/v1/chat/completions", completion_window="24h",
                                    metadata={"pool": "a100-eu-central"})
    assert on_a100.metadata == {"pool": "a100-eu-central"}
    with pytest.raises(openai.BadRequestError, match=r"at stage 2 \(shadow\); batch jobs"):
        client.batches.create(input_file_id=batch_input.id, endpoint="/v1/chat/completions",
                              completion_window="24h", metadata={"pool": "mi300x-us-east"})


def test_paths_and_bodies_the_client_would_not_send_get_openai_errors(
        api: Any, token_client: Callable[..., Any], batch_route: Route,
        batch_files_dir: Path):
    from .factory import upload, write_input

    stored = upload(SYSTEM, write_input(batch_files_dir.parent / "in.jsonl", 2))
    unknown = api.get("/openai/v1/models")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    writer = token_client(["read", "jobs"], "on-call")
    for body, param in [({}, "input_file_id"),
                        ({"input_file_id": f"file-{stored.pk}",
                          "endpoint": "/v1/chat/completions",
                          "completion_window": "24h", "metadata": {"k": 1}}, "metadata"),
                        ({"input_file_id": "file-\x00", "endpoint": "/v1/chat/completions",
                          "completion_window": "24h"}, "input_file_id")]:
        answer = writer.post("/openai/v1/batches", body, format="json")
        assert answer.status_code in (400, 404), answer.content
        assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
        assert answer.json()["error"]["param"] == param, answer.json()
    assert writer.get("/openai/v1/batches?after=nope").json()["error"]["param"] == "after"
    assert not BatchJob.objects.exists()
