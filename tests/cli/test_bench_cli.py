"""`fleetctl bench …`, run as a real process against a live server, with a real Celery worker
measuring simulated pools: traces uploaded and generated, a two-pool run followed with a
progress line until it ends, its per-pool result table, `show`, and one-line errors with exit
codes that say whose fault it was (1: the request was refused, 2: the command line)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.bench.models import Run, Trace
from tests.bench.conftest import bench_sim  # noqa: F401 - the fixture
from tests.bench.helpers import BAD_LINE, GOOD_LINE, MODEL, serving
from tests.cli.test_cli import run

pytestmark = pytest.mark.slow
SAMPLES = Path(__file__).resolve().parents[1] / "bench" / "samples"
FAST = ["--warmup-s", "0.5", "--window-s", "2", "--min-samples", "8", "--lag-limit-ms", "500"]
SLO = ["--ttft-p95-ms", "2000", "--tpot-p95-ms", "200", "--error-rate", "0.05"]
# A run started with --no-wait and then cancelled still measures the level under way (a cancel
# is seen between levels): short levels, so the session's worker is free soon after.
SHORT_LEVELS = ["--warmup-s", "1", "--window-s", "2"]


@pytest.fixture
def oncall_token(make_user) -> str:
    user = make_user("olga", "on-call")
    return token_create_personal(actor=Actor(user=user), name="cli",
                                 scopes=["read", "jobs"]).secret


@pytest.fixture
def sim_pools(celery_worker, bench_sim, make_pool):  # noqa: F811 - the fixture
    return {name: serving(make_pool, name, rate, base_urls=[bench_sim.url(name)])
            for name, rate in (("paced", "39.80"), ("faulty", "31.20"))}


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_traces_are_uploaded_generated_and_listed(live_server, transactional_db, oncall_token):
    uploaded = run(live_server, "bench", "upload", str(SAMPLES / "mooncake_sample.jsonl"),
                   "--name", "moon", token=oncall_token)
    assert uploaded.returncode == 0, uploaded.stderr
    assert re.fullmatch(r"trace moon: \d+ requests over [\d.]+ s \(mooncake\)\n",
                        uploaded.stdout)
    made = run(live_server, "bench", "generate", "--name", "chat", "--n", "300", "--rate", "5",
               "--prompt-tokens", "64-512", "--completion-tokens", "32", "--arrival", "bursty",
               "--burstiness", "0.5", "--json", token=oncall_token)
    assert made.returncode == 0, made.stderr
    body = json.loads(made.stdout)
    assert body["requests"] == 300 and body["generator"]["arrival"]["kind"] == "bursty"
    listed = run(live_server, "bench", "traces", token=oncall_token)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "SOURCE", "REQUESTS"]
    assert any(line.startswith("chat") and "synthetic" in line and "300" in line
               for line in lines)
    assert any(line.startswith("moon") and "mooncake" in line for line in lines)


def test_bench_run_follows_progress_then_prints_each_pools_result(
    live_server, sim_pools, oncall_token
):
    made = run(live_server, "bench", "generate", "--name", "short-chat", "--n", "200",
               "--rate", "50", "--prompt-tokens", "50-150", "--completion-tokens", "16-32",
               "--seed", "7", token=oncall_token)
    assert made.returncode == 0, made.stderr
    # Four levels of ~3 s measured by the worker; generous for a loaded machine.
    done = run(live_server, "bench", "run", "--trace", "short-chat", "--pool", "paced",
               "--pool", "faulty", "--model", MODEL, *SLO, "--levels", "1,4", *FAST,
               token=oncall_token, timeout_s=300)
    assert done.returncode == 0, (done.stdout, done.stderr)
    run_id = Run.objects.get().pk
    # Not a terminal: one progress line per change, the bar and what is measured now.
    assert f"started run {run_id}: {live_server.url}/bench/runs/{run_id}/" in done.stderr
    assert re.search(rf"run {run_id}: running \[[#-]{{20}}\] \d/4 levels · \w+ at "
                     r"concurrency \d", done.stderr), done.stderr
    assert f"run {run_id}: complete [{'#' * 20}] 4/4 levels" in done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["POOL", "HIGHEST"]
    rows = {line.split()[0]: line for line in lines[1:3]}
    assert set(rows) == {"faulty", "paced"}
    for row in rows.values():
        assert re.match(r"\w+\s+4\s+[\d,.]+\s+\w+_p95\s+[\d.]+ USD", row), row
    assert lines[-1] == f"run {run_id}: complete"

    shown = run(live_server, "bench", "show", str(run_id), token=oncall_token)
    assert shown.returncode == 0, shown.stderr
    assert any(line.startswith("status") and line.endswith(" complete")
               for line in shown.stdout.splitlines())
    assert "TTFT p95 ≤ 2000 ms" in shown.stdout
    assert sum(1 for line in shown.stdout.splitlines() if " pass " in line) >= 4
    as_json = json.loads(run(live_server, "bench", "show", str(run_id), "--json",
                             token=oncall_token).stdout)
    assert {r["pool"]: r["best_concurrency"] for r in as_json["results"]} == {
        "faulty": 4, "paced": 4}


def test_no_wait_returns_the_started_run(live_server, transactional_db, make_pool,
                                         oncall_token):
    serving(make_pool, "paced")
    run(live_server, "bench", "generate", "--name", "t", "--n", "20", token=oncall_token)
    started = run(live_server, "bench", "run", "--trace", "t", "--pool", "paced", "--model",
                  MODEL, *SLO, "--max-concurrency", "8", *SHORT_LEVELS, "--no-wait",
                  "--json", token=oncall_token)
    assert started.returncode == 0, started.stderr
    body = json.loads(started.stdout)
    assert body["mode"] == "search" and body["max_concurrency"] == 8
    assert body["status"] in ("queued", "running")  # started: a free worker may have it already
    _cancel(body["id"])  # nobody waits for it: the worker need not measure it to the end


def test_errors_are_one_line_and_exit_codes_say_whose_fault(
    live_server, transactional_db, make_pool, oncall_token, tmp_path
):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(GOOD_LINE + BAD_LINE)
    refused = run(live_server, "bench", "upload", str(bad), "--name", "bad",
                  token=oncall_token)
    assert refused.returncode == 1
    assert one_line(refused) == ("fleetctl: HTTP 400: file: line 2: prompt_tokens must be a "
                                 "positive integer, got -1")
    assert not Trace.objects.exists()

    serving(make_pool, "paced")
    run(live_server, "bench", "generate", "--name", "t", "--n", "20", token=oncall_token)
    unknown = run(live_server, "bench", "run", "--trace", "t", "--pool", "nope", "--model",
                  MODEL, *SLO, token=oncall_token)
    assert unknown.returncode == 1
    assert "No pool named nope" in one_line(unknown)
    slo = run(live_server, "bench", "run", "--trace", "t", "--pool", "paced", "--model", MODEL,
              "--ttft-p95-ms", "0", "--tpot-p95-ms", "200", "--error-rate", "0.9",
              token=oncall_token)
    assert slo.returncode == 1
    assert re.search(r"slo_ttft_p95_ms: .*greater than or equal to 1.*slo_error_rate: ",
                     one_line(slo))
    assert not Run.objects.exists()

    levels = run(live_server, "bench", "run", "--trace", "t", "--pool", "paced", "--model",
                 MODEL, *SLO, "--levels", "1,x", token=oncall_token)
    assert levels.returncode == 2 and "'x' is not a whole number ≥ 1" in levels.stderr
    missing = run(live_server, "bench", "upload", str(tmp_path / "nope.jsonl"), "--name", "n",
                  token=oncall_token)
    assert missing.returncode == 2 and one_line(missing).endswith("nope.jsonl: no such file")
    no_token = run(live_server, "bench", "traces")
    assert no_token.returncode == 2 and "FLEETCTL_TOKEN" in no_token.stderr
    absent = run(live_server, "bench", "show", "999", token=oncall_token)
    assert absent.returncode == 1 and one_line(absent).startswith("fleetctl: HTTP 404")


def test_bench_run_with_speeds_replays_at_trace_timing(live_server, sim_pools, oncall_token):
    made = run(live_server, "bench", "generate", "--name", "short-chat", "--n", "200",
               "--rate", "50", "--prompt-tokens", "50-150", "--completion-tokens", "16-32",
               "--seed", "7", token=oncall_token)
    assert made.returncode == 0, made.stderr
    done = run(live_server, "bench", "run", "--trace", "short-chat", "--pool", "paced",
               "--model", MODEL, *SLO, "--speeds", "0.5,2", *FAST, token=oncall_token,
               timeout_s=300)
    assert done.returncode == 0, (done.stdout, done.stderr)
    run_id = Run.objects.get().pk
    assert re.search(rf"run {run_id}: running \[[#-]{{20}}\] \d/2 levels · paced at "
                     r"trace speed (0\.5|2)×", done.stderr), done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["POOL", "HIGHEST", "PASSING", "SPEED"]
    # The verdicts depend on how busy the machine is; the shape of the answer does not.
    assert re.match(r"paced\s+(2×|0\.5×|—)\s+", lines[1]), lines[1]
    shown = run(live_server, "bench", "show", str(run_id), token=oncall_token)
    assert shown.returncode == 0, shown.stderr
    assert "trace timing at speeds 0.5×, 2×" in shown.stdout
    measured = [line for line in shown.stdout.splitlines()
                if re.match(r"paced\s+(0\.5|2)×\s+(pass|fail|insufficient|invalid) ", line)]
    # Both speeds, unless the first was invalid (a busy test machine): then the note says so.
    assert len(measured) == 2 or "not measured: 2×" in shown.stdout, shown.stdout


def test_bad_speeds_are_command_line_errors(live_server, transactional_db, make_pool,
                                            oncall_token):
    serving(make_pool, "paced")
    for speeds, says in (("1,x", "'x' is not a speed"), ("0.5,-1", "'-1' is not a speed")):
        bad = run(live_server, "bench", "run", "--trace", "t", "--pool", "paced", "--model",
                  MODEL, *SLO, "--speeds", speeds, token=oncall_token)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr
    both = run(live_server, "bench", "run", "--trace", "t", "--pool", "paced", "--model",
               MODEL, *SLO, "--speeds", "1", "--levels", "1,4", token=oncall_token)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    run(live_server, "bench", "generate", "--name", "t", "--n", "20", token=oncall_token)
    started = run(live_server, "bench", "run", "--trace", "t", "--pool", "paced", "--model",
                  MODEL, *SLO, "--speeds", "0.5,2", *SHORT_LEVELS, "--no-wait", "--json",
                  token=oncall_token)
    assert started.returncode == 0, started.stderr
    body = json.loads(started.stdout)
    assert body["timing"] == "trace" and body["speeds"] == [0.5, 2.0]
    assert not Run.objects.exclude(pk=body["id"]).exists()
    _cancel(body["id"])


def _cancel(run_id: int) -> None:
    from fleetctl.bench.services import run_cancel

    run_cancel(actor=Actor.for_system("test"), run=Run.objects.get(pk=run_id))
