"""What only nginx does, against a real nginx-light 1.22 in front of real simulated pools: its
answer to a repeated residency header, a read-back that checks the loaded config, and the
model taken from a header. What every gateway kind does is in tests/traffic/contract/."""

from __future__ import annotations

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
