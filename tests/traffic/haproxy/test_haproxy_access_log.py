"""HAProxy's JSON access log: a real HAProxy, its log stream appended to a file by the
process that started it, and each line read back into a LogRecord naming the route and the
pool that answered (checked against the pools' own counts)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetctl.demo.haproxy_process import HAProxyProcess
from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import LogRecord
from fleetctl.traffic.gateways.haproxy.accesslog import parse_line
from fleetctl.traffic.gateways.haproxy.adapter import HAProxyAdapter
from tests.sim.simproc import SimProcess
from tests.traffic.accesslog import chat, read_records
from tests.traffic.scenarios import Harness, route

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logged_haproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HAProxyProcess]:
    directory = tmp_path_factory.mktemp("haproxy-log")
    process = HAProxyProcess(directory, access_log=str(directory / "access.log"))
    yield process.start(timeout_s=60)
    process.stop()


def records(path: Path, since: int, count: int) -> list[LogRecord]:
    return read_records(path, since, count, parse_line)


def test_each_request_is_one_json_line_naming_its_route_and_pool(
        sim_fleet: SimProcess, logged_haproxy: HAProxyProcess) -> None:
    assert registry.get("haproxy").parse_access_log is parse_line
    harness = Harness(url=logged_haproxy.url, adapter=HAProxyAdapter(logged_haproxy.gateway),
                      sim=sim_fleet)
    harness.apply(route({"alpha": 10_000, "beta": 0}))
    path = Path(logged_haproxy.gateway.options["access_log"])
    since = path.stat().st_size
    before = harness.served()
    statuses = [chat(logged_haproxy.url, stream=stream) for stream in (True, False, True)]
    refused = httpx.post(f"{logged_haproxy.url}/v1/chat/completions", timeout=10,
                         json={"model": "no-such-model", "messages": []}).status_code
    found = records(path, since, 4)
    assert statuses == [200, 200, 200] and refused == 404
    assert harness.served_since(before) == {"alpha": 3, "beta": 0, "gamma": 0}
    assert [(r.route, r.pool, r.status, r.attempts, r.streamed) for r in found] == [
        ("chat", "alpha", 200, 1, True), ("chat", "alpha", 200, 1, False),
        ("chat", "alpha", 200, 1, True), ("", "", 404, 0, False)]
    for record in found[:3]:
        # %Tr: the time to the pool's response headers, within the whole request's %Ta.
        assert record.ttft_ms is not None and 0 <= record.ttft_ms <= record.duration_ms
        assert record.bytes_out > 0 and abs(record.start - time.time()) < 600
    assert found[3].ttft_ms is None


def test_haproxy_messages_and_blank_lines_are_no_request() -> None:
    assert parse_line(b"[NOTICE]   (1) : New worker (2) forked\n", {}) is None
    assert parse_line(b"\n", {}) is None
    with pytest.raises(ValueError):
        parse_line(b'{"start":1.0,"backend":"route-x"}\n', {})
    with pytest.raises(ValueError):
        parse_line(b'{"start":1.0,"backend":\n', {})


def test_without_the_option_nothing_is_logged(tmp_path: Path) -> None:
    from fleetctl.traffic.gateways.base import DesiredState
    from fleetctl.traffic.gateways.haproxy.render import HAProxySettings, render_config

    process = HAProxyProcess(tmp_path)
    text = render_config(DesiredState(routes=(), pools={}),
                         HAProxySettings.from_gateway(process.gateway)).text
    assert "log-format" not in text and "log stdout" not in text


def test_a_failed_connect_redispatched_to_another_server_counts_two_attempts(
        sim_fleet: SimProcess, logged_haproxy: HAProxyProcess) -> None:
    from fleetctl.core.ports import free_port
    from fleetctl.traffic.gateways.base import PoolTarget

    closed = f"http://127.0.0.1:{free_port()}"
    two = PoolTarget(name="two", base_urls=(closed, sim_fleet.url("beta")), jurisdiction="US")
    harness = Harness(url=logged_haproxy.url, adapter=HAProxyAdapter(logged_haproxy.gateway),
                      sim=sim_fleet, extra_pools={"two": two})
    harness.apply(route({"two": 10_000}, key="retry"))
    path = Path(logged_haproxy.gateway.options["access_log"])
    since = path.stat().st_size
    statuses = [chat(logged_haproxy.url, stream=False) for _ in range(4)]
    found = records(path, since, 4)
    assert statuses == [200] * 4
    assert [(r.route, r.pool, r.status) for r in found] == [("retry", "two", 200)] * 4
    # Round robin sends one of the first two to the closed port: HAProxy retries and, with
    # `option redispatch`, the last retry goes to the other server (%rc is then "+N").
    assert max(r.attempts for r in found[:2]) >= 2
