"""Faults on demand: error rate, added latency, slowdown and hard down — through the admin
API and through `fleetctl sim fault`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from fleetctl.sim.faults import MODEL_REVISION, SERVER_VERSION

from .simproc import MODEL, SimProcess, client, run_cli

pytestmark = pytest.mark.slow

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "are you there?"}]


@pytest.fixture
def faulty(fleet: SimProcess) -> Iterator[str]:
    """The pool that takes faults; always reset afterwards."""
    url = fleet.url("faulty")
    yield url
    httpx.post(f"{url}/admin/reset").raise_for_status()


def set_faults(url: str, **faults: Any) -> dict[str, Any]:
    response = httpx.post(f"{url}/admin/faults", json=faults)
    assert response.status_code == 200, response.text
    return response.json()["faults"]


def ask(url: str, max_tokens: int = 3, **kwargs: Any) -> str:
    reply = client(url).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=max_tokens, **kwargs
    )
    return reply.choices[0].message.content or ""


def ttft(url: str) -> float:
    started = time.monotonic()
    for chunk in client(url).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            return time.monotonic() - started
    raise AssertionError("no token streamed")


def test_error_rate_one_fails_every_request_with_a_500_until_reset(faulty: str) -> None:
    assert set_faults(faulty, error_rate=1.0)["error_rate"] == 1.0
    for _ in range(5):
        with pytest.raises(openai.InternalServerError) as caught:
            ask(faulty)
        assert caught.value.status_code == 500
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["type"] == "server_error"
    assert httpx.get(f"{faulty}/health").status_code == 200  # erroring, not down
    httpx.post(f"{faulty}/admin/reset").raise_for_status()
    assert ask(faulty)


def test_a_partial_error_rate_fails_about_that_share(faulty: str) -> None:
    set_faults(faulty, error_rate=0.5)
    failures = 0
    for _ in range(60):
        try:
            ask(faulty, max_tokens=1)
        except openai.InternalServerError:
            failures += 1
    assert 10 <= failures <= 50  # binomial(60, 0.5): mean 30, sd 3.9


def test_a_down_pool_answers_503_aborts_streams_and_recovers(faulty: str) -> None:
    outcome: dict[str, Any] = {}
    first_token = threading.Event()

    def long_stream() -> None:
        try:
            stream = client(faulty).chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=3000, stream=True,
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first_token.set()
            outcome["ended"] = "normally"
        except openai.APIError as exc:
            outcome["ended"] = "error"
            outcome["message"] = exc.message

    reader = threading.Thread(target=long_stream)
    reader.start()
    assert first_token.wait(10)
    set_faults(faulty, down=True)
    reader.join(5)
    assert not reader.is_alive()
    assert outcome["ended"] == "error"
    assert "down" in outcome["message"]

    assert httpx.get(f"{faulty}/health").status_code == 503
    with pytest.raises(openai.InternalServerError) as caught:
        ask(faulty)
    assert caught.value.status_code == 503
    assert caught.value.code == "service_unavailable"
    assert httpx.get(f"{faulty}/v1/models").status_code == 503

    set_faults(faulty, down=False)
    assert httpx.get(f"{faulty}/health").status_code == 200
    assert ask(faulty)


def test_added_latency_delays_the_first_token(faulty: str) -> None:
    # Scheduling noise on a busy machine only ever adds time, so the fastest of a few
    # requests is the honest estimate of each; the fault's 150 ms is a floor under it.
    before = min(ttft(faulty) for _ in range(5))
    set_faults(faulty, added_latency_ms=150)
    during = min(ttft(faulty) for _ in range(5))
    assert during >= 0.15
    assert 0.1 <= during - before < 0.3


def test_slowdown_stretches_every_decode_step(faulty: str) -> None:
    def generation_time() -> float:
        started = time.monotonic()
        ask(faulty, max_tokens=60, extra_body={"ignore_eos": True})
        return time.monotonic() - started

    normal = generation_time()
    set_faults(faulty, slowdown=4.0)
    slowed = generation_time()
    assert slowed > 2.5 * normal


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"error_rate": 1.5}, "error_rate"),
        ({"error_rate": "high"}, "error_rate"),
        ({"added_latency_ms": -1}, "added_latency_ms"),
        ({"slowdown": 0.5}, "slowdown"),
        ({"down": "yes"}, "down"),
        ({"down": 1}, "down"),
        ({"meltdown": True}, "meltdown"),
        ({"server_version": ""}, "server_version"),
        ({"server_version": "0.9 beta"}, "server_version"),
        ({"server_version": 9}, "server_version"),
        ([1], None),
    ],
)
def test_invalid_fault_settings_are_refused_with_a_400(
    faulty: str, body: Any, field: str | None
) -> None:
    response = httpx.post(f"{faulty}/admin/faults", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field
    if field:
        assert field in error["message"]
    assert httpx.get(f"{faulty}/admin/state").json()["faults"] == {
        "error_rate": 0.0, "added_latency_ms": 0.0, "slowdown": 1.0, "down": False,
        "server_version": SERVER_VERSION, "model_revision": MODEL_REVISION,
    }


def test_the_version_a_pool_reports_changes_when_an_operator_upgrades_it(faulty: str) -> None:
    """vLLM's GET /version; `server_version` plays an upgrade nobody registered."""
    assert httpx.get(f"{faulty}/version").json() == {"version": SERVER_VERSION}
    assert set_faults(faulty, server_version="0.9.0")["server_version"] == "0.9.0"
    assert httpx.get(f"{faulty}/version").json() == {"version": "0.9.0"}
    done = run_cli("fault", "--url", faulty, "--server-version", "0.9.1")
    assert done.returncode == 0, done.stderr
    assert httpx.get(f"{faulty}/version").json() == {"version": "0.9.1"}


