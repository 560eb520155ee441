"""What every gateway kind must do, each scenario written once and run for every kind it
applies to (the `gateway` fixture: one gateway per kind for this module, see conftest.py).

Envoy, HAProxy and nginx are real processes in front of real simulated pools (alpha and beta
in the US, gamma in India, each serving two models), driven with the official `openai`
client; what each pool served is read from its own metrics. The Gateway API kind talks to a
fake Kubernetes API server (the one allowed mock: no API server can run here), so the
scenarios that need requests to flow through a data plane are not made for it; it runs
twice, with the pools behind Services and behind InferencePools.

Which scenarios apply to which kind (E envoy, X envoy-xds, H haproxy, N nginx, G gateway-api
to Services, I gateway-api to InferencePools; what a kind lacks and why is in kinds.py, and
the end of a run lists each scenario left out):

    scenario                                                  E X H N G I
    read_back_equals_what_was_applied                         x x x x x x
    a_route_with_no_weights_is_held_empty                     x x x x x x
    the_same_state_again_changes_nothing                      x x x x x x
    weights_and_structure_changes_use_the_kinds_methods       x x x x x x
    a_gateway_restarted_empty_is_repaired_by_the_next_apply   x x x x x x
    a_bad_option_is_a_permanent_error_naming_it               x x x x x x
    a_gateway_that_is_down_is_a_retryable_error_at_once       x x x x x x
    apply_timings_are_printed                                 x x x x x x
    a_pool_with_a_path_is_left_out_and_the_rest_applies       x x x x . .
    a_kind_routing_to_services_takes_any_base_url             . . . . x x
    in_flight_cannot_be_seen_is_minus_one                     . . . . x x
    no_counters_is_an_empty_map                               . . . x x x
    pool_counters_count_what_each_pool_was_sent               x x x . . .
    the_openai_client_is_answered_streaming_or_not            x x x x . .
    each_model_reaches_the_pool_its_route_names               x x x x . .
    a_split_shows_in_what_each_pool_served                    x x x x . .
    a_weights_change_applies_to_the_very_next_request         x x x x . .
    a_stream_open_on_a_drained_pool_finishes_normally         x x x x . .
    residency_fails_closed                                    x x x x . .
    a_pinned_route_alone_serves_no_request_without_its_header x x x x . .
    a_latency_class_route_takes_only_requests_of_its_class    x x x x . .
    an_unknown_model_is_answered_404                          x x x x . .
    a_client_sent_model_header_cannot_pick_the_route          x x x x . .
    a_drained_pool_stays_at_zero_after_a_crash                x x x x . .
    a_gateway_restarted_empty_serves_again_after_the_next_apply x x x x . .
    structural_changes_under_load_lose_no_request             x x x x . .
    a_body_too_large_to_read_the_model_from_is_answered_413   . . x x . .
    a_config_the_gateway_rejects_leaves_the_previous_serving  . . x x . .

test_the_table_above_is_what_the_suite_runs keeps this table true.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from fleetctl.traffic.gateways.base import AdapterError, DesiredState, PoolTarget
from tests.noise import FALSE_FAILURE, binomial_tolerance
from tests.sim.simproc import MODEL
from tests.support.waiting import wait_until
from tests.traffic.contract.conftest import applicable, needs
from tests.traffic.contract.kinds import (
    BASE_URLS,
    BODY_LIMIT,
    COUNTERS,
    IN_FLIGHT,
    KINDS,
    NAME_CHECK,
    TRAFFIC,
    GatewayUnderTest,
)
from tests.traffic.scenarios import (
    LATENCY_CLASS,
    OTHER_MODEL,
    RESIDENCY,
    ask,
    error_of,
    route,
    slowed,
)

pytestmark = pytest.mark.slow

NOTHING = {"alpha": 0, "beta": 0, "gamma": 0}


def post(gw: GatewayUnderTest, body: dict[str, Any] | bytes,
         headers: list[tuple[str, str]] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{gw.url}/v1/chat/completions", content=content, timeout=30,
                      headers=[("content-type", "application/json"),
                               ("x-request-id", f"req-{uuid.uuid4().hex}"), *(headers or [])])


def chat(model: str = MODEL, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
            **extra}


# --- the control plane: every kind -----------------------------------------------------------

def test_read_back_equals_what_was_applied(gateway: GatewayUnderTest) -> None:
    for n, weights in enumerate(({"alpha": 7000, "beta": 3000}, {"alpha": 1, "beta": 9999},
                                 {"alpha": 0, "beta": 10000})):
        desired = gateway.desired(route(weights, revision=n + 1),
                                  route({"gamma": 10000}, key="chat-in", residency="IN"))
        gateway.adapter.apply(desired)
        held = gateway.adapter.read_back()
        assert gateway.adapter.matches(desired, held), (weights, held)
        assert held["chat-in"] == {"gamma": 10000}
        # A pool at 0 is not held; each route's held weights sum to 10,000 (a kind that
        # rounds reports its shares in basis points of the route).
        assert set(held["chat"]) == {p for p, w in weights.items() if w}
        assert sum(held["chat"].values()) == 10000, held


def test_a_route_with_no_weights_is_held_empty(gateway: GatewayUnderTest) -> None:
    desired = gateway.desired(route({"alpha": 10000}),
                              route({}, key="chat-in", residency="IN"))
    gateway.adapter.apply(desired)
    held = gateway.adapter.read_back()
    assert held == {"chat": {"alpha": 10000}, "chat-in": {}}
    assert gateway.adapter.matches(desired, held)


def test_the_same_state_again_changes_nothing(gateway: GatewayUnderTest) -> None:
    desired = gateway.desired(route({"alpha": 2500, "beta": 7500}),
                              route({"gamma": 10000}, key="chat-in", residency="IN"))
    gateway.adapter.apply(desired)
    held = gateway.adapter.read_back()
    again = gateway.adapter.apply(desired)
    assert again.applied and again.method in gateway.unchanged_methods, again
    assert gateway.adapter.read_back() == held
    assert gateway.adapter.matches(desired, held)


def test_weights_and_structure_changes_use_the_kinds_methods(gateway: GatewayUnderTest) -> None:
    import re

    gateway.apply(route({"alpha": 5000, "beta": 5000}))
    weights = gateway.apply(route({"alpha": 2500, "beta": 7500}, revision=2))
    assert weights.method == gateway.weights_method, weights
    added = gateway.apply(route({"alpha": 2500, "beta": 7500}, revision=2),
                          route({"gamma": 10000}, key="chat-in", residency="IN"))
    assert added.method == gateway.structural_method, added
    assert re.search(gateway.structural_detail, added.detail), added.detail


def test_a_gateway_restarted_empty_is_repaired_by_the_next_apply(
        gateway: GatewayUnderTest) -> None:
    desired = gateway.desired(route({"alpha": 3000, "beta": 7000}))
    gateway.adapter.apply(desired)
    gateway.restart_empty()
    assert gateway.adapter.read_back() == {}
    assert not gateway.adapter.matches(desired, gateway.adapter.read_back())
    gateway.adapter.apply(desired)
    assert gateway.adapter.matches(desired, gateway.adapter.read_back())


def test_a_bad_option_is_a_permanent_error_naming_it(gateway: GatewayUnderTest) -> None:
    with pytest.raises(AdapterError) as caught:
        gateway.adapter_with(**{gateway.bad_option: "soon"})
    assert caught.value.permanent
    assert gateway.bad_option in str(caught.value)


def test_a_gateway_that_is_down_is_a_retryable_error_at_once(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 10000}))
    desired = gateway.desired(route({"alpha": 5000, "beta": 5000}, revision=2))
    # A long timeout, so "at once" has a wide margin on a loaded machine: a refused
    # connection is reported at once, and an adapter that waited for the timeout would
    # take 30 s.
    patient = gateway.adapter_with(**{gateway.timeout_option: 30})
    calls = [lambda: patient.apply(desired), patient.read_back]
    if gateway.has(IN_FLIGHT):
        calls.append(lambda: patient.in_flight("alpha"))
    took = []
    with gateway.stopped():
        for call in calls:
            started = time.monotonic()
            with pytest.raises(AdapterError) as caught:
                call()
            took.append(time.monotonic() - started)
            assert not caught.value.permanent, caught.value
    print(f"\n{gateway.kind}: refused in " + ", ".join(f"{t * 1000:.0f} ms" for t in took))
    assert max(took) < 10
    gateway.adapter.apply(desired)  # up again: the next apply goes through
    assert gateway.adapter.matches(desired, gateway.adapter.read_back())


def test_apply_timings_are_printed(gateway: GatewayUnderTest,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Apply times, weights-only and structural (a route added and removed): the medians
    are printed, never asserted."""
    base = route({"alpha": 5000, "beta": 5000})
    gateway.apply(base)
    weights_only, structural = [], []
    for n in range(20):
        share = 3000 + 100 * n
        started = time.monotonic()
        gateway.apply(route({"alpha": share, "beta": 10000 - share}, revision=n + 2))
        weights_only.append((time.monotonic() - started) * 1000)
    for n in range(20):
        extra = (route({"gamma": 10000}, key="chat-in", residency="IN"),) if n % 2 == 0 else ()
        started = time.monotonic()
        result = gateway.apply(base, *extra)
        structural.append((time.monotonic() - started) * 1000)
        assert result.method == gateway.structural_method
    with capsys.disabled():
        print(f"\n{gateway.kind}: median apply over 20 runs: weights-only "
              f"{statistics.median(weights_only):.1f} ms (max {max(weights_only):.1f}), "
              f"structural {statistics.median(structural):.1f} ms "
              f"(max {max(structural):.1f})")
    assert gateway.adapter.read_back()["chat"] == {"alpha": 5000, "beta": 5000}


