"""Envoy's JSON access log, retries and outlier detection, with a real Envoy in front of real
simulated pools: what the log says is checked against what the pools were made to do
(faults, a slow prefill, a closed port), and ejections against Envoy's own admin stats."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import DesiredState, LogRecord, PoolTarget, RouteSpec
from fleetctl.traffic.gateways.envoy.accesslog import ended_by, parse_line
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
from tests.sim.simproc import MODEL, SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until
from tests.traffic.accesslog import abandon, chat, log_offset, read_records

pytestmark = pytest.mark.slow

# slow: a prefill of 4,000 tokens/s, so a long prompt's first token comes long after the
# headers (the simulator sends those at once); the others are quick.
SIM_POOLS = {"slow": "prefill", "ok": "quick", "bad": "quick", "spare": "quick"}
LONG_PROMPT = "word " * 2000  # ~2,000 tokens: ~500 ms of prefill on `slow`


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("log-sims"), TEST_PROFILES, SIM_POOLS,
                            models=[MODEL])
    yield sim
    sim.stop()


@dataclass
class Logged:
    process: EnvoyProcess
    adapter: EnvoyAdapter
    sims: SimProcess

    def apply(self, pools: dict[str, tuple[str, ...]], *routes: RouteSpec) -> None:
        self.adapter.apply(DesiredState(routes=routes, pools={
            name: PoolTarget(name, urls, "US") for name, urls in pools.items()}))

    def offset(self) -> int:
        path = self.process.access_log_path
        assert path is not None
        return log_offset(path)

    def records(self, since: int, count: int, timeout_s: float = 30.0) -> list[LogRecord]:
        """The records written after byte `since`, once there are `count` (Envoy flushes its
        log every 250 ms here)."""
        path = self.process.access_log_path
        assert path is not None
        return read_records(path, since, count, parse_line, timeout_s=timeout_s)

    def fault(self, pool: str, **faults: float) -> None:
        answer = httpx.post(f"{self.sims.url(pool)}/admin/faults", json=faults, timeout=5)
        assert answer.status_code == 200, answer.text

    def stats(self, prefix: str) -> dict[str, int]:
        text = httpx.get(f"{self.process.admin_url}/stats", params={"filter": prefix},
                         timeout=5).text
        found = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                found[name] = int(value)
        return found


@pytest.fixture(scope="module")
def logged(sims: SimProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Logged]:
    process = EnvoyProcess(tmp_path_factory.mktemp("envoy-log"), free_port(),
                           free_port()).start(timeout_s=60)
    adapter = EnvoyAdapter(process.gateway("log-gw", load_timeout_s=30))
    yield Logged(process=process, adapter=adapter, sims=sims)
    process.stop()


def route(key: str, weights: dict[str, int], latency_class: str = "") -> RouteSpec:
    return RouteSpec(key=key, model=MODEL, latency_class=latency_class, residency="",
                     revision=1, weights=weights)


def test_the_kind_registry_offers_the_parser_and_the_gateway_names_its_log(
        logged: Logged, settings) -> None:
    settings.FLEETCTL_GATEWAY_KINDS = ["tests.traffic.fake_kind"]
    kind = registry.get("envoy")
    assert kind.parse_access_log is parse_line
    # Kinds that write no access log fleetctl reads.
    assert registry.get("gateway-api").parse_access_log is None
    assert registry.get("file").parse_access_log is None
    assert kind.parse_options(logged.process.gateway().options).access_log == str(
        logged.process.access_log_path)


def test_streamed_and_plain_answers_are_logged_with_route_pool_and_first_body_byte(
        logged: Logged) -> None:
    logged.apply({"slow": (logged.sims.url("slow"),), "ok": (logged.sims.url("ok"),)},
                 route("prefill", {"slow": 10_000}), route("quick", {"ok": 10_000}, "fast"))
    since = logged.offset()
    assert chat(logged.process.listen_url, stream=True, prompt=LONG_PROMPT) == 200
    assert chat(logged.process.listen_url, stream=False, latency_class="fast") == 200
    logged.fault("ok", added_latency_ms=300)
    try:
        assert chat(logged.process.listen_url, stream=True, latency_class="fast") == 200
    finally:
        logged.fault("ok", added_latency_ms=0)
    assert httpx.get(f"{logged.process.listen_url}/nowhere", timeout=5).status_code == 404
    streamed, plain, delayed, unknown = logged.records(since, 4)
    assert (streamed.route, streamed.pool, streamed.status, streamed.attempts) == (
        "prefill", "slow", 200, 1)
    assert streamed.streamed and not plain.streamed and delayed.streamed
    # The prefill delays the first token, not the headers (sent at once): the logged time is
    # the first body byte's.
    assert streamed.ttft_ms is not None and streamed.ttft_ms >= 300
    assert streamed.duration_ms >= streamed.ttft_ms
    assert (plain.route, plain.pool, plain.status) == ("quick", "ok", 200)
    assert plain.bytes_out > 0 and plain.ttft_ms is not None
    assert delayed.ttft_ms is not None and delayed.ttft_ms >= 300
    assert abs(streamed.start - time.time()) < 600
    # Envoy's own answers: no fleetctl route, no pool, no upstream attempt, no first byte.
    assert (unknown.route, unknown.pool, unknown.status, unknown.attempts,
            unknown.ttft_ms) == ("", "", 404, 0, None)


def test_a_failed_connect_is_retried_on_another_endpoint_and_logged_as_two_attempts(
        logged: Logged) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    logged.apply({"two": (closed, logged.sims.url("spare"))}, route("retry", {"two": 10_000}))
    since = logged.offset()
    statuses = [chat(logged.process.listen_url, stream=False) for _ in range(20)]
    records = logged.records(since, 20)
    assert statuses == [200] * 20
    assert [(r.route, r.pool, r.status) for r in records] == [("retry", "two", 200)] * 20
    # The balancer picks the closed port first for about half of them: each of those took
    # another attempt. A retry avoids the host it failed on (previous_hosts) for up to 5 host
    # selections, but with two endpoints every selection can land on the closed one again,
    # so a request may take all 3 attempts (rarely); after 5 failed connects outlier
    # detection ejects the closed endpoint. P(no 1, or no 2+, in 20) = 2 x 2^-20.
    attempts = [r.attempts for r in records]
    assert set(attempts) <= {1, 2, 3} and 1 in attempts and max(attempts) >= 2, attempts


def test_consecutive_5xx_eject_one_endpoint_and_never_the_last_one(logged: Logged) -> None:
    logged.apply({"flaky": (logged.sims.url("bad"), logged.sims.url("ok")),
                  "broken": (logged.sims.url("bad"),)},
                 route("flaky", {"flaky": 10_000}), route("broken", {"broken": 10_000}, "one"))
    logged.fault("bad", error_rate=1.0)
    try:
        since = logged.offset()
        flaky = [chat(logged.process.listen_url, stream=False) for _ in range(40)]
        stats = logged.stats("outlier_detection")
        assert stats["cluster.flaky.outlier_detection.ejections_enforced_consecutive_5xx"] >= 1
        assert stats["cluster.flaky.outlier_detection.ejections_active"] == 1
        # A 5xx is an answer, never retried: the pool's errors reach the client until the
        # endpoint is ejected, and none after (it stays out 30 s).
        assert 5 <= flaky.count(500) <= 10 and flaky[-10:] == [200] * 10
        records = logged.records(since, 40)
        assert {r.attempts for r in records} == {1}
        assert [r.status for r in records] == flaky

        # A pool whose only endpoint fails keeps it: ejecting it would pass max_ejection_percent
        # (Envoy counts an overflow instead), so the errors stay visible as the pool's, for
        # the health policy and the ramp guard to act on.
        broken = [chat(logged.process.listen_url, stream=False, latency_class="one")
                  for _ in range(8)]
        assert broken == [500] * 8
        stats = logged.stats("cluster.broken.outlier_detection")
        prefix = "cluster.broken.outlier_detection"
        assert stats[f"{prefix}.ejections_detected_consecutive_5xx"] >= 1
        assert stats[f"{prefix}.ejections_overflow"] >= 1  # over max_ejection_percent
        assert stats[f"{prefix}.ejections_active"] == 0
    finally:
        logged.fault("bad", error_rate=0.0)


def test_a_client_that_hangs_up_is_logged_dc_and_set_apart_as_the_clients_doing(
        logged: Logged) -> None:
    url = logged.process.listen_url
    logged.apply({"ok": (logged.sims.url("ok"),)}, route("hang", {"ok": 10_000}))

    def logged_on_hang(since: int) -> list[LogRecord]:
        # Envoy flushes its log every 250 ms: a line of an earlier test may come after `since`.
        return [r for r in logged.records(since, 0, timeout_s=0) if r.route == "hang"]

    # A streamed request to a pool slow to answer (its headers held 10 s), abandoned at once,
    # with no credentials, as anyone who can reach the gateway.
    since = logged.offset()
    logged.fault("ok", added_latency_ms=10_000)
    try:
        assert abandon(url, stream=True) == b""
        (before,) = wait_until(lambda: logged_on_hang(since), what="the hang-up's line")
    finally:
        logged.fault("ok", added_latency_ms=0)
    # And one abandoned after its first token (each token 50 times slower than usual: the
    # answer is far from done).
    since = logged.offset()
    logged.fault("ok", slowdown=50)
    try:
        first = abandon(url, stream=True, max_tokens=500, read_until=b"data:")
        (after,) = wait_until(lambda: logged_on_hang(since), what="the hang-up's line")
    finally:
        logged.fault("ok", slowdown=1)
    assert first.startswith(b"HTTP/1.1 200") and b"data:" in first
    # Before any answer: status 0 and the flag DC alone. The client's, not the pool's.
    assert (before.route, before.pool, before.status, before.flags, before.ttft_ms) == (
        "hang", "ok", 0, "DC", None)
    assert before.ended_by == "client"
    # After the first token: the status sent and DC; the first byte's time is the pool's.
    assert (after.pool, after.status, after.flags, after.streamed) == ("ok", 200, "DC", True)
    assert after.ended_by == "client" and after.ttft_ms is not None


class BrokenPool:
    """A "pool" on a socket of our own that fails on purpose: `close` hangs up on each request
    at once, `break-off` sends the headers and one event of a streamed answer, then resets."""

    def __init__(self) -> None:
        self.how = "close"
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            seen = b""
            while b"\r\n\r\n" not in seen:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                seen += chunk
            if self.how == "break-off":
                event = b'data: {"choices": []}\n\n'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n"
                             + f"{len(event):x}\r\n".encode() + event + b"\r\n")
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        self.server.close()


def test_a_pool_that_fails_is_the_pools_even_with_status_0_or_a_200_already_sent(
        logged: Logged) -> None:
    broken = BrokenPool()
    try:
        logged.apply({"broken": (broken.url,)}, route("broken", {"broken": 10_000}))
        since = logged.offset()
        hung_up = chat(logged.process.listen_url, stream=True)
        broken.how = "break-off"
        with pytest.raises(httpx.HTTPError):  # the answer ends mid-stream
            chat(logged.process.listen_url, stream=True)

        def on_broken() -> list[LogRecord]:
            found = [r for r in logged.records(since, 0, timeout_s=0) if r.route == "broken"]
            return found if len(found) == 2 else []

        closed, cut = wait_until(on_broken, what="both requests' lines")
    finally:
        broken.close()
    assert hung_up == 503
    assert (closed.status, closed.ended_by) == (503, "pool") and "UC" in closed.flags
    # The answer had begun (200 sent): only the flag says the pool broke it off.
    assert (cut.status, cut.flags, cut.ended_by) == (200, "UPE", "pool")


@pytest.mark.parametrize(("status", "flags", "by"), [
    (0, "DC", "client"), (200, "DC", "client"), (404, "DC", "client"),
    # The pool failed too: DC with a failure of the pool's is the pool's (module docstring).
    (0, "DC,UC", "pool"), (0, "UF,URX,DC", "pool"), (200, "DC,UPE", "pool"),
    (504, "UT", "pool"), (200, "UR", "pool"), (200, "SI", "pool"),
    # A 5xx answered, then a hang-up: the status says it all (the pool's error).
    (503, "DC", ""),
    # A flag we do not know beside DC: nothing is set apart on a guess; status 0 stays an
    # error of the pool's, as before.
    (0, "DC,DI", ""), (0, "", ""), (200, "-", ""), (429, "RL", ""),
])
def test_who_ended_the_request_is_read_from_the_flags(status: int, flags: str, by: str) -> None:
    assert ended_by(status, flags) == by


@pytest.mark.parametrize("line", [b"", b"\n", b"  \n"])
def test_blank_lines_are_no_request(line: bytes) -> None:
    assert parse_line(line, {}) is None


@pytest.mark.parametrize("line", [b"not json\n", b"[1, 2]\n", b'{"route": "x"}\n',
                                  b'{"start": "x", "route": "r", "pool": "p", "status": 200,'
                                  b' "duration_ms": 1}\n'])
def test_a_line_that_is_not_ours_is_malformed(line: bytes) -> None:
    with pytest.raises(ValueError):
        parse_line(line, {})


def test_dashes_and_nulls_read_as_none() -> None:
    line = (b'{"start":"1700000000.250","route":"chat","pool":"-","status":"-",'
            b'"duration_ms":"-","ttft_ms":"-","bytes":null,"attempts":null,"ctype":null,'
            b'"flags":"UF"}\n')
    assert parse_line(line, {}) == LogRecord(
        start=1700000000.25, route="chat", pool="", status=0, duration_ms=0.0, ttft_ms=None,
        bytes_out=0, attempts=0, streamed=False, flags="UF", ended_by="pool")


def test_the_access_log_is_off_without_a_path(tmp_path: Path) -> None:
    process = EnvoyProcess(tmp_path, 1, 2, access_log=False)
    assert process.access_log_path is None
    assert "access_log" not in process.gateway().options
