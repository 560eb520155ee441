"""`fleetctl conformance run | show | list`, run as real processes against a live server and
a real worker probing simulated pools."""

from __future__ import annotations

import json

import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.conformance.models import ConformanceRun
from tests.cli.test_cli import run

pytestmark = pytest.mark.slow


@pytest.fixture
def oncall_token(make_user) -> str:
    user = make_user("olga", "on-call")
    return token_create_personal(actor=Actor(user=user), name="cli",
                                 scopes=["read", "jobs"]).secret


def test_run_waits_for_the_verdict_and_shows_the_cases_side_by_side(
        live_server, celery_worker, sim_pool, oncall_token):
    sim_pool("a100-legacy", "legacy")
    sim_pool("h200-ref", "good")
    probed = run(live_server, "conformance", "run", "--pool", "a100-legacy", "--primary",
                 "h200-ref", "--wait", token=oncall_token, timeout_s=180)
    assert probed.returncode == 3, probed.stderr  # a required case fails
    assert "started conformance run" in probed.stderr
    out = probed.stdout
    assert "verdict" in out and "fail" in out
    assert "required failing: tools, tool_choice required (no tool_calls)" in out
    header = next(line for line in out.splitlines() if line.startswith("CASE"))
    assert header.split()[:4] == ["CASE", "REQ", "A100-LEGACY", "H200-REF"]
    tools = next(line for line in out.splitlines() if line.startswith("tools.required"))
    assert "fail: no tool_calls" in tools and tools.rstrip().endswith("pass")
    run_id = ConformanceRun.objects.get().pk

    shown = run(live_server, "conformance", "show", str(run_id), token=oncall_token)
    assert shown.returncode == 0, shown.stderr
    assert "parity.prompt_tokens" in shown.stdout
    as_json = json.loads(run(live_server, "conformance", "show", str(run_id), "--json",
                             token=oncall_token).stdout)
    assert as_json["verdict"] == "fail" and len(as_json["cases"]) > 20

    listed = run(live_server, "conformance", "list", "--verdict", "fail", token=oncall_token)
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:2] == [str(run_id), "a100-legacy"]
               for line in listed.stdout.splitlines())

    passing = run(live_server, "conformance", "run", "--pool", "h200-ref", "--wait",
                  token=oncall_token, timeout_s=180)
    assert passing.returncode == 0, passing.stdout + passing.stderr


def test_bad_input_is_refused_with_a_message(live_server, transactional_db, sim_pool,
                                             oncall_token):
    sim_pool("a100-legacy", "legacy")
    unknown = run(live_server, "conformance", "run", "--pool", "nope", token=oncall_token)
    assert unknown.returncode == 1 and "No pool named nope" in unknown.stderr
    bad_id = run(live_server, "conformance", "show", "zero", token=oncall_token)
    assert bad_id.returncode == 2 and "is not a run id" in bad_id.stderr
    bad_case = run(live_server, "conformance", "run", "--pool", "a100-legacy", "--require",
                   "tools.nope", token=oncall_token)
    assert bad_case.returncode == 1 and "No case tools.nope" in bad_case.stderr
    assert not ConformanceRun.objects.exists()