# --- pools a kind cannot route to ------------------------------------------------------------

@needs(BASE_URLS, TRAFFIC)
def test_a_pool_with_a_path_is_left_out_and_the_rest_applies(gateway: GatewayUnderTest) -> None:
    # As a pool stored before the registry checked base URLs would arrive.
    bad = PoolTarget("delta", (f"{gateway.sim.url('gamma')}/openai",), "IN")
    why = ("cannot route to a base URL with a path (/openai): give the server's root URL "
           "(requests keep their /v1/... path)")
    assert type(gateway.adapter).check_pool(bad) == why
    assert type(gateway.adapter).check_pool(gateway.pools()["alpha"]) is None
    desired = DesiredState(
        routes=(route({"alpha": 10000, "delta": 0}),
                route({"beta": 5000, "delta": 5000}, key="other", model=OTHER_MODEL),
                route({"delta": 10000}, key="chat-in", residency="IN")),
        pools={**gateway.pools(), "delta": bad})

    result = gateway.adapter.apply(desired)

    assert result.warning == f"pool delta left out: this gateway {why}"
    assert result.warning in result.detail
    # delta's share goes to the route's other pools with weight; with none left, the route
    # answers an error (fails closed), as an empty split does.
    held = gateway.adapter.read_back()
    assert held == {"chat": {"alpha": 10000}, "other": {"beta": 10000}, "chat-in": {}}
    assert gateway.adapter.matches(desired, held)
    before = gateway.served()
    ask(gateway.client(), model=OTHER_MODEL)
    refused = post(gateway, chat(), [(RESIDENCY, "IN")])
    assert refused.status_code == 503
    assert gateway.served_since(before) == {"alpha": 0, "beta": 1, "gamma": 0}


