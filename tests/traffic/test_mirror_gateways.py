"""Mirroring at real gateways (shadow runs): a real Envoy and a real nginx in front of real
simulated pools copy a share of a route's requests to a small aiohttp sink standing in for
the shadow collector. The share mirrored is counted at the sink and must fall inside a
Wilson interval around the percent asked for; every copy carries the route header and the
request's body unchanged; Envoy changes the share with one admin runtime update (no file
swap); 0 % mirrors nothing; a dead or slow collector leaves the live answers alone; HAProxy
renders no mirror and says so."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.demo.haproxy_process import HAProxyProcess
from fleetctl.demo.nginx_process import NginxProcess
from fleetctl.inference.confidence import wilson_interval
from fleetctl.traffic.gateways.base import MIRROR_HEADER, DesiredState, adapter_for
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
from fleetctl.traffic.gateways.nginx.adapter import NginxAdapter
from tests.sim.simproc import MODEL, SimProcess
from tests.support.waiting import observe_for, wait_until
from tests.traffic.scenarios import Harness, route

pytestmark = pytest.mark.slow


# --- a sink standing in for the shadow collector -------------------------------------------------

@dataclass
class Copy:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Sink:
    """An aiohttp server in a thread of its own: records every request it gets and answers
    204, after `delay_s` (a slow collector)."""

    port: int = field(default_factory=free_port)
    delay_s: float = 0.0
    copies: list[Copy] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Sink:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def record(request: web.Request) -> web.Response:
            self.copies.append(Copy(request.method, request.path_qs,
                                    {k.lower(): v for k, v in request.headers.items()},
                                    await request.read()))
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return web.Response(status=204)

        async def serve() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", record)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert ready.wait(10), "the sink did not start"
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def received(self, count: int, timeout_s: float = 10.0) -> list[Copy]:
        """The copies once there are `count` (mirrors trail their live requests)."""
        wait_until(lambda: len(self.copies) >= count, timeout_s=timeout_s, every_s=0.01,
                   what=f"{count} copies at the sink",
                   explain=lambda: f"{len(self.copies)} arrived")
        return list(self.copies)

    def settle(self, quiet_s: float = 0.5, timeout_s: float = 15.0) -> list[Copy]:
        """The copies once none arrived for `quiet_s`: mirrors trail their live requests, and
        how many a share gives is not known in advance, so a quiet spell is the end."""
        seen = {"count": -1, "since": time.monotonic()}

        def quiet() -> bool:
            now = time.monotonic()
            if len(self.copies) != seen["count"]:
                seen.update(count=len(self.copies), since=now)
            return now - seen["since"] >= quiet_s

        wait_until(quiet, timeout_s=timeout_s, every_s=0.02,
                   what=f"the copies to stop coming for {quiet_s:g} s")
        return list(self.copies)


@pytest.fixture
def sink() -> Iterator[Sink]:
    running = Sink().start()
    yield running
    running.stop()


def mirrored(harness: Harness, sink_url: str, *, bp: int, key: str = "chat") -> DesiredState:
    """A state of one route `key` (alpha 100 %) mirroring `bp` basis points to `sink_url`."""
    desired = harness.desired(route({"alpha": 10_000, "beta": 0}, key=key))
    return replace(desired, mirror_url=sink_url,
                   routes=tuple(replace(r, mirror_bp=bp) for r in desired.routes))


def send(harness: Harness, n: int, *, tag: str = "") -> list[bytes]:
    """`n` chat requests through the gateway, each with a body of its own; all answered 200.
    Returns the bodies sent."""
    bodies = []
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [
                {"role": "user", "content": f"mirror me {tag} {i} {uuid.uuid4().hex}"}]}).encode()
            answer = client.post(f"{harness.url}/v1/chat/completions", content=body,
                                 headers={"content-type": "application/json"})
            assert answer.status_code == 200, answer.text
            bodies.append(body)
    return bodies


def assert_share(copies: int, sent: int, bp: int) -> None:
    interval = wilson_interval(copies, sent, confidence=0.999)
    assert interval.lower <= bp / 10_000 <= interval.upper, (copies, sent, interval)


def assert_only_the_marker_arrives(harness: Harness, sink: Sink) -> None:
    """The end of "nothing is mirrored": the route mirrors 100 % again and one more request
    is sent; its copy arrives, and no copy of a request sent before it came first (a gateway
    sends a copy as its request comes in: those sent earlier would have arrived earlier)."""
    harness.adapter.apply(mirrored(harness, sink.url, bp=10_000))
    marker = send(harness, 1, tag="marker")
    assert [copy.body for copy in sink.received(1)] == marker


def assert_copies_of(copies: list[Copy], bodies: list[bytes], key: str) -> None:
    """Every copy is one of the requests sent, body byte for byte, with the route header."""
    sent = set(bodies)
    for copy in copies:
        assert copy.method == "POST" and copy.path == "/v1/chat/completions", copy
        assert copy.headers.get(MIRROR_HEADER) == key, copy.headers
        assert copy.body in sent, copy.body[:200]


# --- Envoy ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def envoy_gateway(sim_fleet: SimProcess, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Harness]:
    process = EnvoyProcess(tmp_path_factory.mktemp("envoy-mirror"), free_port(),
                           free_port()).start(timeout_s=60)
    adapter = EnvoyAdapter(process.gateway("mirror-envoy", load_timeout_s=30))
    harness = Harness(url=process.listen_url, adapter=adapter, sim=sim_fleet)
    harness.process = process  # type: ignore[attr-defined]
    yield harness
    process.stop()


def test_envoy_changes_the_share_with_one_runtime_update_and_keeps_it_over_a_restart(
        envoy_gateway: Harness, sink: Sink) -> None:
    adapter = envoy_gateway.adapter
    adapter.apply(mirrored(envoy_gateway, sink.url, bp=1000))
    routes_file = Path(adapter.options.config_dir) / envoy_config.ROUTES_FILE
    before = routes_file.stat().st_ino
    result = adapter.apply(mirrored(envoy_gateway, sink.url, bp=10_000))
    assert result.method == "runtime", result.detail  # no file swap, no reload
    assert routes_file.stat().st_ino == before
    assert adapter.read_back_mirror() == {"chat": 10_000}  # a read of its own
    bodies = send(envoy_gateway, 20, tag="all")
    assert len(sink.received(20)) == 20
    assert_copies_of(sink.copies, bodies, "chat")

    # 0 %: nothing is mirrored, and it is again one runtime update.
    result = adapter.apply(mirrored(envoy_gateway, sink.url, bp=0))
    assert result.method == "runtime", result.detail
    sink.copies.clear()
    send(envoy_gateway, 50, tag="none")
    adapter.read_back()
    assert adapter.read_back_mirror() == {}
    assert_only_the_marker_arrives(envoy_gateway, sink)  # ...as 100 % again, pushed last

    # A restart starts from the runtime file: the last share pushed, not the file's default.
    process: EnvoyProcess = envoy_gateway.process  # type: ignore[attr-defined]
    process.kill()
    process.start(timeout_s=60)
    adapter.read_back()
    assert adapter.read_back_mirror() == {"chat": 10_000}
    sink.copies.clear()
    send(envoy_gateway, 5, tag="restarted")
    assert len(sink.received(5)) == 5


def test_a_push_does_not_verify_while_envoy_holds_another_mirror_share(
        envoy_gateway: Harness, sink: Sink) -> None:
    adapter = envoy_gateway.adapter
    desired = mirrored(envoy_gateway, sink.url, bp=2500)
    adapter.apply(desired)
    key = next(k for k in envoy_config.render(desired).runtime if k.endswith("._mirror"))
    httpx.post(f"{adapter.gateway.admin_address}/runtime_modify",
               params={key: '{"numerator":100,"denominator":"TEN_THOUSAND"}'}, timeout=5)
    assert adapter.matches(desired, adapter.read_back())  # the weights are right...
    verified, why = adapter.mirror_matches(desired)
    assert not verified and "{'chat': 100}" in why  # ...the mirror fraction is not


# --- nginx ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nginx_gateway(sim_fleet: SimProcess, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Harness]:
    process = NginxProcess(tmp_path_factory.mktemp("nginx-mirror")).start(timeout_s=60)
    yield Harness(url=process.url, adapter=NginxAdapter(process.gateway), sim=sim_fleet)
    process.stop()


def test_nginx_at_0_percent_mirrors_nothing(nginx_gateway: Harness, sink: Sink) -> None:
    nginx_gateway.adapter.apply(mirrored(nginx_gateway, sink.url, bp=0))
    nginx_gateway.adapter.read_back()
    assert nginx_gateway.adapter.read_back_mirror() == {}
    send(nginx_gateway, 50, tag="none")
    assert_only_the_marker_arrives(nginx_gateway, sink)


# --- both ----------------------------------------------------------------------------------------

@pytest.fixture(params=["envoy_gateway", "nginx_gateway"])
def mirroring(request: pytest.FixtureRequest) -> Harness:
    """Each gateway kind that mirrors and runs here."""
    return request.getfixturevalue(request.param)


def test_the_share_asked_for_is_mirrored_with_the_route_header_and_the_body(
        mirroring: Harness, sink: Sink) -> None:
    desired = mirrored(mirroring, sink.url, bp=3000)
    mirroring.adapter.apply(desired)
    assert mirroring.adapter.matches(desired, mirroring.adapter.read_back())
    assert mirroring.adapter.mirror_matches(desired) == (True, "")
    bodies = send(mirroring, 400)
    copies = sink.settle()
    assert_share(len(copies), len(bodies), 3000)
    assert_copies_of(copies, bodies, "chat")


def test_live_answers_never_wait_for_a_collector_that_is_down_or_slow(
        mirroring: Harness) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    mirroring.adapter.apply(mirrored(mirroring, down, bp=10_000))
    send(mirroring, 10, tag="down")  # every one answered 200

    slow = Sink(delay_s=5.0).start()
    try:
        mirroring.adapter.apply(mirrored(mirroring, slow.url, bp=10_000))
        started = time.monotonic()
        send(mirroring, 3, tag="slow")
        elapsed = time.monotonic() - started
        assert len(slow.received(3)) == 3  # the copies went out...
        assert elapsed < 5.0, elapsed  # ...and no live answer waited for one (each takes 5 s)
    finally:
        slow.stop()


# --- HAProxy -------------------------------------------------------------------------------------

def test_haproxy_renders_no_mirror_and_says_so(sim_fleet: SimProcess, tmp_path: Path,
                                               sink: Sink) -> None:
    process = HAProxyProcess(tmp_path / "haproxy").start(timeout_s=60)
    try:
        harness = Harness(url=process.url, adapter=adapter_for(process.gateway), sim=sim_fleet)
        assert type(harness.adapter).supports_mirror is False
        desired = mirrored(harness, sink.url, bp=10_000)
        result = harness.adapter.apply(desired)
        assert "HAProxy cannot mirror" in result.warning and "chat" in result.warning
        assert "use a replay shadow run" in result.warning
        assert harness.adapter.matches(desired, harness.adapter.read_back())
        assert harness.adapter.mirror_matches(desired) == (True, "")  # nothing to hold
        send(harness, 10, tag="haproxy")
        # A negative check with no later event to wait for (HAProxy mirrors nothing at all,
        # so there is no copy to come after a stray one): a window of time.
        observe_for(0.3, lambda: sink.copies == [], what="no copy at the sink")
    finally:
        process.stop()
