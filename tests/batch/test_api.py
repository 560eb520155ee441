"""Batch REST (/api/v1/batch/): authentication and scopes, uploads in one step and two,
line-numbered refusals that store nothing, a person's actions and their conflicts, and the
output and error files in the OpenAI Batch format."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.utils import timezone

from fleetctl.audit.models import AuditEvent
from fleetctl.batch.models import BatchChunk, BatchFile, BatchJob, BatchJobEvent, BatchResult
from fleetctl.core.models import IdempotentRequest
from tests.core.hostile import REVIEWED_DEPTHS, recording_server, with_nested

from .factory import MODEL, request_line, upload, write_input

FILES = "/api/v1/batch/files/"
JOBS = "/api/v1/batch/jobs/"


def _jsonl(*rows: object) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def _upload_file(content: bytes, name: str = "in.jsonl") -> io.BytesIO:
    handle = io.BytesIO(content)
    handle.name = name
    return handle


@pytest.fixture
def writer(token_client):
    return token_client(["read", "jobs"], "on-call")


@pytest.fixture
def reader(token_client):
    return token_client(["read"], "on-call")


def _stored_files(folder: Path) -> list[Path]:
    return sorted(folder.iterdir())


# --- authentication, scopes -------------------------------------------------------------------

def test_anonymous_is_401_and_a_read_token_cannot_upload_or_create(api, reader, sim_pool,
                                                                   batch_files_dir, tmp_path,
                                                                   system):
    assert api.get(JOBS).status_code == 401
    assert api.get(FILES).status_code == 401
    content = _jsonl(request_line(0))
    refused = reader.post(FILES, {"file": _upload_file(content)}, format="multipart")
    assert refused.status_code == 403, refused.content
    assert "jobs" in refused.json()["error"]["message"] or "scope" in \
        refused.json()["error"]["message"]
    batch_file = upload(system, write_input(tmp_path / "a.jsonl", 3))
    no_job = reader.post(JOBS, {"input_file": batch_file.pk, "pool": sim_pool.name},
                         format="json")
    assert no_job.status_code == 403
    assert not BatchJob.objects.exists()
    assert BatchFile.objects.count() == 1 and len(_stored_files(batch_files_dir)) == 1
    # Reading needs `read` only.
    assert reader.get(FILES).json()["count"] == 1


def test_a_token_without_read_cannot_list(token_client):
    assert token_client(["jobs"], "on-call").get(JOBS).status_code == 403


# --- two steps: upload, then create -------------------------------------------------------------

def test_upload_then_create_then_read_the_job_with_its_progress(writer, sim_pool,
                                                                batch_files_dir, tmp_path):
    path = write_input(tmp_path / "in.jsonl", 7)
    with path.open("rb") as handle:
        uploaded = writer.post(FILES, {"file": handle}, format="multipart")
    assert uploaded.status_code == 201, uploaded.content
    body = uploaded.json()
    assert body["requests"] == 7 and body["name"] == "in.jsonl"
    assert body["model_lines"] == {MODEL: 1}
    assert body["url_lines"] == {"/v1/chat/completions": 1}
    stored = BatchFile.objects.get(pk=body["id"])
    assert (batch_files_dir / stored.path).read_bytes() == path.read_bytes()

    created = writer.post(JOBS, {"input_file": body["id"], "pool": sim_pool.name,
                                 "chunk_size": 3, "concurrency": 2,
                                 "completion_window_s": 600}, format="json")
    assert created.status_code == 201, created.content
    job = created.json()
    assert job["state"] == "queued" and job["total"] == 7 and job["pool"] == sim_pool.name
    assert job["progress"]["done"] == 0 and job["progress"]["chunks"] == 3
    assert job["output_url"] == f"/api/v1/batch/jobs/{job['id']}/output/"

    detail = writer.get(f"{JOBS}{job['id']}/").json()
    assert detail["progress"]["total"] == 7 and detail["concurrency"] == 2
    listed = writer.get(JOBS, {"state": "queued", "pool": sim_pool.name}).json()
    assert [row["id"] for row in listed["results"]] == [job["id"]]
    assert writer.get(JOBS, {"state": "running"}).json()["count"] == 0
    events = writer.get(f"{JOBS}{job['id']}/events/").json()["results"]
    assert [e["kind"] for e in events] == ["created"] and events[0]["manual"] is False


def test_create_with_an_idempotency_key_runs_once(writer, sim_pool, tmp_path, system):
    batch_file = upload(system, write_input(tmp_path / "in.jsonl", 4))
    payload = {"input_file": batch_file.pk, "pool": sim_pool.name}
    first = writer.post(JOBS, payload, format="json", HTTP_IDEMPOTENCY_KEY="job-1")
    again = writer.post(JOBS, payload, format="json", HTTP_IDEMPOTENCY_KEY="job-1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert first.json()["id"] == again.json()["id"] and BatchJob.objects.count() == 1
    assert IdempotentRequest.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_nul_byte_looked_up_is_a_400_kept_for_its_idempotency_key(writer, sim_pool):
    # PostgreSQL stores no U+0000 and refuses it in a lookup: a 400 naming it, kept and
    # replayed like any refusal (storing it inside a rolled-back transaction was a 500, found
    # by tests/api/test_schemathesis.py).
    payload = {"input_file": 1, "pool": "no\x00such"}
    first = writer.post(JOBS, payload, format="json", HTTP_IDEMPOTENCY_KEY="nul-1")
    again = writer.post(JOBS, payload, format="json", HTTP_IDEMPOTENCY_KEY="nul-1")
    assert first.status_code == again.status_code == 400, first.content
    assert "NUL" in first.json()["error"]["message"]
    assert again["Idempotent-Replayed"] == "true"
    assert BatchJob.objects.count() == 0


def test_a_nul_byte_inside_an_enclosing_transaction_is_a_400_not_stored(writer, sim_pool):
    # Here the request runs inside the test's transaction, as under ATOMIC_REQUESTS: the
    # refusal rolls it back, so the key's claim goes with it and nothing is stored.
    answer = writer.post(JOBS, {"input_file": 1, "pool": "no\x00such"}, format="json",
                         HTTP_IDEMPOTENCY_KEY="nul-2")
    assert answer.status_code == 400, answer.content
    assert "NUL" in answer.json()["error"]["message"]


# --- one step: multipart file + fields ------------------------------------------------------------

def test_upload_and_create_in_one_step(writer, sim_pool, batch_files_dir, tmp_path):
    path = write_input(tmp_path / "nightly.jsonl", 5)
    with path.open("rb") as handle:
        created = writer.post(JOBS, {"file": handle, "pool": sim_pool.name, "chunk_size": "2",
                                     "rate_limit_rps": "5"}, format="multipart")
    assert created.status_code == 201, created.content
    job = BatchJob.objects.get(pk=created.json()["id"])
    assert job.input_file.name == "nightly.jsonl" and job.total == 5
    assert job.rate_limit_rps == 5.0 and job.chunks.count() == 3
    assert len(_stored_files(batch_files_dir)) == 1


def test_one_step_refused_for_a_model_the_pool_does_not_serve_keeps_nothing(
        writer, sim_pool, batch_files_dir):
    content = _jsonl(request_line(0), request_line(1), request_line(2, model="gpt-9"),
                     request_line(3, model="gpt-9"))
    refused = writer.post(JOBS, {"file": _upload_file(content), "pool": sim_pool.name},
                          format="multipart")
    assert refused.status_code == 400, refused.content
    message = refused.json()["error"]["fields"]["file"][0]
    assert message.startswith("line 3: model 'gpt-9' is not served by pool batch-sim")
    assert not BatchFile.objects.exists() and not BatchJob.objects.exists()
    assert _stored_files(batch_files_dir) == []


def test_one_step_with_a_bad_line_names_it_and_keeps_nothing(writer, sim_pool,
                                                             batch_files_dir):
    content = _jsonl(request_line(0)) + b"{not json\n" + _jsonl(
        {**request_line(2), "url": "/v1/moderations"})
    refused = writer.post(JOBS, {"file": _upload_file(content), "pool": sim_pool.name},
                          format="multipart")
    assert refused.status_code == 400
    lines = refused.json()["error"]["fields"]["file"]
    assert lines[0].startswith("line 2: is not valid JSON")
    assert lines[1].startswith('line 3: url "/v1/moderations" is not supported')
    assert not BatchFile.objects.exists() and _stored_files(batch_files_dir) == []
    assert not AuditEvent.objects.filter(action="batch.file_upload", outcome="ok").exists()


def test_multipart_create_refuses_an_idempotency_key(writer, sim_pool):
    refused = writer.post(JOBS, {"file": _upload_file(_jsonl(request_line(0))),
                                 "pool": sim_pool.name}, format="multipart",
                          HTTP_IDEMPOTENCY_KEY="k")
    assert refused.status_code == 400
    assert "Idempotency-Key" in refused.json()["error"]["fields"]
    assert not BatchFile.objects.exists()


# --- bad requests ------------------------------------------------------------------------------

@pytest.mark.parametrize(("payload", "field", "words"), [
    ({}, "input_file", "Give input_file"),
    ({"concurrency": 0}, "concurrency", "out of range"),
    ({"concurrency": 300}, "concurrency", "out of range"),
    ({"chunk_size": "many"}, "chunk_size", "valid integer"),
    ({"rate_limit_rps": 0.001}, "rate_limit_rps", "at least 0.01"),
    ({"completion_window_s": 5}, "completion_window_s", "out of range"),
    ({"drill": "reboot"}, "drill", "not a valid choice"),
    ({"drill_at": 0.99}, "drill_at", "out of range"),
    ({"pool": "nowhere"}, "pool", "does not exist"),
])
def test_bad_options_are_400_naming_the_field_and_store_nothing(writer, sim_pool, tmp_path,
                                                                system, payload, field, words):
    batch_file = upload(system, write_input(tmp_path / "in.jsonl", 3))
    body = {"pool": sim_pool.name, "input_file": batch_file.pk, **payload}
    if not payload:
        body.pop("input_file")
    refused = writer.post(JOBS, body, format="json")
    assert refused.status_code == 400, refused.content
    fields = refused.json()["error"]["fields"]
    assert field in fields and words in fields[field][0], fields
    assert not BatchJob.objects.exists() and not BatchChunk.objects.exists()


# --- nesting, and schemas that point outside themselves -----------------------------------------

DEPTH_REFUSED = ("is nested deeper than 64 levels (arrays and objects inside each other), the "
                 "depth limit")


def _deep_line(i: int, depth: int) -> bytes:
    """Request line i with a value `depth` levels deep in its body (the line is deeper)."""
    line = request_line(i)
    line["body"]["metadata"] = "@NESTED@"
    return with_nested(line, depth).encode() + b"\n"


@pytest.mark.parametrize("depth", REVIEWED_DEPTHS)
def test_a_line_nested_deeper_than_the_limit_is_a_400_naming_it_and_keeps_nothing(
        writer, sim_pool, batch_files_dir, depth):
    content = _jsonl(request_line(0)) + _deep_line(1, depth) + _jsonl(request_line(2))
    uploaded = writer.post(FILES, {"file": _upload_file(content)}, format="multipart")
    in_one_step = writer.post(JOBS, {"file": _upload_file(content), "pool": sim_pool.name},
                              format="multipart")
    for refused in (uploaded, in_one_step):
        assert refused.status_code == 400, refused.content[:300]
        assert refused.json()["error"]["fields"]["file"] == [f"line 2: {DEPTH_REFUSED}"]
    assert not BatchFile.objects.exists() and not BatchJob.objects.exists()
    assert _stored_files(batch_files_dir) == []


def test_a_line_nested_to_the_limit_is_stored(writer, batch_files_dir):
    # {"body": {"metadata": ...}}: two levels above the value, so 62 make a line of 64.
    uploaded = writer.post(FILES, {"file": _upload_file(_deep_line(0, 62))}, format="multipart")
    assert uploaded.status_code == 201, uploaded.content[:300]
    assert len(_stored_files(batch_files_dir)) == 1


@pytest.mark.parametrize("depth", REVIEWED_DEPTHS)
def test_a_json_body_nested_too_deeply_is_a_400_and_creates_nothing(writer, sim_pool, depth):
    body = with_nested({"input_file": "@NESTED@", "pool": sim_pool.name}, depth)
    refused = writer.post(JOBS, body, content_type="application/json")
    assert refused.status_code == 400, refused.content[:300]
    assert refused.json()["error"]["code"] == "invalid"
    assert not BatchJob.objects.exists()


def test_a_request_schema_that_points_outside_is_a_400_naming_the_line_and_fetches_nothing(
        writer, batch_files_dir):
    outside = "points outside the schema; only local references (#/…) are allowed"
    with recording_server() as server:
        asks_json = request_line(1)
        asks_json["body"]["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "answer", "schema": {"$ref": f"{server.url}/answer.json"}}}
        calls_tool = request_line(2)
        calls_tool["body"]["tools"] = [{"type": "function", "function": {
            "name": "lookup", "parameters": {"$ref": "file:///etc/hostname"}}}]
        content = _jsonl(request_line(0), asks_json, calls_tool)
        refused = writer.post(FILES, {"file": _upload_file(content)}, format="multipart")
        assert refused.status_code == 400, refused.content[:300]
        assert refused.json()["error"]["fields"]["file"] == [
            f"line 2: body.response_format.json_schema.schema: $ref "
            f"'{server.url}/answer.json' {outside}",
            f"line 3: body.tools[0].function.parameters: $ref 'file:///etc/hostname' {outside}"]
        assert server.hits == []
    assert not BatchFile.objects.exists() and _stored_files(batch_files_dir) == []


def test_upload_over_the_size_cap_is_400(writer, settings, batch_files_dir):
    settings.BATCH_MAX_UPLOAD_BYTES = 100
    content = _jsonl(request_line(0), request_line(1))
    refused = writer.post(FILES, {"file": _upload_file(content)}, format="multipart")
    assert refused.status_code == 400
    assert "BATCH_MAX_UPLOAD_BYTES" in refused.json()["error"]["fields"]["file"][0]
    assert _stored_files(batch_files_dir) == []


def test_unknown_job_is_404_in_json_even_on_a_download(writer):
    missing = writer.get(f"{JOBS}999999/output/", HTTP_ACCEPT="application/x-ndjson")
    assert missing.status_code == 404 and missing["Content-Type"] == "application/json"
    assert writer.get(f"{JOBS}abc/").status_code == 404


# --- a person's actions ---------------------------------------------------------------------------

def test_pause_resume_edit_cancel_and_their_conflicts(writer, reader, sim_pool, tmp_path,
                                                      system):
    batch_file = upload(system, write_input(tmp_path / "in.jsonl", 3))
    job_id = writer.post(JOBS, {"input_file": batch_file.pk, "pool": sim_pool.name},
                         format="json").json()["id"]
    url = f"{JOBS}{job_id}/"
    assert writer.post(f"{url}pause/", {}, format="json").json()["error"]["fields"] == {
        "reason": ["This field is required."]}
    assert reader.post(f"{url}pause/", {"reason": "x"}, format="json").status_code == 403
    paused = writer.post(f"{url}pause/", {"reason": "GPU maintenance"}, format="json")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    again = writer.post(f"{url}pause/", {"reason": "twice"}, format="json")
    assert again.status_code == 409 and "paused" in again.json()["error"]["message"]

    edited = writer.patch(url, {"concurrency": 3, "rate_limit_rps": 2.5, "reason": "slower"},
                          format="json")
    assert edited.status_code == 200, edited.content
    assert edited.json()["concurrency"] == 3 and edited.json()["rate_limit_rps"] == 2.5
    bad_edit = writer.patch(url, {"concurrency": 0, "reason": "x"}, format="json")
    assert bad_edit.status_code == 400 and "concurrency" in bad_edit.json()["error"]["fields"]

    resumed = writer.post(f"{url}resume/", {"reason": "maintenance over"}, format="json")
    assert resumed.status_code == 200 and resumed.json()["state"] == "queued"
    assert writer.post(f"{url}resume/", {"reason": "x"}, format="json").status_code == 409

    cancelled = writer.post(f"{url}cancel/", {"reason": "not needed"}, format="json")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert writer.post(f"{url}cancel/", {"reason": "x"}, format="json").status_code == 409
    assert writer.patch(url, {"concurrency": 2, "reason": "x"},
                        format="json").status_code == 409
    assert writer.put(url, {}, format="json").status_code == 405

    events = writer.get(f"{url}events/").json()["results"]
    assert [(e["kind"], e["manual"]) for e in events] == [
        ("created", False), ("paused", True), ("edited", True), ("resumed", True),
        ("cancelled", True)]
    actions = set(AuditEvent.objects.filter(outcome="ok").values_list("action", flat=True))
    assert {"batch.job_pause", "batch.job_edit", "batch.job_resume",
            "batch.job_cancel"} <= actions


# --- output and error files -------------------------------------------------------------------

def _result(job: BatchJob, index: int, status: int, body: str, **fields: object) -> None:
    BatchResult.objects.create(job=job, index=index, custom_id=f"req-{index}",
                               status_code=status, body=body, worker="w1",
                               finished_at=timezone.now(), **fields)


def test_output_and_error_files_in_the_openai_batch_format(writer, sim_pool, tmp_path, system):
    batch_file = upload(system, write_input(tmp_path / "in.jsonl", 4))
    job_id = writer.post(JOBS, {"input_file": batch_file.pk, "pool": sim_pool.name},
                         format="json").json()["id"]
    job = BatchJob.objects.get(pk=job_id)
    answer = {"id": "chatcmpl-1", "object": "chat.completion",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}
    _result(job, 2, 200, json.dumps(answer))
    _result(job, 0, 200, json.dumps(answer))
    _result(job, 1, 429, '{"error": {"message": "slow down"}}', error_code="retries_exhausted",
            error_message="429 after 5 attempts", attempts=5)
    _result(job, 3, 0, "", error_code="timeout", error_message="no answer in 120 s")

    output = writer.get(f"{JOBS}{job_id}/output/")
    assert output.status_code == 200 and output["Content-Type"] == "application/x-ndjson"
    assert output["Content-Disposition"] == f'attachment; filename="batch_{job_id}_output.jsonl"'
    lines = [json.loads(line) for line in b"".join(output.streaming_content).splitlines()]
    assert lines == [
        {"id": f"batch_req_{job_id}_0", "custom_id": "req-0",
         "response": {"status_code": 200, "request_id": "", "body": answer}, "error": None},
        {"id": f"batch_req_{job_id}_2", "custom_id": "req-2",
         "response": {"status_code": 200, "request_id": "", "body": answer}, "error": None}]

    errors = writer.get(f"{JOBS}{job_id}/errors/", HTTP_ACCEPT="application/x-ndjson")
    assert errors.status_code == 200
    assert errors["Content-Disposition"] == f'attachment; filename="batch_{job_id}_errors.jsonl"'
    lines = [json.loads(line) for line in b"".join(errors.streaming_content).splitlines()]
    assert lines == [
        {"id": f"batch_req_{job_id}_1", "custom_id": "req-1",
         "response": {"status_code": 429, "request_id": "",
                      "body": {"error": {"message": "slow down"}}},
         "error": {"code": "retries_exhausted", "message": "429 after 5 attempts"}},
        {"id": f"batch_req_{job_id}_3", "custom_id": "req-3", "response": None,
         "error": {"code": "timeout", "message": "no answer in 120 s"}}]

    # Progress counts the chunks' counters (the store's), not result rows.
    BatchChunk.objects.filter(job=job).update(succeeded=2, failed=2)
    progress = writer.get(f"{JOBS}{job_id}/").json()["progress"]
    assert progress["done"] == 4 and progress["fraction"] == 1.0 and progress["error_rate"] == 0.5
    assert writer.get(f"{JOBS}{job_id}/resends/").json()["count"] == 0
    assert writer.get(f"{JOBS}{job_id}/comparisons/").json()["count"] == 0
    assert BatchJobEvent.objects.filter(job=job).count() == 1