@needs(without=(BASE_URLS,))
def test_a_kind_routing_to_services_takes_any_base_url(gateway: GatewayUnderTest) -> None:
    odd = PoolTarget("delta", ("http://10.0.0.9:8000/openai",), "US")
    assert type(gateway.adapter).check_pool(odd) is None
    desired = DesiredState(routes=(route({"alpha": 5000, "delta": 5000}),),
                           pools={**gateway.pools(), "delta": odd})
    assert gateway.adapter.apply(desired).warning == ""
    assert gateway.adapter.read_back() == {"chat": {"alpha": 5000, "delta": 5000}}


# --- what a kind can observe -----------------------------------------------------------------

@needs(without=(IN_FLIGHT,))
def test_in_flight_cannot_be_seen_is_minus_one(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 10000}))
    assert gateway.adapter.in_flight("alpha") == -1


@needs(without=(COUNTERS,))
def test_no_counters_is_an_empty_map(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 10000}))
    assert gateway.adapter.pool_counters() == {}


@needs(COUNTERS, TRAFFIC)
def test_pool_counters_count_what_each_pool_was_sent(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 10000, "beta": 0}))
    before = gateway.adapter.pool_counters()
    client = gateway.client()
    for _ in range(5):
        ask(client)
    # A gateway may count a request just after forwarding its last byte.
    wait_until(lambda: gateway.adapter.pool_counters()["alpha"].requests_total
               - before["alpha"].requests_total == 5, timeout_s=30,
               what="alpha's counter to count the 5 requests")
    after = gateway.adapter.pool_counters()
    assert after["beta"].requests_total == before["beta"].requests_total
    assert after["alpha"].errors_total == before["alpha"].errors_total
    wait_until(lambda: gateway.adapter.pool_counters()["alpha"].active == 0, timeout_s=30,
               what="alpha's active requests to reach 0")


