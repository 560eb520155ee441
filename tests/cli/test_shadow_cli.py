"""`fleetctl shadow start | status | stop | list | export`, run as real processes against a
live server."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from fleetctl.accounts.services import token_create_personal
from fleetctl.shadow import live, services
from fleetctl.shadow.api.exports import CSV_COLUMNS
from fleetctl.shadow.models import ShadowRun
from fleetctl.traffic.models import Route
from tests.cli.test_cli import run
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.shadow.test_api import _clean_redis, _pair  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


@pytest.fixture
def tokens(transactional_db, world: World) -> dict[str, str]:  # noqa: F811
    world.plan()

    def issue(who: str, scopes: list[str]) -> str:
        return token_create_personal(actor=world.actor(who), name="cli", scopes=scopes).secret

    return {"lead": issue("lead", ["read", "jobs"]), "oncall": issue("oncall", ["read", "jobs"]),
            "viewer": issue("viewer", ["read"])}


def test_start_status_list_export_and_stop(live_server, tokens, tmp_path: Path):
    started = run(live_server, "shadow", "start", "--plan", "mi300x-llama", "--percent", "20",
                  "--max-rps", "3", "--content", "off", "--min-pairs", "10",
                  token=tokens["lead"])
    assert started.returncode == 0, started.stderr
    shadow = ShadowRun.objects.get()
    assert f"started shadow run {shadow.pk}: " in started.stderr
    assert f"/shadow/runs/{shadow.pk}/" in started.stderr
    assert "running" in started.stdout and "route llama" in started.stdout
    assert (shadow.sample_percent, shadow.max_rps, shadow.content, shadow.min_pairs) == (
        20, 3, "off", 10)
    assert Route.objects.get(name="llama").mirror_percent == 20

    live.count(shadow.pk, received=100, sampled=20, dropped_rate=5, pairs=2,
               refused_unauthenticated=7)
    _pair(shadow, 1)
    _pair(shadow, 2, diverged=True, score=0.5, error="@SUM(A1)")
    status = run(live_server, "shadow", "status", "--plan", "mi300x-llama",
                 token=tokens["viewer"])
    assert status.returncode == 0, status.stderr
    assert "100 received, 20 sampled, 2 pairs" in status.stdout
    assert "5 rate" in status.stdout
    assert "refused, not from a gateway of the route: 7" in status.stdout
    assert "not judged yet" in status.stdout
    as_json = json.loads(run(live_server, "shadow", "status", str(shadow.pk), "--json",
                             token=tokens["viewer"]).stdout)
    assert as_json["id"] == shadow.pk and as_json["counters"]["received"] == 100

    listed = run(live_server, "shadow", "list", "--status", "running", token=tokens["viewer"])
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:4] == [str(shadow.pk), "mi300x-llama", "mirror", "llama"]
               for line in listed.stdout.splitlines())

    target = tmp_path / "pairs.csv"
    exported = run(live_server, "shadow", "export", str(shadow.pk), "--format", "csv", "-o",
                   str(target), token=tokens["viewer"])
    assert exported.returncode == 0, exported.stderr
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    assert list(rows[0]) == CSV_COLUMNS and len(rows) == 2
    assert rows[1]["candidate_error_text"] == "'@SUM(A1)"
    as_json_export = run(live_server, "shadow", "export", str(shadow.pk), "--format", "json",
                         token=tokens["viewer"])
    assert len(json.loads(as_json_export.stdout)["pairs"]) == 2

    services.run_judge(run=shadow)
    judged = run(live_server, "shadow", "status", str(shadow.pk), token=tokens["viewer"])
    assert judged.returncode == 0, judged.stderr
    assert "over 2 pairs" in judged.stdout and "insufficient" in judged.stdout
    header = next(line for line in judged.stdout.splitlines() if line.startswith("METRIC"))
    assert header.split()[:4] == ["METRIC", "GATED", "N", "NOISE"]
    divergence = next(line for line in judged.stdout.splitlines()
                      if line.startswith("divergence "))
    assert divergence.split()[:5] == ["divergence", "yes", "2", "0.00%", "50.00%"]

    refused = run(live_server, "shadow", "stop", "--plan", "mi300x-llama", "--reason", "x",
                  token=tokens["viewer"])
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr
    stopped = run(live_server, "shadow", "stop", "--plan", "mi300x-llama", "--reason",
                  "candidate pages at night", token=tokens["oncall"])
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped shadow run {shadow.pk}" in stopped.stdout
    shadow.refresh_from_db()
    assert (shadow.status, shadow.stop_reason) == ("stopped", "candidate pages at night")
    assert Route.objects.get(name="llama").mirror_percent == 0
    none_running = run(live_server, "shadow", "stop", "--plan", "mi300x-llama", "--reason",
                       "again", token=tokens["oncall"])
    assert none_running.returncode == 1
    assert "Plan mi300x-llama has no running shadow run" in none_running.stderr


def test_bad_input_is_refused_with_a_message(live_server, tokens):
    unknown = run(live_server, "shadow", "start", "--plan", "nope", token=tokens["lead"])
    assert unknown.returncode == 1 and "No plan named nope" in unknown.stderr
    replay = run(live_server, "shadow", "start", "--plan", "mi300x-llama", "--mode", "replay",
                 token=tokens["lead"])
    assert replay.returncode == 1 and "trace" in replay.stderr
    viewer = run(live_server, "shadow", "start", "--plan", "mi300x-llama",
                 token=tokens["viewer"])
    assert viewer.returncode == 1 and "HTTP 403" in viewer.stderr
    percent = run(live_server, "shadow", "start", "--plan", "mi300x-llama", "--percent", "0",
                  token=tokens["lead"])
    assert percent.returncode == 2 and "from 0.01 to 100" in percent.stderr
    which = run(live_server, "shadow", "status", token=tokens["viewer"])
    assert which.returncode == 2 and "RUN --plan is required" in which.stderr
    no_reason = run(live_server, "shadow", "stop", "1", token=tokens["oncall"])
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    bad_id = run(live_server, "shadow", "status", "zero", token=tokens["viewer"])
    assert bad_id.returncode == 2 and "is not a run id" in bad_id.stderr
    missing = run(live_server, "shadow", "status", "999999", token=tokens["viewer"])
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    nothing = run(live_server, "shadow", "status", "--plan", "mi300x-llama",
                  token=tokens["viewer"])
    assert nothing.returncode == 1 and "has no shadow run yet" in nothing.stderr
    assert not ShadowRun.objects.exists()
