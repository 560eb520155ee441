"""nginx's JSON access log: a real nginx writing `log_format fleetctl escape=json` lines,
read back into LogRecords whose pool is named from the server address through the gateway's
endpoints (checked against the pools' own counts)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from fleetctl.demo.nginx_process import NginxProcess
from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import LogRecord
from fleetctl.traffic.gateways.nginx.accesslog import parse_line
from fleetctl.traffic.gateways.nginx.adapter import NginxAdapter
from tests.sim.simproc import SimProcess
from tests.support.waiting import wait_until
from tests.traffic.accesslog import abandon, chat, log_offset, read_records
from tests.traffic.scenarios import POOLS, Harness, route

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logged_nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxProcess]:
    prefix = tmp_path_factory.mktemp("nginx-log")
    process = NginxProcess(prefix, access_log=str(prefix / "access.log"))
    yield process.start(timeout_s=60)
    process.stop()


def records(path: Path, since: int, count: int,
            endpoints: dict[str, str]) -> list[LogRecord]:
    return read_records(path, since, count, parse_line, endpoints)


def test_each_request_is_one_json_line_naming_its_route_and_pool(
        sim_fleet: SimProcess, logged_nginx: NginxProcess) -> None:
    assert registry.get("nginx").parse_access_log is parse_line
    harness = Harness(url=logged_nginx.url, adapter=NginxAdapter(logged_nginx.gateway),
                      sim=sim_fleet)
    harness.apply(route({"alpha": 5_000, "beta": 5_000}))
    endpoints = {urlsplit(sim_fleet.url(name)).netloc: name for name in POOLS}
    path = Path(logged_nginx.gateway.options["access_log"])
    since = log_offset(path)
    before = harness.served()
    statuses = [chat(logged_nginx.url, stream=n % 2 == 0) for n in range(6)]
    refused = httpx.post(f"{logged_nginx.url}/v1/chat/completions", timeout=10,
                         json={"model": "no-such-model", "messages": []}).status_code
    found = records(path, since, 7, endpoints)
    assert statuses == [200] * 6 and refused == 404
    served = harness.served_since(before)
    answered = found[:6]
    assert {r.route for r in answered} == {"chat"}
    assert {pool: sum(r.pool == pool for r in answered) for pool in POOLS} == served
    assert [r.streamed for r in answered] == [True, False] * 3
    assert {(r.status, r.attempts) for r in answered} == {(200, 1)}
    for record in answered:
        # $upstream_header_time: the time to the pool's headers, within $request_time.
        assert record.ttft_ms is not None and 0 <= record.ttft_ms <= record.duration_ms + 1
        assert record.bytes_out > 0 and abs(record.start - time.time()) < 600
    assert (found[6].route, found[6].pool, found[6].status, found[6].attempts) == (
        "", "", 404, 0)


def test_servers_tried_in_turn_count_as_attempts_and_the_last_names_the_pool() -> None:
    line = (b'{"msec":1700000001.500,"request_time":0.500,"route":"route-chat",'
            b'"upstream":"127.0.0.1:9, 127.0.0.1:8001","status":200,"bytes":10,'
            b'"header_time":"0.001, 0.120","ctype":"text/event-stream"}\n')
    assert parse_line(line, {"127.0.0.1:8001": "alpha"}) == LogRecord(
        start=1700000001.0, route="chat", pool="alpha", status=200, duration_ms=500.0,
        ttft_ms=120.0, bytes_out=10, attempts=2, streamed=True)
    assert parse_line(b"\n", {}) is None
    with pytest.raises(ValueError):
        parse_line(b"127.0.0.1 - - [date] GET / 200\n", {})


def test_a_failed_connect_tried_on_the_next_server_counts_two_attempts(
        sim_fleet: SimProcess, logged_nginx: NginxProcess) -> None:
    from fleetctl.core.ports import free_port
    from fleetctl.traffic.gateways.base import PoolTarget

    closed = f"127.0.0.1:{free_port()}"
    two = PoolTarget(name="two", base_urls=(f"http://{closed}", sim_fleet.url("beta")),
                     jurisdiction="US")
    harness = Harness(url=logged_nginx.url, adapter=NginxAdapter(logged_nginx.gateway),
                      sim=sim_fleet, extra_pools={"two": two})
    harness.apply(route({"two": 10_000}, key="retry"))
    endpoints = {closed: "two", urlsplit(sim_fleet.url("beta")).netloc: "two"}
    path = Path(logged_nginx.gateway.options["access_log"])
    since = log_offset(path)
    statuses = [chat(logged_nginx.url, stream=False) for _ in range(4)]
    found = records(path, since, 4, endpoints)
    assert statuses == [200] * 4
    assert [(r.route, r.pool, r.status) for r in found] == [("retry", "two", 200)] * 4
    # Round robin sends one of the first two to the closed port; proxy_next_upstream tries
    # the other server, and $upstream_addr lists both.
    assert max(r.attempts for r in found[:2]) == 2


def fault(sim: SimProcess, pool: str, **faults: float) -> None:
    answer = httpx.post(f"{sim.url(pool)}/admin/faults", json=faults, timeout=5)
    assert answer.status_code == 200, answer.text


def test_a_client_that_hangs_up_before_the_headers_is_a_499_and_set_apart(
        sim_fleet: SimProcess, logged_nginx: NginxProcess) -> None:
    harness = Harness(url=logged_nginx.url, adapter=NginxAdapter(logged_nginx.gateway),
                      sim=sim_fleet)
    harness.apply(route({"alpha": 10_000, "beta": 0}, key="hang"))
    endpoints = {urlsplit(sim_fleet.url(name)).netloc: name for name in POOLS}
    path = Path(logged_nginx.gateway.options["access_log"])

    def on_hang(since: int) -> list[LogRecord]:
        return [r for r in records(path, since, 0, endpoints) if r.route == "hang"]

    # Abandoned at once, on a pool that holds its headers 10 s.
    since = log_offset(path)
    fault(sim_fleet, "alpha", added_latency_ms=10_000)
    try:
        assert abandon(logged_nginx.url, stream=True) == b""
        (before,) = wait_until(lambda: on_hang(since), what="the hang-up's line")
    finally:
        fault(sim_fleet, "alpha", added_latency_ms=0)
    assert (before.pool, before.status, before.ttft_ms, before.ended_by) == (
        "alpha", 499, None, "client")

    # Abandoned after its first token: nginx keeps the 200 it sent, as it does for a pool that
    # breaks off mid-answer, so its log cannot say whose doing it was. Nothing is set apart.
    since = log_offset(path)
    fault(sim_fleet, "alpha", slowdown=50)
    try:
        assert b"data:" in abandon(logged_nginx.url, stream=True, max_tokens=500,
                                   read_until=b"data:")
        (after,) = wait_until(lambda: on_hang(since), what="the hang-up's line")
    finally:
        fault(sim_fleet, "alpha", slowdown=1)
    assert (after.status, after.ended_by) == (200, "")