# --- real traffic ----------------------------------------------------------------------------

@needs(TRAFFIC)
def test_the_openai_client_is_answered_streaming_or_not(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 5000, "beta": 5000}))
    client = gateway.client()
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=12,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Same model and prompt give the same text on every pool: the stream extends the answer.
    assert text.startswith(answer.choices[0].message.content or "-")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


@needs(TRAFFIC)
def test_each_model_reaches_the_pool_its_route_names(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"beta": 10000}), route({"alpha": 10000}, key="other",
                                                  model=OTHER_MODEL))
    client = gateway.client()
    before = gateway.served()
    ask(client)
    assert gateway.served_since(before) == {"alpha": 0, "beta": 1, "gamma": 0}
    before = gateway.served()
    chunks = list(client.chat.completions.create(
        model=OTHER_MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=20,
        stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    wait_until(lambda: gateway.served_since(before) == {"alpha": 1, "beta": 0, "gamma": 0},
               timeout_s=30, what="alpha to count the stream as served")


@needs(TRAFFIC)
def test_a_split_shows_in_what_each_pool_served(gateway: GatewayUnderTest,
                                                requests: int = 400) -> None:
    """70/30 split: what each pool served is within the exact binomial bound (false failure
    1e-6, ~5 sigma) of the share the gateway reports it holds (HAProxy rounds 70/30 to
    179/77 of 256, so the held share is used). 400 requests keep an even split, or one that
    ignores the weights, well outside it."""
    gateway.apply(route({"alpha": 7000, "beta": 3000}))
    held = gateway.adapter.read_back()["chat"]
    share = held["alpha"] / sum(held.values())
    client = gateway.client()
    before = gateway.served()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda _: ask(client), range(requests)))
    served = gateway.served_since(before)
    assert served["alpha"] + served["beta"] == requests, served
    assert served["gamma"] == 0
    tolerance = binomial_tolerance(requests, share, FALSE_FAILURE)
    print(f"\n{gateway.kind}: 70/30 over {requests} requests -> alpha {served['alpha']}, "
          f"beta {served['beta']} (expected alpha {requests * share:.1f} ± {tolerance:.1f})")
    assert abs(served["alpha"] - requests * share) <= tolerance


@needs(TRAFFIC)
def test_a_weights_change_applies_to_the_very_next_request(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 7000, "beta": 3000}))
    client = gateway.client()
    # A pool set to 0 gets none of the next requests...
    gateway.apply(route({"alpha": 10000, "beta": 0}, revision=2))
    before = gateway.served()
    for _ in range(20):
        ask(client)
    assert gateway.served_since(before) == {"alpha": 20, "beta": 0, "gamma": 0}
    # ...and each change, back and forth, holds from the very next request on.
    for flip in range(10):
        to, away = ("beta", "alpha") if flip % 2 == 0 else ("alpha", "beta")
        result = gateway.apply(route({to: 10000, away: 0}, revision=flip + 3))
        assert result.method == gateway.weights_method
        before = gateway.served()
        ask(client)
        assert gateway.served_since(before) == {**NOTHING, to: 1}, flip


@needs(TRAFFIC, IN_FLIGHT)
def test_a_stream_open_on_a_drained_pool_finishes_normally(gateway: GatewayUnderTest) -> None:
    """A stream open on beta when beta is drained keeps going to its natural end; the next
    request goes to alpha; in_flight(beta) sees the stream, then sees it end."""
    gateway.apply(route({"alpha": 0, "beta": 10000}))
    client = gateway.client()
    # 100 ms per token: 60 tokens take ~6 s, time enough for the apply and the request below
    # to happen while the stream is still open, even on a loaded machine.
    with slowed(gateway.sim, "beta", 50):
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "tell me a story"}],
            max_tokens=60, stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        first = [next(chunks) for _ in range(3)]
        assert gateway.adapter.in_flight("beta") == 1
        result = gateway.apply(route({"alpha": 10000, "beta": 0}, revision=2))
        before = gateway.served()
        assert ask(client) in ("length", "stop")
        assert gateway.served_since(before) == {"alpha": 1, "beta": 0, "gamma": 0}
        assert gateway.adapter.in_flight("beta") == 1, "the drained pool's stream is still open"
        rest = list(chunks)
    tokens = [c for c in first + rest if c.choices and c.choices[0].delta.content]
    assert len(tokens) == 60
    assert rest[-1].choices[0].finish_reason == "length"
    wait_until(lambda: gateway.adapter.in_flight("beta") == 0, timeout_s=30,
               what="the drained pool's stream to end")
    print(f"\n{gateway.kind}: drain applied while streaming: {result.method}: {result.detail}")


