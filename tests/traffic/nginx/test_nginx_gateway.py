"""The nginx adapter against a real nginx-light 1.22 in front of real simulated pools."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from fleetctl.demo.nginx_process import NginxProcess
from fleetctl.traffic.gateways.base import AdapterError
from fleetctl.traffic.gateways.nginx.adapter import NginxAdapter
from tests.sim.simproc import MODEL, SimProcess
from tests.traffic import scenarios
from tests.traffic.scenarios import RESIDENCY, Harness, ask, route

pytestmark = pytest.mark.slow


def test_the_openai_client_is_answered_through_nginx_streaming_or_not(
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


def test_nginx_1_22_routes_by_the_first_of_repeated_residency_headers(
        harness: Harness) -> None:
    """A known limit (see the module docstring): nginx 1.22 cannot see the second header, so
    it cannot refuse the request; it stays inside the first jurisdiction named."""
    harness.apply(route({"alpha": 10000}), route({"gamma": 10000}, key="chat-in",
                                                 residency="IN"))
    before = harness.served()
    answer = httpx.post(f"{harness.url}/v1/chat/completions",
                        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "max_tokens": 2},
                        headers=[(RESIDENCY, "IN"), (RESIDENCY, "EU")])
    assert answer.status_code == 200
    assert harness.served_since(before) == {"alpha": 0, "beta": 0, "gamma": 1}


def test_an_unknown_model_is_answered_404(harness: Harness) -> None:
    scenarios.unknown_model_is_refused(harness)


def test_a_body_too_large_to_read_the_model_from_is_answered_413(harness: Harness) -> None:
    scenarios.oversized_body_is_refused(harness)


def test_read_back_equals_what_was_applied(harness: Harness) -> None:
    scenarios.read_back_equals_desired(harness)


def test_a_config_nginx_rejects_leaves_the_previous_one_serving(harness: Harness) -> None:
    scenarios.failed_validation_keeps_the_previous_config(harness)


def test_the_apply_record_says_a_reload_was_used_and_how_long_it_took(
        harness: Harness) -> None:
    harness.apply(route({"alpha": 5000, "beta": 5000}))
    result = harness.apply(route({"alpha": 2500, "beta": 7500}, revision=2))
    assert result.method == "reload"
    assert re.search(r"reload used: SIGHUP .* in \d+ ms", result.detail), result.detail
    again = harness.apply(route({"alpha": 2500, "beta": 7500}, revision=2))
    assert again.method == "none"


def test_read_back_refuses_a_config_file_nginx_has_not_loaded(
        harness: Harness, nginx: NginxProcess) -> None:
    harness.apply(route({"alpha": 10000}))
    conf = nginx.settings.conf
    loaded = conf.read_text()
    conf.write_text(loaded.replace("# fleetctl-version: ", "# fleetctl-version: edited-"))
    try:
        with pytest.raises(AdapterError) as caught:
            harness.adapter.read_back()
        assert not caught.value.permanent
    finally:
        conf.write_text(loaded)
    assert harness.adapter.read_back() == {"chat": {"alpha": 10000}}


def test_nginx_light_has_no_per_pool_counters(harness: Harness) -> None:
    assert harness.adapter.pool_counters() == {}


def test_reloads_under_load_lose_no_request(harness: Harness) -> None:
    scenarios.reloads_under_load_lose_no_request(harness)


def test_the_model_can_come_from_a_header_instead_of_the_body(
        tmp_path: Path, sim_fleet: SimProcess) -> None:
    process = NginxProcess(tmp_path / "by-header", model_source="header").start(timeout_s=60)
    try:
        h = Harness(url=process.url, adapter=NginxAdapter(process.gateway), sim=sim_fleet)
        h.apply(route({"beta": 10000}))
        before = h.served()
        ask(h.client(**{"X-Fleetctl-Model": MODEL}))
        assert h.served_since(before)["beta"] == 1
        missing = scenarios.error_of(lambda: ask(h.client()))
        assert missing.status_code == 400
    finally:
        process.stop()


def test_a_stopped_nginx_is_a_retryable_error_within_two_seconds(
        tmp_path: Path, sim_fleet: SimProcess) -> None:
    process = NginxProcess(tmp_path / "gone").start(timeout_s=60)
    adapter = NginxAdapter(process.gateway)
    h = Harness(url=process.url, adapter=adapter, sim=sim_fleet)
    h.apply(route({"alpha": 10000}))
    process.stop()
    scenarios.apply_is_refused_quickly_when_the_gateway_is_down(
        adapter, h.desired(route({"alpha": 5000, "beta": 5000}, revision=2)))


def test_median_apply_times_are_printed(harness: Harness,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        scenarios.apply_timings(harness)
