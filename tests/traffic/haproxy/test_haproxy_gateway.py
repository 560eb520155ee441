"""The HAProxy adapter against a real HAProxy 2.6 in front of real simulated pools."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from fleetctl.demo.haproxy_process import HAProxyProcess
from fleetctl.traffic.gateways.haproxy.adapter import HAProxyAdapter
from tests.sim.simproc import MODEL, SimProcess
from tests.traffic import scenarios
from tests.traffic.scenarios import RESIDENCY, Harness, ask, route, slowed, wait_until

pytestmark = pytest.mark.slow


def test_the_openai_client_is_answered_through_haproxy_streaming_or_not(
        harness: Harness) -> None:
    scenarios.openai_round_trip(harness)


def test_a_70_30_split_shows_in_what_each_pool_served(harness: Harness) -> None:
    scenarios.split_follows_weights(harness)


def test_a_pool_set_to_zero_gets_none_of_the_next_requests(harness: Harness) -> None:
    scenarios.zero_weight_applies_to_the_next_request(harness)


def test_a_stream_open_on_a_drained_pool_finishes_normally(harness: Harness) -> None:
    scenarios.in_flight_stream_finishes_after_drain(harness)


def test_residency_fails_closed(harness: Harness) -> None:
    scenarios.residency_fails_closed(harness)


def test_a_repeated_residency_header_is_refused(harness: Harness) -> None:
    harness.apply(route({"gamma": 10000}, key="chat-in", residency="IN"))
    before = harness.served()
    answer = httpx.post(f"{harness.url}/v1/chat/completions",
                        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                        headers=[(RESIDENCY, "IN"), (RESIDENCY, "EU")])
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "bad_header"
    assert harness.served_since(before) == {"alpha": 0, "beta": 0, "gamma": 0}


def test_an_unknown_model_is_answered_404(harness: Harness) -> None:
    scenarios.unknown_model_is_refused(harness)


def test_a_body_too_large_to_read_the_model_from_is_answered_413(harness: Harness) -> None:
    scenarios.oversized_body_is_refused(harness)


def test_read_back_equals_what_was_applied(harness: Harness) -> None:
    scenarios.read_back_equals_desired(harness)


def test_a_config_haproxy_rejects_leaves_the_previous_one_serving(harness: Harness) -> None:
    scenarios.failed_validation_keeps_the_previous_config(harness)


def test_a_weight_change_is_runtime_and_a_new_route_is_a_reload(harness: Harness) -> None:
    harness.apply(route({"alpha": 5000, "beta": 5000}))
    assert harness.apply(route({"alpha": 2500, "beta": 7500}, revision=2)).method == "runtime"
    added = harness.apply(route({"alpha": 2500, "beta": 7500}, revision=2),
                          route({"gamma": 10000}, key="chat-in", residency="IN"))
    assert added.method == "reload"
    assert "reloaded" in added.detail


def test_runtime_weights_survive_a_reload(harness: Harness, haproxy: HAProxyProcess) -> None:
    harness.apply(route({"alpha": 7000, "beta": 3000}))  # in the config file
    desired = harness.desired(route({"alpha": 10000, "beta": 0}, revision=2))
    assert harness.adapter.apply(desired).method == "runtime"  # only in the running worker
    worker = haproxy.current_worker()
    haproxy.reload()  # as an operator would: same config file, state saved first
    assert haproxy.current_worker() != worker
    assert harness.adapter.read_back() == {"chat": {"alpha": 10000}}
    assert harness.adapter.matches(desired, harness.adapter.read_back())
    before = harness.served()
    client = harness.client()
    for _ in range(10):
        ask(client)
    assert harness.served_since(before) == {"alpha": 10, "beta": 0, "gamma": 0}


def test_runtime_weights_survive_haproxy_being_killed_and_started_again(
        harness: Harness, haproxy: HAProxyProcess) -> None:
    harness.apply(route({"alpha": 5000, "beta": 5000}))  # in the config file
    drained = harness.desired(route({"alpha": 10000, "beta": 0}, revision=2))
    assert harness.adapter.apply(drained).method == "runtime"  # only in the running worker

    haproxy.kill()  # nothing saved on the way down: the state file is the adapter's
    haproxy.start(timeout_s=60)

    before = harness.served()
    client = harness.client()
    for _ in range(20):  # at 50/50, 20 requests all on alpha: p = 1e-6
        ask(client)
    assert harness.served_since(before) == {"alpha": 20, "beta": 0, "gamma": 0}
    assert harness.adapter.matches(drained, harness.adapter.read_back())


def test_a_stream_outlives_a_reload_on_the_old_worker_and_is_counted(
        harness: Harness, haproxy: HAProxyProcess) -> None:
    harness.apply(route({"alpha": 0, "beta": 10000}))
    with slowed(harness.sim, "beta", 50):  # 100 ms per token: ~4 s, outlasting the reload
        stream = harness.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a long one"}], max_tokens=40,
            stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        first = [next(chunks) for _ in range(3)]
        worker = haproxy.current_worker()
        result = harness.apply(route({"alpha": 10000, "beta": 0}, revision=2),
                               route({"gamma": 10000}, key="chat-in", residency="IN"))
        assert result.method == "reload"
        assert haproxy.current_worker() != worker
        assert harness.adapter.in_flight("beta") == 1  # seen on the old worker
        rest = list(chunks)
    assert len([c for c in first + rest if c.choices and c.choices[0].delta.content]) == 40
    assert rest[-1].choices[0].finish_reason == "length"
    assert wait_until(lambda: harness.adapter.in_flight("beta") == 0)


def test_pool_counters_count_what_each_pool_was_sent(harness: Harness) -> None:
    harness.apply(route({"alpha": 10000, "beta": 0}))
    before = harness.adapter.pool_counters()
    client = harness.client()
    for _ in range(5):
        ask(client)
    after = harness.adapter.pool_counters()
    assert after["alpha"].requests_total - before["alpha"].requests_total == 5
    assert after["beta"].requests_total == before["beta"].requests_total
    assert after["alpha"].errors_total == before["alpha"].errors_total
    # HAProxy ends a session just after forwarding its last byte, so the last one may still
    # be counted for an instant after the client has its answer.
    assert wait_until(lambda: harness.adapter.pool_counters()["alpha"].active == 0)


def test_reloads_under_load_lose_no_request(harness: Harness) -> None:
    scenarios.reloads_under_load_lose_no_request(harness)


def test_a_stopped_haproxy_is_a_retryable_error_within_two_seconds(
        tmp_path: Path, sim_fleet: SimProcess) -> None:
    process = HAProxyProcess(tmp_path / "gone").start(timeout_s=60)
    adapter = HAProxyAdapter(process.gateway)
    h = Harness(url=process.url, adapter=adapter, sim=sim_fleet)
    h.apply(route({"alpha": 10000}))
    process.stop()
    scenarios.apply_is_refused_quickly_when_the_gateway_is_down(
        adapter, h.desired(route({"alpha": 5000, "beta": 5000}, revision=2)))


def test_median_apply_times_are_printed(harness: Harness,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        timings = scenarios.apply_timings(harness)
    # A weights-only change is one runtime-API command, a structural one a validated reload:
    # even the fastest reload costs more than twice the fastest weights change. Fastest
    # against fastest, as load only ever adds time (all 20 of one kind would have to be
    # slowed to break it).
    assert 2 * min(timings["weights-only"]) < min(timings["structural"]), timings
