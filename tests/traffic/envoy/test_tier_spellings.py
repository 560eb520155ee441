"""A caller's prompt-size statement in every spelling an attacker would try, through a real
Envoy in front of simulated pools (issue 28): the gateway keeps the larger of its estimate
and a well-formed statement (digits only, at most 9), ignores anything else, removes a
caller's own `x-fleetctl-prompt-tokens`, and nothing a caller writes moves a long prompt onto
the small pool's tier. A body it cannot size (over the 4 MiB scan limit) stated as small is
`unknown` (the last tier), never the small pool's. Which pool served a request is read from
the pools' own ground truth."""

from __future__ import annotations

import http.client
import json
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

from fleetctl.traffic.gateways.base import PROMPT_TOKENS_UNKNOWN, TierSpec
from fleetctl.traffic.gateways.envoy.names import PROMPT_SCAN_LIMIT_BYTES

from .conftest import Gateway, state
from .test_tiers import HEADER, answered_by, chat, send, served, tiered

pytestmark = pytest.mark.slow
STATED = "x-fleetctl-prompt-tokens-stated"
# Not a count of digits (or more than 9 of them): ignored, the estimate stands.
IGNORED = ["-1", "1e9", "0x10", " 5", "5 ", "+5", "5.0", "5,5", "", "1_000",
           "9" * 10, "1" + "0" * 30, "5\t", "NaN", "Infinity", "null", "unknown"]
# Well-formed but smaller than a long prompt's estimate: the estimate wins.
SMALLER = ["0", "1", "5", "000000005", "100"]


def pool_of(gw: Gateway, body: dict[str, Any], **headers: str) -> tuple[str, str]:
    """(the pool that served it, the size the gateway routed by), sent with http.client,
    which writes a header value as given (httpx refuses " 5"); the pool is Envoy's header
    checked against the pools' own ground truth."""
    address = urlsplit(gw.url)
    request_id = f"req-{uuid.uuid4().hex}"
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=30)
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                           {"content-type": "application/json", "x-request-id": request_id,
                            **headers})
        answer = connection.getresponse()
        answer.read()
    finally:
        connection.close()
    assert answer.status == 200, answer.status
    pool = answer.getheader("x-fleetctl-pool") or ""
    assert gw.served_by(request_id)[request_id] == pool
    return pool, answer.getheader(HEADER) or ""


@pytest.fixture(scope="module")
def tiers(gateway: Gateway) -> Gateway:
    """Prompts of at most 100 tokens on pa (the small pool), larger ones on pc."""
    gateway.adapter.apply(state(gateway.pools("pa", "pc"), tiered(
        {"pa": 5000, "pc": 5000}, TierSpec(100, 0, "failover", ("pa",)),
        TierSpec(None, 100, "failover", ("pc",)))))
    return gateway


@pytest.mark.parametrize("value", IGNORED + SMALLER)
def test_no_statement_moves_a_long_prompt_onto_the_small_pools_tier(
        tiers: Gateway, value: str) -> None:
    pool, size = pool_of(tiers, chat(1000), **{STATED: value})
    assert pool == "pc" and int(size) > 100


@pytest.mark.parametrize("value", ["1", "5", "100", "unknown", "-1", "0x10"])
def test_a_callers_own_prompt_header_is_replaced_by_the_gateways(tiers: Gateway,
                                                                 value: str) -> None:
    pool, size = pool_of(tiers, chat(1000), **{HEADER: value})
    assert pool == "pc" and int(size) > 100
    pool, size = pool_of(tiers, chat(10), **{HEADER: "999999"})
    assert pool == "pa" and int(size) <= 100


@pytest.mark.parametrize("value", IGNORED)
def test_a_malformed_statement_is_ignored_not_read_as_a_number(tiers: Gateway,
                                                               value: str) -> None:
    pool, size = pool_of(tiers, chat(10), **{STATED: value})
    assert pool == "pa" and int(size) <= 100


def test_a_well_formed_larger_statement_moves_a_prompt_up(tiers: Gateway) -> None:
    for value in ("101", "5000", "999999999"):
        answer = send(tiers, chat(10), **{STATED: value})
        assert served(tiers, answer) == "pc"
        assert answer.headers[HEADER] == value


def test_a_body_too_large_to_size_stated_as_small_is_unknown_never_the_small_pool(
        tiers: Gateway) -> None:
    huge = chat(PROMPT_SCAN_LIMIT_BYTES // 5 + 10)
    for value in ("1", "5", "100", "1000000"):
        answer = send(tiers, huge, **{STATED: value})
        assert answer.headers[HEADER] == PROMPT_TOKENS_UNKNOWN, value
        assert answered_by(answer) == "pc"
    # A statement the body's bytes could hold stands: it moves the prompt up, never down.
    answer = send(tiers, huge, **{STATED: "999999999"})
    assert answer.headers[HEADER] == "999999999"
    assert answered_by(answer) == "pc"
