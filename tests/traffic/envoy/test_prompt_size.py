"""The prompt-size estimate a real Envoy's Lua script sets from the body, against real
simulated pools: calibrated from the conformance probe's usage.prompt_tokens, a client's
internal header removed, a caller's stated count kept when larger, "unknown" when the body
cannot be read. The value the upstream got is what Envoy echoes in the answer's header
(%REQ% of the same header map it sent)."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import httpx
import pytest

from fleetctl.conformance.calibration import fit
from fleetctl.conformance.cases.probe import PARITY_MESSAGES, Probe
from fleetctl.traffic.gateways.base import PROMPT_TOKENS_UNKNOWN, PromptCalibration
from fleetctl.traffic.gateways.envoy.names import PROMPT_SCAN_LIMIT_BYTES

from .conftest import MODEL, Gateway, route, state

pytestmark = pytest.mark.slow

HEADER = "x-fleetctl-prompt-tokens"
STATED = "x-fleetctl-prompt-tokens-stated"
SENTENCES = (
    "The harbor master checked every container before the ship left for the open sea.",
    "Our quarterly report shows that revenue grew, while costs stayed roughly flat.",
    "Please summarise the meeting notes below and list the three decisions we made.",
    "A careful reader will notice that the second chapter contradicts the first one.",
    "When the train reached the mountain station, the passengers stepped into the snow.",
    "Engineers measured the latency of each request and plotted it against the load.",
)


def prose(sentences: int) -> str:
    return " ".join(SENTENCES[i % len(SENTENCES)] for i in range(sentences))


@pytest.fixture(scope="module")
def calibrated(gateway: Gateway) -> PromptCalibration:
    """pa calibrated as fleetctl does it: the probe's parity counts, fitted; applied."""
    probe = Probe(pool_name="pa", base_url=gateway.sims.url("pa"), model=MODEL,
                  expected_models=[MODEL], registry_max_context=None)
    try:
        counts = [probe.prompt_tokens(i)[0] for i in range(len(PARITY_MESSAGES))]
    finally:
        probe.close()
    cal = fit(counts)
    assert cal is not None, counts
    pa = replace(gateway.pools("pa")["pa"], prompt=cal)
    gateway.adapter.apply(state({"pa": pa}, route("chat", {"pa": 10000})))
    return cal


def send(gw: Gateway, body: dict[str, Any] | bytes, path: str = "/v1/chat/completions",
         **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{gw.url}{path}", content=content, timeout=30,
                      headers={"content-type": "application/json",
                               "x-request-id": f"req-{uuid.uuid4().hex}", **headers})


def chat(text: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": text}]}


@pytest.mark.parametrize("sentences", [1, 40, 200])
def test_the_estimate_is_close_to_the_pools_own_count(gateway: Gateway,
                                                     calibrated: PromptCalibration,
                                                     sentences: int) -> None:
    answer = send(gateway, chat(prose(sentences)))
    assert answer.status_code == 200, answer.text
    actual = answer.json()["usage"]["prompt_tokens"]
    estimate = int(answer.headers[HEADER])
    # Short prompts are mostly template; long ones mostly text: within 10 % either way
    # (benchmarks/prompt_estimator.py measures the error on a larger mix).
    assert abs(estimate - actual) <= max(3, 0.10 * actual), (estimate, actual)


def test_text_parts_and_completions_prompts_count(gateway: Gateway,
                                                  calibrated: PromptCalibration) -> None:
    text = prose(40)
    parts = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": text[:1000]}, {"type": "text", "text": text[1000:]}]}]}
    plain = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
    completion = {"model": MODEL, "max_tokens": 1, "prompt": text}
    by_parts, by_string = send(gateway, parts), send(gateway, plain)
    by_prompt = send(gateway, completion, path="/v1/completions")
    assert by_parts.headers[HEADER] == by_string.headers[HEADER]
    actual = by_prompt.json()["usage"]["prompt_tokens"]
    assert abs(int(by_prompt.headers[HEADER]) - actual) <= 0.10 * actual


def test_a_client_sent_prompt_header_is_removed(gateway: Gateway,
                                                calibrated: PromptCalibration) -> None:
    answer = send(gateway, chat(prose(200)), **{HEADER: "1"})
    assert answer.status_code == 200
    assert int(answer.headers[HEADER]) > 1000  # the gateway's estimate, not the client's 1


def test_a_stated_count_counts_only_when_larger(gateway: Gateway,
                                                calibrated: PromptCalibration) -> None:
    body = chat(prose(40))
    estimate = int(send(gateway, body).headers[HEADER])
    assert send(gateway, body, **{STATED: "50000"}).headers[HEADER] == "50000"
    assert int(send(gateway, body, **{STATED: "3"}).headers[HEADER]) == estimate
    # Not a count: ignored.
    assert int(send(gateway, body, **{STATED: "12x"}).headers[HEADER]) == estimate


def test_a_body_without_a_readable_prompt_is_unknown_or_the_stated_count(
        gateway: Gateway, calibrated: PromptCalibration) -> None:
    no_prompt = {"model": MODEL, "max_tokens": 1}
    assert send(gateway, no_prompt).headers[HEADER] == PROMPT_TOKENS_UNKNOWN
    assert send(gateway, no_prompt, **{STATED: "9000"}).headers[HEADER] == "9000"
    # Larger than the scan limit: no estimate, whatever the text (the pool refuses it).
    huge = chat("word " * (PROMPT_SCAN_LIMIT_BYTES // 5 + 10))
    assert send(gateway, huge).headers[HEADER] == PROMPT_TOKENS_UNKNOWN
