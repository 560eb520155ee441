"""`fleetctl eval suites | upload | run | show | cancel`, run as real processes against a live
server. The run's rows are scored here, directly, in place of a worker (the worker's own
tests are tests/evals/test_e2e.py): what is under test is the command line."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.utils import timezone

from fleetctl.accounts.services import token_create_personal
from fleetctl.evals import services
from fleetctl.evals.models import EvalResult, EvalRun, EvalSuite
from fleetctl.fleet.models import Pool
from tests.cli.test_cli import run
from tests.evals.test_api import item, scored_run, suite_text
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def silent_pools(transactional_db, world: World) -> Iterator[str]:  # noqa: F811
    """Both pools' endpoint: a socket that takes connections and never answers. When the
    session's worker is up (another test started it), it picks up the runs created here and
    waits on their calls, so a run stays active until this test scores, finishes or cancels
    it; without one, nothing happens at all. Either way the outcome is the test's."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    Pool.objects.filter(pk__in=[world.primary.pk, world.candidate.pk]).update(base_urls=[url])
    try:
        yield url
    finally:
        listener.close()  # the waiting calls fail at once: the worker is free again


@pytest.fixture
def tokens(transactional_db, world: World, silent_pools: str) -> dict[str, str]:  # noqa: F811
    world.plan()

    def issue(who: str, scopes: list[str]) -> str:
        return token_create_personal(actor=world.actor(who), name="cli", scopes=scopes).secret

    return {"lead": issue("lead", ["read", "jobs"]), "viewer": issue("viewer", ["read"])}


@pytest.fixture
def suite_file(tmp_path: Path) -> Path:
    path = tmp_path / "sums.jsonl"
    path.write_text(suite_text())
    return path


def test_upload_list_and_a_bad_file(live_server, tokens, world: World,  # noqa: F811
                                    suite_file: Path, tmp_path: Path):
    uploaded = run(live_server, "eval", "upload", str(suite_file), "--name", "sums",
                   "--description", "four sums", token=tokens["lead"])
    assert uploaded.returncode == 0, uploaded.stderr
    suite = EvalSuite.objects.get()
    assert uploaded.stdout.strip() == f"suite sums v1: 4 items, sha256 {suite.sha256}"
    again = run(live_server, "eval", "upload", str(suite_file), "--name", "sums",
                "--description", "four sums", token=tokens["lead"])
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"suite sums v1: 4 items, sha256 {suite.sha256}"
    assert "already stored" in again.stderr
    as_json = json.loads(run(live_server, "eval", "upload", str(suite_file), "--name", "sums",
                             "--description", "four sums", "--json",
                             token=tokens["lead"]).stdout)
    assert (as_json["id"], as_json["created"]) == (suite.pk, False)

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(item(0)) + "\n{oops\n" + json.dumps(item(1, scorer="vibes"))
                   + "\n")
    refused = run(live_server, "eval", "upload", str(bad), "--name", "bad",
                  token=tokens["lead"])
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.splitlines()
    assert lines[0] == "fleetctl: bad.jsonl was not stored:"
    assert lines[1].strip().startswith("line 2:") and lines[2].strip().startswith("line 3:")
    assert "Traceback" not in refused.stderr
    missing = run(live_server, "eval", "upload", str(tmp_path / "nope.jsonl"), "--name", "x",
                  token=tokens["lead"])
    assert missing.returncode == 2 and "no such file" in missing.stderr
    bad_name = run(live_server, "eval", "upload", str(suite_file), "--name", "Bad Name",
                   token=tokens["lead"])
    assert bad_name.returncode == 2 and "name:" in bad_name.stderr
    viewer = run(live_server, "eval", "upload", str(suite_file), "--name", "other",
                 token=tokens["viewer"])
    assert viewer.returncode == 1 and "HTTP 403" in viewer.stderr
    assert list(EvalSuite.objects.values_list("name", flat=True)) == ["sums"]

    listed = run(live_server, "eval", "suites", token=tokens["viewer"])
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:5] == ["ID", "NAME", "VERSION", "ITEMS", "SOURCE"]
    assert row.split()[:7] == [str(suite.pk), "sums", "1", "4", "uploaded", suite.sha256[:12],
                               "no"]
    services.suite_retire(actor=world.actor("lead"), suite=suite)
    assert "(none)" in run(live_server, "eval", "suites", token=tokens["viewer"]).stdout
    every = run(live_server, "eval", "suites", "--all", "--json", token=tokens["viewer"])
    assert [(s["name"], s["retired"]) for s in json.loads(every.stdout)] == [("sums", True)]


