"""End to end, all real: simulated pools, Envoy gateways, the Celery worker that pushes, and
the REST API an on-call engineer (or the CLI) uses. Which pool served a request is read from
the pools' own counters, never from the gateway."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.services import pool_health_record, pool_model_create, region_create
from fleetctl.traffic.models import Drain, Gateway, GatewayPush
from fleetctl.traffic.services import gateway_create, route_create
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
MODEL = "llama-3.1-8b-instruct"
# Long enough (~8 s at 2 ms a token; the profile allows 4,096) to outlast a drain's push and
# verify on a loaded machine: the test checks the stream is still open after the next
# requests (and `served` counts running requests too, so its end cannot skew the count).
STREAM_TOKENS = 4000


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("drain-sims"), TEST_PROFILES,
                            dict.fromkeys(("us-primary", "us-cand", "eu-only"), "quick"),
                            models=[MODEL])
    yield sim
    sim.stop()


@pytest.fixture
def envoys(tmp_path: Path) -> Iterator[list[EnvoyProcess]]:
    started = [EnvoyProcess(tmp_path / f"envoy-{i}", free_port(), free_port()).start()
               for i in range(2)]
    yield started
    for envoy in started:
        envoy.stop()


def served(sims: SimProcess, pool: str) -> int:
    """Requests that reached the pool: finished, running or waiting (one scrape, so a
    stream that ends between two reads is counted in both)."""
    text = httpx.get(f"{sims.url(pool)}/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:request_success":
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
        elif family.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            total += sum(s.value for s in family.samples)
    return int(total)


@pytest.fixture
def fleet(celery_worker, sims, envoys, make_pool, region, system):
    eu = region_create(actor=system, code="eu-west", name="EU West", jurisdiction="EU")
    pools = {
        "us-primary": make_pool(name="us-primary", base_urls=[sims.url("us-primary")]),
        "us-cand": make_pool(name="us-cand", runtime="rocm", base_urls=[sims.url("us-cand")]),
        "eu-only": make_pool(name="eu-only", region=eu, base_urls=[sims.url("eu-only")]),
    }
    for pool in pools.values():
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = route_create(actor=system, name="llama", model_id=MODEL,
                         primary_pool=pools["us-primary"],
                         weights={"us-primary": 50, "us-cand": 50}, reason="test")
    pinned = route_create(actor=system, name="llama-eu", model_id=MODEL, residency="EU",
                          primary_pool=pools["eu-only"], reason="test")
    gateways = [
        gateway_create(actor=system, name=f"envoy-{i}", kind="envoy",
                       admin_address=envoy.admin_url,
                       options={"config_dir": str(envoy.workdir)}, routes=[route, pinned])
        for i, envoy in enumerate(envoys)
    ]
    wait_until(lambda: not GatewayPush.objects.exclude(status="verified").exclude(
        status="superseded").exists(), timeout_s=30, what="the first pushes to verify")
    return {"pools": pools, "route": route, "gateways": gateways}


def _client(envoy: EnvoyProcess, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{envoy.listen_url}/v1", api_key="x", max_retries=0,
                         default_headers=headers or None, timeout=30)


def _ask(client: openai.OpenAI, max_tokens: int = 4) -> str:
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens)
    return answer.choices[0].message.content or ""


def test_the_split_is_observed_through_every_gateway(fleet, sims, envoys):
    before = {p: served(sims, p) for p in ("us-primary", "us-cand")}
    for envoy in envoys:
        client = _client(envoy)
        for _ in range(100):
            _ask(client)
    got = {p: served(sims, p) - before[p] for p in before}
    assert sum(got.values()) == 200
    # 50/50 over 200 requests: 4 sigma is ±28.
    assert abs(got["us-cand"] - 100) <= 28, got


def test_a_drain_takes_effect_for_the_next_request_and_lets_streams_finish(
    fleet, sims, envoys, client_for
):
    oncall = client_for("on-call", username="olga")
    oncall.post("/api/v1/routes/llama/revisions/", {
        "weights": {"us-cand": 100}, "base_revision": 1, "reason": "all on candidate"},
        format="json")
    wait_until(lambda: not GatewayPush.objects.filter(status__in=["pending", "retrying"])
               .exists(), what="the ramp to verify")
    stream_result: dict[str, object] = {}
    first_token = threading.Event()

    def long_stream() -> None:
        chunks = 0
        try:
            stream = _client(envoys[0]).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "tell me everything"}],
                max_tokens=STREAM_TOKENS, stream=True, extra_body={"ignore_eos": True})
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    chunks += 1
                    first_token.set()
        except Exception as exc:  # said by the wait below, which then fails
            stream_result["error"] = repr(exc)
        stream_result["chunks"] = chunks

    streaming = threading.Thread(target=long_stream)
    streaming.start()
    wait_until(first_token.is_set, timeout_s=60, what="the stream's first token from us-cand",
               explain=lambda: f"stream so far: {stream_result}")
    response = oncall.post("/api/v1/drains/", {"pool": "us-cand", "reason": "test drain"},
                           format="json")
    assert response.status_code == 202, response.json()
    drain_id = response.json()["id"]
    wait_until(lambda: Drain.objects.get(pk=drain_id).verified_at is not None,
               what="every gateway to verify the drain")
    before = served(sims, "us-cand")
    for envoy in envoys:
        _ask(_client(envoy))  # the very next requests
    assert served(sims, "us-cand") == before  # nothing new reached the drained pool
    drain = Drain.objects.get(pk=drain_id)
    assert drain.in_flight_zero_at is None  # the stream is still open
    streaming.join(timeout=30)
    assert stream_result["chunks"] == STREAM_TOKENS  # the in-flight stream finished whole
    wait_until(lambda: Drain.objects.get(pk=drain_id).status == "complete",
               what="the drain to complete")
    record = oncall.get(f"/api/v1/drains/{drain_id}/").json()
    assert record["drained_pools"] == ["us-cand"]
    assert {g["gateway"] for g in record["gateways"] if g["status"] == "verified"} == {
        "envoy-0", "envoy-1"}
    assert record["verified_ms"] <= record["duration_ms"]
    assert record["in_flight_zero_at"] >= record["verified_at"]

    restore = oncall.post(f"/api/v1/drains/{drain_id}/restore/", {"reason": "back"},
                          format="json")
    assert restore.status_code == 202
    wait_until(lambda: Drain.objects.get(pk=restore.json()["id"]).status == "complete",
               what="the restore to complete")
    before = served(sims, "us-cand")  # now counting the finished stream too
    _ask(_client(envoys[1]))
    assert served(sims, "us-cand") == before + 1  # back on the candidate


def test_pinned_traffic_never_crosses_the_border(fleet, sims, envoys, client_for):
    eu_before = served(sims, "eu-only")
    us_before = served(sims, "us-primary") + served(sims, "us-cand")
    _ask(_client(envoys[0], **{"x-fleetctl-residency": "EU"}))
    assert served(sims, "eu-only") == eu_before + 1
    with pytest.raises(openai.PermissionDeniedError):
        _ask(_client(envoys[0], **{"x-fleetctl-residency": "IN"}))
    # Draining the only EU pool leaves the pinned route empty: it answers an error instead
    # of falling back to the US primary.
    oncall = client_for("on-call")
    drained = oncall.post("/api/v1/drains/", {"pool": "eu-only", "reason": "eu outage"},
                          format="json").json()
    wait_until(lambda: Drain.objects.get(pk=drained["id"]).status == "complete",
               what="the EU drain")
    with pytest.raises(openai.APIStatusError) as refused:
        _ask(_client(envoys[1], **{"x-fleetctl-residency": "EU"}))
    assert refused.value.status_code == 503
    assert served(sims, "us-primary") + served(sims, "us-cand") == us_before


def test_a_gateway_down_during_a_drain_shows_partial_then_completes_when_back(
    fleet, envoys, client_for
):
    envoys[1].stop()
    oncall = client_for("on-call")
    drain_id = oncall.post("/api/v1/drains/", {"route": "llama", "reason": "gateway test"},
                           format="json").json()["id"]
    wait_until(lambda: Drain.objects.get(pk=drain_id).status == "partial",
               what="the drain to show partial")
    assert Gateway.objects.get(name="envoy-1").state == "failing"
    assert "envoy-1" in Drain.objects.get(pk=drain_id).last_error
    envoys[1].start()
    wait_until(lambda: Drain.objects.get(pk=drain_id).status == "complete", timeout_s=40,
               what="the drain to complete once the gateway is back")
    assert Gateway.objects.get(name="envoy-1").state == "in-sync"


def test_a_restarted_gateway_is_reconciled(fleet, envoys):
    from fleetctl.traffic.tasks import reconcile

    envoys[0].stop()
    envoys[0].forget_configuration()
    envoys[0].start()
    assert reconcile() == 1  # drift found, push queued
    wait_until(lambda: not GatewayPush.objects.filter(reason="reconcile").exclude(
        status="verified").exists(), what="the reconcile push")
    assert reconcile() == 0
    _ask(_client(envoys[0]))


def test_the_drain_answer_already_carries_every_gateway_verified(fleet, client_for):
    """The first push attempt is made by the request itself, right after the commit: the
    answer says which gateways verified, without waiting for a queue or a watcher."""
    body = client_for("on-call").post("/api/v1/drains/", {"route": "llama", "reason": "x"},
                                      format="json").json()
    assert body["status"] == "verified", body
    assert body["verified_at"] is not None
    assert {g["gateway"]: g["status"] for g in body["gateways"]} == {
        "envoy-0": "verified", "envoy-1": "verified"}
    assert all(g["attempts"] == 1 for g in body["gateways"])


@pytest.fixture
def silent_admin() -> Iterator[str]:
    """An admin address that accepts connections and never answers (a hung gateway): the
    kernel completes the handshake for a listening socket nobody accepts on."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_a_hung_gateway_does_not_hold_the_drain_answer_past_the_budget(
    fleet, client_for, silent_admin, settings, system, tmp_path
):
    settings.TRAFFIC_INLINE_PUSH_BUDGET_S = 0.3
    hung = gateway_create(actor=system, name="hung", kind="envoy", admin_address=silent_admin,
                          options={"config_dir": str(tmp_path), "admin_timeout_s": 3},
                          routes=[fleet["route"]])
    started = time.monotonic()
    body = client_for("on-call").post("/api/v1/drains/", {"route": "llama", "reason": "x"},
                                      format="json").json()
    # Answered before the hung gateway's first admin call could even time out (3 s).
    assert time.monotonic() - started < 2.5
    assert body["status"] == "pushing"
    states = {g["gateway"]: g["status"] for g in body["gateways"]}
    assert states == {"envoy-0": "verified", "envoy-1": "verified", "hung": "pending"}
    # The late attempt records itself from its thread when it times out, then retries.
    drain = Drain.objects.get(pk=body["id"])
    push = GatewayPush.objects.get(gateway=hung, revision__in=drain.revisions.all())
    first = wait_until(lambda: push.attempt_rows.filter(number=1).first(), timeout_s=15,
                       what="the hung gateway's attempt to be recorded")
    assert "timed out" in first.error
    wait_until(lambda: GatewayPush.objects.get(pk=push.pk).status == "retrying",
               what="the push to retry")
    assert Gateway.objects.get(pk=hung.pk).state == "failing"
    wait_until(lambda: Drain.objects.get(pk=drain.pk).status == "partial",
               what="the watcher to show the drain partial")


def test_converge_attempts_a_push_nobody_attempted(fleet, system):
    """A push whose first attempt was lost with its process (stored, never attempted) is
    attempted by the converge task, even when the gateway already holds the state."""
    from datetime import timedelta

    from django.utils import timezone

    from fleetctl.traffic.push import ORPHAN_PUSH_AFTER_S
    from fleetctl.traffic.selectors import revision_current
    from fleetctl.traffic.tasks import converge

    gateway = fleet["gateways"][0]
    orphan = GatewayPush.objects.create(
        revision=revision_current(route=fleet["route"]), gateway=gateway, reason="revision",
        created_at=timezone.now() - timedelta(seconds=ORPHAN_PUSH_AFTER_S + 1))
    fresh = GatewayPush.objects.create(revision=orphan.revision, gateway=fleet["gateways"][1],
                                       reason="revision")
    assert converge() == 1
    wait_until(lambda: GatewayPush.objects.get(pk=orphan.pk).status == "verified",
               what="the orphaned push to be attempted")
    # Too young to be called orphaned: its own first attempt may still be on its way.
    assert GatewayPush.objects.get(pk=fresh.pk).attempts == 0