def test_the_fault_command_sets_and_clears_faults(faulty: str) -> None:
    done = run_cli("fault", "--url", faulty, "--error-rate", "0.2", "--added-latency-ms", "50",
                   "--slowdown", "2")
    assert done.returncode == 0, done.stderr
    assert '"error_rate": 0.2' in done.stdout
    faults = httpx.get(f"{faulty}/admin/state").json()["faults"]
    assert faults == {"error_rate": 0.2, "added_latency_ms": 50.0, "slowdown": 2.0,
                      "down": False, "server_version": SERVER_VERSION,
                      "model_revision": MODEL_REVISION}
    assert run_cli("fault", "--url", faulty, "--down").returncode == 0
    assert httpx.get(f"{faulty}/health").status_code == 503
    assert run_cli("fault", "--url", faulty, "--up").returncode == 0
    assert httpx.get(f"{faulty}/health").status_code == 200
    done = run_cli("fault", "--url", f"{faulty}/", "--reset")
    assert done.returncode == 0, done.stderr
    assert httpx.get(f"{faulty}/admin/state").json()["faults"]["error_rate"] == 0.0


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--error-rate", "1.5"], "--error-rate: must be between 0 and 1, got 1.5"),
        (["--error-rate", "lots"], "--error-rate: expected a number, got 'lots'"),
        (["--slowdown", "0.5"], "--slowdown: must be between 1 and 1000"),
        (["--added-latency-ms", "-5"], "--added-latency-ms: must be between 0 and 600000"),
        (["--down", "--up"], "not allowed with argument"),
        (["--server-version", "0.9 beta"], "--server-version: expected a version such as "
                                           "0.9.0"),
    ],
)
def test_the_fault_command_rejects_bad_flags(args: list[str], complaint: str) -> None:
    done = run_cli("fault", "--url", "http://127.0.0.1:9", *args)
    assert done.returncode == 2
    assert complaint in done.stderr


def test_the_fault_command_needs_a_proper_url() -> None:
    assert "--url" in run_cli("fault", "--error-rate", "0.1").stderr
    done = run_cli("fault", "--url", "localhost:8101", "--down")
    assert done.returncode == 2
    assert "expected http://HOST:PORT" in done.stderr


def test_the_fault_command_reports_an_unreachable_pool() -> None:
    done = run_cli("fault", "--url", "http://127.0.0.1:9", "--down", "--timeout", "2")
    assert done.returncode == 1
    assert "cannot reach http://127.0.0.1:9" in done.stderr
