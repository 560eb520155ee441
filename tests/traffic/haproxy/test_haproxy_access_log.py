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
from fleetctl.traffic.gateways.haproxy.accesslog import ended_by, parse_line
from fleetctl.traffic.gateways.haproxy.adapter import HAProxyAdapter
from tests.sim.simproc import SimProcess
from tests.support.waiting import wait_until
from tests.traffic.accesslog import abandon, chat, read_records
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


def fault(sim: SimProcess, pool: str, **faults: float) -> None:
    answer = httpx.post(f"{sim.url(pool)}/admin/faults", json=faults, timeout=5)
    assert answer.status_code == 200, answer.text


def test_a_client_that_hangs_up_is_logged_with_a_c_termination_state_and_set_apart(
        sim_fleet: SimProcess, logged_haproxy: HAProxyProcess) -> None:
    harness = Harness(url=logged_haproxy.url, adapter=HAProxyAdapter(logged_haproxy.gateway),
                      sim=sim_fleet)
    harness.apply(route({"alpha": 10_000, "beta": 0}, key="hang"))
    path = Path(logged_haproxy.gateway.options["access_log"])

    def on_hang(since: int) -> list[LogRecord]:
        return [r for r in records(path, since, 0) if r.route == "hang"]

    # Abandoned after its first token, on a pool 50 times slower than usual per token.
    since = path.stat().st_size
    fault(sim_fleet, "alpha", slowdown=50)
    try:
        first = abandon(logged_haproxy.url, stream=True, max_tokens=500, read_until=b"data:")
        (after,) = wait_until(lambda: on_hang(since), what="the hang-up's line")
    finally:
        fault(sim_fleet, "alpha", slowdown=1)
    assert b"data:" in first
    # CD: "the client unexpectedly aborted during data transfer".
    assert (after.pool, after.status, after.flags[:2], after.ended_by) == (
        "alpha", 200, "CD", "client")
    assert after.streamed and after.ttft_ms is not None  # the pool's header time

    # Abandoned at once, on a pool that holds its headers 1.5 s: HAProxy (no `option
    # abortonclose`) waits for them and finds the client gone when it forwards the answer.
    since = path.stat().st_size
    fault(sim_fleet, "alpha", added_latency_ms=1500)
    try:
        assert abandon(logged_haproxy.url, stream=True) == b""
        (before,) = wait_until(lambda: on_hang(since), what="the hang-up's line")
    finally:
        fault(sim_fleet, "alpha", added_latency_ms=0)
    assert before.flags[:1] == "C" and before.ended_by == "client", before
    assert before.pool == "alpha" and before.status < 500


@pytest.mark.parametrize(("status", "term", "by"), [
    (200, "CD--", "client"), (0, "CH--", "client"), (0, "CQ--", "client"),
    (400, "CR--", "client"), (200, "cD--", "client"), (0, "CC--", "client"),
    # The server's side ended it: the pool's, also with the 200 it had sent (SD, sD).
    (200, "SD--", "pool"), (200, "sD--", "pool"), (502, "SH--", "pool"),
    (504, "sH--", "pool"), (503, "SC--", "pool"),
    # A 5xx stays the pool's error, whoever left first.
    (503, "CC--", ""), (502, "CH--", ""),
    (200, "", ""), (200, "LR--", ""), (403, "PR--", ""),
])
def test_who_ended_the_request_is_read_from_the_termination_state(status: int, term: str,
                                                                  by: str) -> None:
    assert ended_by(status, term) == by