@needs(TRAFFIC)
def test_residency_fails_closed(gateway: GatewayUnderTest) -> None:
    unpinned = route({"alpha": 10000})
    pinned = route({"gamma": 10000}, key="chat-in", residency="IN")
    gateway.apply(unpinned, pinned)
    before = gateway.served()
    ask(gateway.client(**{RESIDENCY: "IN"}))
    ask(gateway.client())
    assert gateway.served_since(before) == {"alpha": 1, "beta": 0, "gamma": 1}

    before = gateway.served()
    refused = error_of(lambda: ask(gateway.client(**{RESIDENCY: "EU"})))
    assert refused.status_code == 403
    assert "residency_unavailable" in str(refused.body)
    combined = error_of(lambda: ask(gateway.client(**{RESIDENCY: "IN,EU"})))
    assert combined.status_code == 403
    assert gateway.served_since(before) == NOTHING

    # The pinned route loses its last pool: it answers an error, never the unpinned pools.
    gateway.apply(unpinned, route({}, key="chat-in", residency="IN", revision=2))
    before = gateway.served()
    empty = post(gateway, chat(), [(RESIDENCY, "IN")])
    assert empty.status_code == 503
    assert empty.json()["error"]["code"] == "no_pool_available"
    assert empty.json()["error"]["type"] == "service_unavailable"
    assert gateway.served_since(before) == NOTHING


@needs(TRAFFIC)
def test_a_pinned_route_alone_serves_no_request_without_its_header(
        gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"gamma": 10000}, key="chat-in", residency="IN"))
    before = gateway.served()
    without = post(gateway, chat())
    wrong = post(gateway, chat(), [(RESIDENCY, "US")])
    right = post(gateway, chat(), [(RESIDENCY, "IN")])
    assert without.status_code == 404, without.text  # no route for the model without it
    assert wrong.status_code == 403, wrong.text
    assert right.status_code == 200, right.text
    assert gateway.served_since(before) == {"alpha": 0, "beta": 0, "gamma": 1}


@needs(TRAFFIC)
def test_a_latency_class_route_takes_only_requests_of_its_class(
        gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 10000}),
                  route({"beta": 10000}, key="chat-fast", latency_class="interactive"))
    for headers, pool in (([(LATENCY_CLASS, "interactive")], "beta"),
                          ([(LATENCY_CLASS, "batch")], "alpha"), ([], "alpha")):
        before = gateway.served()
        assert post(gateway, chat(), headers).status_code == 200
        assert gateway.served_since(before) == {**NOTHING, pool: 1}, headers


@needs(TRAFFIC)
def test_an_unknown_model_is_answered_404(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 10000}))
    before = gateway.served()
    with pytest.raises(openai.NotFoundError) as caught:
        ask(gateway.client(), model="no-such-model")
    assert "model_not_found" in str(caught.value.body)
    assert gateway.served_since(before) == NOTHING


@needs(TRAFFIC)
def test_a_client_sent_model_header_cannot_pick_the_route(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 10000}), route({"beta": 10000}, key="other",
                                                   model=OTHER_MODEL))
    before = gateway.served()
    answer = post(gateway, chat(OTHER_MODEL), [("x-fleetctl-model", MODEL)])
    unknown = post(gateway, chat("no-such-model"), [("x-fleetctl-model", MODEL)])
    assert answer.status_code == 200, answer.text
    assert unknown.status_code == 404, unknown.text
    assert gateway.served_since(before) == {"alpha": 0, "beta": 1, "gamma": 0}


