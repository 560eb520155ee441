"""`fleetctl ramp start|status|pause|resume|skip|abort`, `fleetctl split` and the old
`fleetctl ramp --weights`, run as real processes against a live server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.cli.client import ApiClient
from fleetctl.core.models import IdempotentRequest
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.ramps import services as ramps
from fleetctl.ramps.models import Ramp
from fleetctl.traffic import services
from fleetctl.traffic.models import Route
from tests.conftest import SYSTEM
from tests.support.waiting import wait_until

MODEL = "llama-3.1-8b-instruct"
SLO = ["--slo-ttft-ms", "800", "--slo-tpot-ms", "60", "--slo-error-rate", "0.01"]


def _env(live_server, token: str) -> dict[str, str]:
    return dict(os.environ, FLEETCTL_URL=live_server.url, FLEETCTL_TOKEN=token)


def run(live_server, token: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl.cli", *argv],
                          env=_env(live_server, token), capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def fleet(transactional_db, make_pool) -> Route:
    pools = [make_pool(name="h200"), make_pool(name="mi300x", runtime="rocm")]
    for pool in pools:
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return services.route_create(actor=SYSTEM, name="llama", model_id=MODEL,
                                 primary_pool=pools[0])


@pytest.fixture
def token(make_user) -> str:
    user = make_user("olga", "on-call")
    return token_create_personal(actor=Actor(user=user), name="cli",
                                 scopes=["read", "ramp", "drain"]).secret


@pytest.mark.slow
def test_a_ramp_started_read_paused_resumed_and_aborted_from_the_cli(live_server, fleet,
                                                                     token):
    started = run(live_server, token, "ramp", "start", "--route", "llama", "--pool", "mi300x",
                  "--steps", "1:60,5:60,10:120", "--min-samples", "20", *SLO,
                  "--reason", "canary")
    assert started.returncode == 0, started.stderr
    ramp = Ramp.objects.get()
    assert started.stdout.strip() == (f"ramp {ramp.pk} of mi300x on llama: running, no step "
                                      f"set yet")
    assert ramp.steps == [{"percent": 1.0, "hold_s": 60.0}, {"percent": 5.0, "hold_s": 60.0},
                          {"percent": 10.0, "hold_s": 120.0}] and ramp.min_samples == 20
    ramps.ramps_tick(only=ramp.pk)  # the controller's first tick: step 1

    status = run(live_server, token, "ramp", "status", str(ramp.pk))
    assert status.returncode == 0, status.stderr
    out = status.stdout
    assert "step 1/3 at 1 %" in out and "TTFT p95 ≤ 800 ms" in out
    assert "holding" in out and "pending" in out  # step 1 holds, 2 and 3 wait
    assert "guard now: wait" in out and "candidate mi300x" in out
    assert "timeline:" in out and " start " in out and " step " in out
    by_route = run(live_server, token, "ramp", "status", "--route", "llama", "--json")
    assert json.loads(by_route.stdout)["id"] == ramp.pk
    listed = run(live_server, token, "ramp", "status")
    assert listed.stdout.splitlines()[1].split()[:4] == [str(ramp.pk), "llama", "mi300x",
                                                         "running"]

    paused = run(live_server, token, "ramp", "pause", str(ramp.pk), "--reason", "look")
    assert paused.returncode == 0 and ": paused" in paused.stdout
    twice = run(live_server, token, "ramp", "pause", str(ramp.pk), "--reason", "again")
    assert twice.returncode == 1 and twice.stderr.startswith("fleetctl: HTTP 409")
    resumed = run(live_server, token, "ramp", "resume", str(ramp.pk), "--reason", "ok")
    assert resumed.returncode == 0 and ": running" in resumed.stdout
    aborted = run(live_server, token, "ramp", "abort", str(ramp.pk), "--reason", "stop")
    assert aborted.returncode == 0, aborted.stderr
    assert ": aborted" in aborted.stdout and "drain " in aborted.stdout
    no_reason = run(live_server, token, "ramp", "abort", str(ramp.pk))
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    # Every change was sent with its own Idempotency-Key.
    assert IdempotentRequest.objects.filter(principal__startswith="token:").count() == 5


@pytest.mark.slow
def test_start_wait_follows_the_ramp_and_exits_4_when_it_is_paused(live_server, fleet, token):
    follower = subprocess.Popen(
        [sys.executable, "-m", "fleetctl.cli", "ramp", "start", "--route", "llama", "--pool",
         "mi300x", "--steps", "5:60", *SLO, "--wait"], env=_env(live_server, token),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ramp = wait_until(lambda: Ramp.objects.first(), timeout_s=30, what="the ramp")
        ramps.ramps_tick(only=ramp.pk)
        ramps.ramp_pause(actor=SYSTEM, ramp=ramp, reason="a person looks")
        stdout, stderr = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 4, stderr
    assert "paused" in stdout and "a person looks" in stderr


@pytest.mark.slow
def test_the_old_ramp_weights_form_and_split_set_a_split_at_once(live_server, fleet, token):
    old = run(live_server, token, "ramp", "--route", "llama", "--weights", "h200=90,mi300x=10",
              "--reason", "canary")
    assert old.returncode == 0, old.stderr
    assert old.stdout.strip() == "llama r2: h200 90 %, mi300x 10 %"
    split = run(live_server, token, "split", "--route", "llama", "--weights",
                "h200=80,mi300x=20", "--reason", "more", "--wait-verified")
    assert split.returncode == 0, split.stderr
    assert "llama r3: h200 80 %, mi300x 20 %" in split.stdout
    assert "verified on every gateway" in split.stdout  # it has none: nothing to wait for
    same = run(live_server, token, "split", "--route", "llama", "--weights",
               "h200=80,mi300x=20", "--reason", "again")
    assert same.returncode == 0 and "r3" in same.stdout and "unchanged" in same.stdout
    assert Route.objects.get().revision_number == 3
    incomplete = run(live_server, token, "ramp", "--route", "llama")
    assert incomplete.returncode == 2 and "--weights" in incomplete.stderr


@pytest.mark.parametrize("steps", ["5", "5:60,x:60", "10:60,5:60", "0:60", "5:-1", "5:60,5:60"])
def test_bad_steps_are_a_usage_error(steps):
    result = subprocess.run([sys.executable, "-m", "fleetctl.cli", "ramp", "start", "--route",
                             "llama", "--pool", "mi300x", "--steps", steps],
                            env=dict(os.environ, FLEETCTL_TOKEN="fct_unused"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "argument --steps" in result.stderr and "Traceback" not in result.stderr


def test_a_lost_answer_is_retried_with_the_same_idempotency_key(monkeypatch):
    """The server's side of a key is tested in tests/api; here the client's: a timeout and
    a 503 are retried, each time with the key of the first attempt."""
    monkeypatch.setattr("fleetctl.cli.client.RETRY_DELAYS_S", (0.0, 0.0, 0.0))
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Idempotency-Key"])
        if len(seen) == 1:
            raise httpx.ReadTimeout("lost", request=request)
        if len(seen) == 2:
            return httpx.Response(503, json={"error": {"code": "x", "message": "busy"}})
        return httpx.Response(201, json={"number": 2})

    client = ApiClient("http://fleetctl.test", "fct_x")
    client._http = httpx.Client(base_url="http://fleetctl.test",
                                transport=httpx.MockTransport(answer))
    assert client.post("/api/v1/drains/", {"route": "r"}, idempotent=True) == {"number": 2}
    assert len(seen) == 3 and len(set(seen)) == 1
    # A new change is a new key.
    client.post("/api/v1/drains/", {"route": "r"}, idempotent=True)
    assert len(set(seen)) == 2


@pytest.mark.slow
def test_drain_wait_verified_and_telemetry_without_data(live_server, fleet, token):
    assert run(live_server, token, "split", "--route", "llama", "--weights",
               "h200=90,mi300x=10", "--reason", "canary").returncode == 0
    drained = run(live_server, token, "drain", "--route", "llama", "--reason", "incident",
                  "--wait-verified", "--verify-timeout", "5", "--no-wait")
    assert drained.returncode == 0, drained.stderr
    assert "verified on every gateway" in drained.stderr  # no gateway: nothing to wait for
    figures = run(live_server, token, "telemetry")
    assert figures.returncode == 0, figures.stderr
    # Missing data is said, never shown as zero latency.
    assert "h200: 0 requests" in figures.stdout and "mi300x: 0 requests" in figures.stdout
    assert "TTFT p95" in figures.stdout and "no data (n=0)" in figures.stdout
    routed = run(live_server, token, "telemetry", "--route", "llama", "--json")
    assert routed.returncode == 0, routed.stderr
    assert [(s["pool"], s["route"], s["requests"]) for s in json.loads(routed.stdout)] == [
        ("h200", "llama", 0)]  # the drained split names the primary only


@pytest.mark.slow
def test_drain_force_from_the_cli_is_recorded_forced(live_server, fleet, token):
    assert run(live_server, token, "split", "--route", "llama", "--weights",
               "h200=90,mi300x=10", "--reason", "canary").returncode == 0
    drained = run(live_server, token, "drain", "--route", "llama", "--reason", "on fire",
                  "--force", "--no-wait")
    assert drained.returncode == 0, drained.stderr
    # No gateway sample here: the load is unknown, and the record says it was forced anyway.
    assert "capacity: forced: llama: forced: moved at once to the primary" in drained.stdout
    assert "load unknown: no gateway sampled mi300x" in drained.stdout
