"""`fleetctl batch ...` against a live server over real HTTP: submit (one step, nothing kept
on a refusal), status, list, pause / resume / edit / cancel, output and error files to stdout
or -o FILE; and `submit --wait` as a real process, with a real batch worker on the simulator
pool. Most commands run the CLI's main() in the test process (a new interpreter per command
costs seconds on this machine); the end-to-end one runs `python -m fleetctl.cli`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.batch.models import BatchFile, BatchJob, BatchJobEvent, BatchResult

from .factory import MODEL, request_line, write_input
from .workerproc import WorkerProcess


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run(live_server, token: str, *argv: str) -> Ran:
    """`fleetctl --url … --token … batch ARGV` in this process (main(), real HTTP)."""
    from fleetctl.cli.main import main

    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["--url", live_server.url, "--token", token, "batch", *argv])
        except SystemExit as exit_:  # argparse's usage errors
            code = int(exit_.code or 0)
    out.flush()
    return Ran(code, out.buffer.getvalue().decode(), err.getvalue())  # type: ignore[attr-defined]


def run_process(live_server, token: str, *argv: str, timeout_s: float = 90
                ) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLEETCTL_URL=live_server.url, FLEETCTL_TOKEN=token)
    return subprocess.run([sys.executable, "-m", "fleetctl.cli", "batch", *argv], env=env,
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture
def token(transactional_db, make_user) -> str:
    user = make_user("olga", "on-call")
    return token_create_personal(actor=Actor(user=user), name="cli",
                                 scopes=["read", "jobs"]).secret


@pytest.fixture
def read_token(transactional_db, make_user) -> str:
    user = make_user("vic", "viewer")
    return token_create_personal(actor=Actor(user=user), name="cli", scopes=["read"]).secret


def test_submit_follow_act_and_download_from_the_cli(live_server, token, read_token,
                                                     sim_pool, tmp_path, batch_files_dir):
    path = write_input(tmp_path / "nightly.jsonl", 5)
    submitted = run(live_server, token, "submit", str(path), "--pool", sim_pool.name,
                    "--chunk-size", "2", "--window", "30m", "--rate", "4", "--json")
    assert submitted.returncode == 0, submitted.stderr
    job = BatchJob.objects.get(pk=json.loads(submitted.stdout)["id"])
    assert (job.total, job.chunk_size, job.completion_window_s, job.rate_limit_rps) == (
        5, 2, 1800, 4.0)
    assert job.input_file.name == "nightly.jsonl"

    status = run(live_server, read_token, "status", str(job.pk))
    assert status.returncode == 0, status.stderr
    assert "progress    0/5 (0.0 %)" in status.stdout, status.stdout
    assert "concurrency 8, rate 4.0 req/s, chunks of 2" in status.stdout
    listed = run(live_server, read_token, "list", "--pool", sim_pool.name)
    assert listed.stdout.splitlines()[1].split()[:3] == [str(job.pk), "queued", sim_pool.name]

    refused = run(live_server, read_token, "pause", str(job.pk), "--reason", "x")
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr
    paused = run(live_server, token, "pause", str(job.pk), "--reason", "maintenance")
    assert paused.returncode == 0 and f"job {job.pk} paused" in paused.stdout
    again = run(live_server, token, "pause", str(job.pk), "--reason", "twice")
    assert again.returncode == 1 and "HTTP 409" in again.stderr
    edited = run(live_server, token, "edit", str(job.pk), "--concurrency", "2", "--rate", "0",
                 "--reason", "gentler")
    assert edited.returncode == 0, edited.stderr
    assert "concurrency 2, rate no limit" in edited.stdout
    assert run(live_server, token, "resume", str(job.pk), "--reason", "go").returncode == 0

    # Two results as a worker would write them; the job is cancelled with its partial output.
    answer = {"id": "x", "choices": [{"message": {"role": "assistant", "content": "hi"}}]}
    BatchResult.objects.create(job=job, index=0, custom_id="req-0", status_code=200,
                               body=json.dumps(answer), worker="w", finished_at=timezone.now())
    BatchResult.objects.create(job=job, index=1, custom_id="req-1", status_code=400,
                               body='{"error": {"message": "bad"}}', worker="w",
                               error_code="invalid_request", error_message="HTTP 400")
    cancelled = run(live_server, token, "cancel", str(job.pk), "--reason", "enough")
    assert cancelled.returncode == 0 and f"job {job.pk} cancelled" in cancelled.stdout
    assert [e.manual for e in BatchJobEvent.objects.filter(job=job)] == [
        False, True, True, True, True]

    output = run(live_server, read_token, "output", str(job.pk))
    assert output.returncode == 0, output.stderr
    assert [json.loads(line) for line in output.stdout.splitlines()] == [
        {"id": f"batch_req_{job.pk}_0", "custom_id": "req-0",
         "response": {"status_code": 200, "request_id": "", "body": answer}, "error": None}]
    target = tmp_path / "errors.jsonl"
    errors = run(live_server, read_token, "output", str(job.pk), "--errors", "-o", str(target))
    assert errors.returncode == 0 and "wrote" in errors.stderr
    line = json.loads(target.read_text())
    assert line["custom_id"] == "req-1" and line["error"]["code"] == "invalid_request"
    missing = run(live_server, read_token, "output", "999999", "-o", str(tmp_path / "no"))
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    assert not (tmp_path / "no").exists() and not (tmp_path / "no.part").exists()


def test_a_refused_submit_names_the_line_and_keeps_nothing(live_server, token, sim_pool,
                                                           tmp_path, batch_files_dir):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(request_line(0)) + "\n"
                    + json.dumps({**request_line(1), "method": "GET"}) + "\n"
                    + json.dumps(request_line(2, custom_id="req-0")) + "\n")
    refused = run(live_server, token, "submit", str(path), "--pool", sim_pool.name)
    assert refused.returncode == 1
    assert 'line 2: method must be "POST", got "GET"' in refused.stderr
    served = tmp_path / "other.jsonl"
    served.write_text(json.dumps(request_line(0, model="gpt-x")) + "\n")
    refused = run(live_server, token, "submit", str(served), "--pool", sim_pool.name)
    assert refused.returncode == 1 and "line 1: model 'gpt-x' is not served" in refused.stderr
    assert not BatchFile.objects.exists() and not BatchJob.objects.exists()
    assert list(batch_files_dir.iterdir()) == []
    usage = run(live_server, token, "submit", "--pool", sim_pool.name)
    assert usage.returncode == 2 and "give FILE" in usage.stderr
    bad_window = run(live_server, token, "submit", str(path), "--pool", "p", "--window", "soon")
    assert bad_window.returncode == 2 and "like 90s, 5m, 24h or 7d" in bad_window.stderr


def test_upload_then_submit_by_id(live_server, token, sim_pool, tmp_path):
    path = write_input(tmp_path / "in.jsonl", 3)
    uploaded = run(live_server, token, "upload", str(path), "--json")
    assert uploaded.returncode == 0, uploaded.stderr
    file_id = json.loads(uploaded.stdout)["id"]
    assert json.loads(uploaded.stdout)["model_lines"] == {MODEL: 1}
    submitted = run(live_server, token, "submit", "--input-file", str(file_id), "--pool",
                    sim_pool.name)
    assert submitted.returncode == 0, submitted.stderr
    assert BatchJob.objects.get().input_file_id == file_id


@pytest.mark.slow
def test_submit_wait_follows_a_real_worker_to_completion(live_server, token, sim_pool,
                                                         tmp_path, batch_files_dir):
    worker = WorkerProcess(tmp_path, "cli-w1")
    try:
        path = write_input(tmp_path / "in.jsonl", 12)
        done = run_process(live_server, token, "submit", str(path), "--pool", sim_pool.name,
                           "--chunk-size", "5", "--concurrency", "4", "--wait")
        assert done.returncode == 0, done.stderr + worker.log()
        job = BatchJob.objects.get()
        assert done.stdout.startswith(f"job {job.pk} completed: 12/12 (100.0 %)")
        assert "queued" in done.stderr or "running" in done.stderr  # progress was printed
        output = run_process(live_server, token, "output", str(job.pk))
        ids = [json.loads(line)["custom_id"] for line in output.stdout.splitlines()]
        assert ids == [f"req-{i}" for i in range(12)]
    finally:
        worker.stop()