@needs(TRAFFIC)
def test_a_drained_pool_stays_at_zero_after_a_crash(gateway: GatewayUnderTest) -> None:
    gateway.apply(route({"alpha": 5000, "beta": 5000}))  # in the config file
    drained = gateway.desired(route({"alpha": 10000, "beta": 0}, revision=2))
    assert gateway.adapter.apply(drained).method == gateway.weights_method

    gateway.kill_and_start()

    # Before fleetctl talks to it again, from its very first request on (at 50/50, 20
    # requests all on alpha: p = 1e-6).
    before = gateway.served()
    client = gateway.client()
    for _ in range(20):
        ask(client)
    assert gateway.served_since(before) == {"alpha": 20, "beta": 0, "gamma": 0}
    assert gateway.adapter.matches(drained, gateway.adapter.read_back())


@needs(TRAFFIC)
def test_a_gateway_restarted_empty_serves_again_after_the_next_apply(
        gateway: GatewayUnderTest) -> None:
    desired = gateway.desired(route({"alpha": 3000, "beta": 7000}))
    gateway.adapter.apply(desired)
    gateway.restart_empty()
    gateway.adapter.apply(desired)
    before = gateway.served()
    ask(gateway.client())
    served = gateway.served_since(before)
    assert served["alpha"] + served["beta"] == 1, served


@needs(TRAFFIC)
def test_structural_changes_under_load_lose_no_request(gateway: GatewayUnderTest,
                                                       changes: int = 6) -> None:
    """Structural changes (a reload or a file swap each) while requests keep coming: none
    of them fails."""
    base = route({"alpha": 5000, "beta": 5000})
    gateway.apply(base)
    stop, errors, answered = threading.Event(), [], [0]

    def load() -> None:
        client = gateway.client()
        while not stop.is_set():
            try:
                ask(client)
                answered[0] += 1
            except openai.OpenAIError as exc:
                errors.append(repr(exc))

    def finished(count: int) -> bool:
        return answered[0] + len(errors) >= count

    workers = [threading.Thread(target=load) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        for n in range(changes):
            # Requests are flowing before each change (some finished since the last one),
            # rather than a fixed pause that a loaded machine may not fill.
            more = answered[0] + len(errors) + 4
            wait_until(functools.partial(finished, more), timeout_s=30,
                       what="requests to finish")
            extra = (route({"gamma": 10000}, key="chat-in", residency="IN"),) if n % 2 == 0 \
                else ()
            assert gateway.apply(base, *extra).method == gateway.structural_method
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert errors == [], errors[:3]
    assert answered[0] > changes


@needs(TRAFFIC, BODY_LIMIT)
def test_a_body_too_large_to_read_the_model_from_is_answered_413(
        gateway: GatewayUnderTest) -> None:
    """The model is read from the body, so a body too large to hold is refused, not guessed."""
    gateway.apply(route({"alpha": 10000}))
    big = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 400_000}]}
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=big, timeout=30)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "too_large"


@needs(TRAFFIC, NAME_CHECK)
def test_a_config_the_gateway_rejects_leaves_the_previous_serving(
        gateway: GatewayUnderTest) -> None:
    """A pool whose address does not resolve passes fleetctl's checks but not the gateway's
    own (`haproxy -c` / `nginx -t`): the push fails for good and the old config serves on."""
    gateway.apply(route({"alpha": 10000}))
    held = gateway.adapter.read_back()
    unresolvable = PoolTarget(name="delta", base_urls=("http://no-such-pool.invalid:8000",),
                              jurisdiction="US")
    broken = DesiredState(routes=(route({"alpha": 5000, "delta": 5000}, revision=2),),
                          pools={**gateway.pools(), "delta": unresolvable})
    with pytest.raises(AdapterError) as caught:
        gateway.adapter.apply(broken)
    assert caught.value.permanent
    assert "no-such-pool.invalid" in str(caught.value)
    assert gateway.adapter.read_back() == held
    before = gateway.served()
    ask(gateway.client())
    assert gateway.served_since(before)["alpha"] == 1


# --- the table in the docstring --------------------------------------------------------------

def test_the_table_above_is_what_the_suite_runs() -> None:
    module = sys.modules[__name__]
    table = {}
    for line in (__doc__ or "").splitlines():
        parts = line.split()
        if len(parts) == 1 + len(KINDS) and hasattr(module, f"test_{parts[0]}"):
            table[parts[0]] = parts[1:]
    runs = {name[len("test_"):]: ["x" if why is None else "." for why in
                                  applicable(getattr(module, name)).values()]
            for name in dir(module) if name.startswith("test_")
            and "gateway" in getattr(module, name).__code__.co_varnames}
    assert table == runs