def test_run_show_diff_and_cancel(live_server, tokens, suite_file: Path):
    run(live_server, "eval", "upload", str(suite_file), "--name", "sums", token=tokens["lead"])
    started = run(live_server, "eval", "run", "--suite", "sums", "--plan", "mi300x-llama",
                  "--concurrency", "4", "--max-rps", "20", "--seed", "5", "--min-items", "2",
                  token=tokens["lead"])
    assert started.returncode == 0, started.stderr
    evrun = EvalRun.objects.get()
    assert f"started eval run {evrun.pk}: " in started.stderr
    assert f"/evals/runs/{evrun.pk}/" in started.stderr
    assert (evrun.concurrency, evrun.max_rps, evrun.decoding["seed"], evrun.min_items) == (
        4, 20, 5, 2)
    # Started, not finished: a free worker may already have taken it when its answer is read.
    assert re.search(r"^status\s+(queued|running)$", started.stdout, re.M), started.stdout
    assert "0/8 (0.0%)" in started.stdout

    EvalRun.objects.filter(pk=evrun.pk).update(status="running", started_at=timezone.now())
    scored_run(evrun, "mi300x-us", "h200-us")
    services.run_finish(EvalRun.objects.get(pk=evrun.pk))
    evrun.refresh_from_db()
    shown = run(live_server, "eval", "show", str(evrun.pk), "--diff", token=tokens["viewer"])
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"sums v1 (sha256 {evrun.suite_sha256[:12]})" in out
    assert "8/8 (100.0%)" in out and f"verdict    {evrun.verdict}" in out
    pools = [line.split() for line in out.splitlines()
             if line.startswith(("mi300x-us ", "h200-us "))]
    assert [p[:4] for p in pools] == [["mi300x-us", "candidate", "4", "50.0%"],
                                      ["h200-us", "primary", "4", "50.0%"]]
    assert "candidate − primary over 4 items: +0.0 pts" in out
    assert "items scored differently: 2" in out
    diff_rows = [line.split()[:5] for line in out.splitlines() if line.startswith("sum-")]
    assert diff_rows == [["sum-001", "regressed", "arithmetic,parity:odd", "0", "1"],
                         ["sum-002", "improved", "arithmetic,parity:even", "1", "0"]]
    only = run(live_server, "eval", "show", str(evrun.pk), "--diff", "--direction",
               "improved", "--json", token=tokens["viewer"])
    body = json.loads(only.stdout)
    assert body["run"]["id"] == evrun.pk and [r["item"] for r in body["diff"]] == ["sum-002"]
    plain = json.loads(run(live_server, "eval", "show", str(evrun.pk), "--json",
                           token=tokens["viewer"]).stdout)
    assert plain["verdict"] == evrun.verdict and plain["evidence_id"] == evrun.evidence_id

    second = run(live_server, "eval", "run", "--suite", "sums@1", "--candidate", "mi300x-us",
                 "--json", token=tokens["lead"])
    assert second.returncode == 0, second.stderr
    second_id = json.loads(second.stdout)["id"]
    refused = run(live_server, "eval", "cancel", str(second_id), token=tokens["viewer"])
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr
    cancelled = run(live_server, "eval", "cancel", str(second_id), token=tokens["lead"])
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"cancelled eval run {second_id}: 0/4 scored")
    assert EvalRun.objects.get(pk=second_id).status == "cancelled"
    again = run(live_server, "eval", "cancel", str(second_id), token=tokens["lead"])
    assert again.returncode == 1 and "HTTP 409" in again.stderr
    no_primary = run(live_server, "eval", "show", str(second_id), "--diff",
                     token=tokens["viewer"])
    assert no_primary.returncode == 0 and "nothing to diff against" in no_primary.stdout


def test_run_wait_follows_the_run_and_exits_3_on_a_fail(live_server, tokens, tmp_path: Path):
    path = tmp_path / "twenty.jsonl"
    path.write_text("".join(json.dumps(item(i)) + "\n" for i in range(20)))
    run(live_server, "eval", "upload", str(path), "--name", "twenty", token=tokens["lead"])
    env = dict(os.environ, FLEETCTL_URL=live_server.url, FLEETCTL_TOKEN=tokens["lead"])
    waiting = subprocess.Popen(
        [sys.executable, "-m", "fleetctl.cli", "eval", "run", "--suite", "twenty", "--plan",
         "mi300x-llama", "--min-items", "10", "--wait"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: EvalRun.objects.exists(), timeout_s=30, what="the run to start")
        evrun = EvalRun.objects.get()
        EvalRun.objects.filter(pk=evrun.pk).update(status="running")
        now = timezone.now()
        # The candidate gets every item wrong, the primary every one right.
        for pool, value in (("mi300x-us", 0.0), ("h200-us", 1.0)):
            EvalResult.objects.filter(run=evrun, run_pool__pool__name=pool).update(
                status="done", score=value, text="x", scored_at=now)
        EvalRun.objects.filter(pk=evrun.pk).update(done=40)
        services.run_finish(EvalRun.objects.get(pk=evrun.pk))
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert EvalRun.objects.get().verdict == "fail"
    assert waiting.returncode == 3, err
    assert f"eval run {evrun.pk}: complete [####################] 40/40 (100.0%)" in err
    assert "verdict    fail" in out
    assert "candidate − primary over 20 items: -100.0 pts" in out


def test_bad_arguments_are_usage_errors(live_server, tokens):
    for argv, says in ((["eval", "run", "--candidate", "x"], "--suite"),
                       (["eval", "run", "--suite", "s"], "--candidate"),
                       (["eval", "run", "--suite", "s", "--candidate", "c", "--concurrency",
                         "0"], "whole number"),
                       (["eval", "run", "--suite", "s", "--candidate", "c", "--max-rps",
                         "0"], "0.01 to 10000"),
                       (["eval", "show", "zero"], "is not a run id"),
                       (["eval", "cancel"], "RUN"),
                       (["eval", "upload", "f.jsonl"], "--name")):
        answer = run(live_server, *argv, token=tokens["lead"])
        assert answer.returncode == 2, (argv, answer.stderr)
        assert says in answer.stderr, (argv, answer.stderr)
    unknown = run(live_server, "eval", "run", "--suite", "nope", "--candidate", "mi300x-us",
                  token=tokens["lead"])
    assert unknown.returncode == 1 and "No suite 'nope'" in unknown.stderr
    missing = run(live_server, "eval", "show", "999999", token=tokens["viewer"])
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    assert not EvalRun.objects.exists()
