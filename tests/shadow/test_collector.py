"""The shadow collector as it runs: a real `python -m fleetctl.shadow.collector` process on a
free port and a real Redis (a database of these tests' own, so the session's Celery worker
does not take the `shadow.pair` messages it enqueues). No Celery worker is needed: the
messages are read from the `shadow` queue's list in Redis.

Every mirrored request for a route with a running run is counted `received` and exactly one
of `sampled` or `dropped_<reason>`; a request for a route without one is counted unmatched.
A request for a route with a running run that does not carry the mirror token of one of the
route's gateways is refused (403) and counted `refused_unauthenticated`, and nothing else:
not received, no rate or token budget spent, nothing queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import threading
import time
from datetime import UTC, datetime

import aiohttp
import httpx
import psutil
import redis

from fleetctl.demo.devstack import free_port
from fleetctl.shadow import collector as collector_module
from fleetctl.shadow import live
from fleetctl.traffic import mirror_auth
from fleetctl.traffic.gateways.base import MIRROR_AUTH_HEADER
from tests.shadow.collector_proc import (
    CHAT,
    GATEWAY,
    ROUTE,
    RUN,
    SECRET,
    counted,
    counters_when,
    publish_gateways,
    queued_kwargs,
    settled,
)
from tests.support.waiting import wait_until


def test_it_answers_every_mirrored_request_at_once_and_counts_each_outcome(
        start_collector, shadow_redis):
    collector = start_collector(SHADOW_MAX_BODY_BYTES="4096")
    collector.publish()
    streamed = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    before = datetime.now(UTC)

    answers = {
        "valid": collector.post(CHAT).status_code,
        "valid, other path": collector.post(streamed, path="/v1/completions").status_code,
        "not json": collector.post(b"{not json").status_code,
        "json array": collector.post(b"[1, 2]").status_code,
        "no model": collector.post({"messages": []}).status_code,
        "empty": collector.post(b"").status_code,
        "too large": collector.post(b"x" * 10_000).status_code,
        "too large, chunked": collector.post(
            b"", content=iter([b"y" * 3000] * 4)).status_code,
        "no route header": collector.post(CHAT, route=None).status_code,
        "no running run": collector.post(CHAT, route="chat-eu").status_code,
    }

    assert answers == {
        "valid": 204, "valid, other path": 204, "not json": 204, "json array": 204,
        "no model": 204, "empty": 204, "too large": 413, "too large, chunked": 413,
        "no route header": 204, "no running run": 204}
    final = counted(RUN, received=8, sampled=2, dropped_malformed=4, dropped_too_large=2)
    assert settled(final)
    assert (final["dropped_rate"], final["dropped_tokens"], final["dropped_behind"]) == (0, 0, 0)
    wait_until(lambda: live.unmatched() == {live.NO_ROUTE: 1, "chat-eu": 1},
               what="the unmatched requests to be counted")
    tasks = queued_kwargs(shadow_redis)
    assert [task["request"] for task in tasks] == [CHAT, streamed]
    assert {(task["run_id"], task["source"]) for task in tasks} == {(RUN, "mirror")}
    for task in tasks:
        at = datetime.fromisoformat(task["received_at"])
        assert at.utcoffset() is not None and at.utcoffset().total_seconds() == 0
        assert before <= at <= datetime.now(UTC)
    health = collector.healthz()
    assert health["counters"]["unmatched"] == 2
    assert health["counters"]["sampled"] == 2
    assert httpx.get(f"{collector.url}/v1/chat/completions").status_code == 405


OTHER_ROUTE = "chat-eu"
OTHER_GATEWAY = 4_002  # carries OTHER_ROUTE only
OTHER_SECRET = mirror_auth.new_secret()


def test_copies_without_a_token_of_one_of_the_routes_gateways_are_refused_counted_and_free(
        start_collector, shadow_redis):
    collector = start_collector()
    collector.publish(max_rps=2)  # a burst of 2, then one every 0.5 s
    publish_gateways({
        ROUTE: {GATEWAY: [(mirror_auth.route_token(SECRET, ROUTE), None)]},
        OTHER_ROUTE: {OTHER_GATEWAY: [(mirror_auth.route_token(OTHER_SECRET, OTHER_ROUTE),
                                       None)]}})
    forged = {
        "no header": None,
        "empty": "",
        "a wrong HMAC": f"{GATEWAY}.{'0' * 64}",
        "an HMAC with another secret": mirror_auth.header_value(
            GATEWAY, mirror_auth.new_secret(), ROUTE),
        "the gateway's valid HMAC of another route": mirror_auth.header_value(
            GATEWAY, SECRET, OTHER_ROUTE),
        "another gateway's genuine token, replayed": mirror_auth.header_value(
            OTHER_GATEWAY, OTHER_SECRET, OTHER_ROUTE),
        "a genuine gateway's HMAC of a route it does not carry": mirror_auth.header_value(
            OTHER_GATEWAY, OTHER_SECRET, ROUTE),
        "the right token under another gateway's id": (
            f"{OTHER_GATEWAY}.{mirror_auth.route_token(SECRET, ROUTE)}"),
        "no gateway id": mirror_auth.route_token(SECRET, ROUTE),
        "the right token, then more": mirror_auth.header_value(GATEWAY, SECRET, ROUTE) + "0",
        "far too long": "9" * 5000,
    }

    answers = {what: collector.post(CHAT, auth=auth).status_code
               for what, auth in forged.items() for _ in range(3)}

    assert set(answers.values()) == {403}, answers
    n = 3 * len(forged)
    final = counted(RUN, refused_unauthenticated=n)
    assert (final["received"], final["sampled"], final["dropped_rate"]) == (0, 0, 0)
    assert shadow_redis.get(live.rate_key(RUN)) is None  # no rate budget spent
    assert shadow_redis.llen(live.SHADOW_QUEUE) == 0
    assert collector.healthz()["counters"]["refused_unauthenticated"] == n
    # The run's burst is whole: the forged copies took none of it.
    assert [collector.post(CHAT).status_code for _ in range(2)] == [204, 204]
    final = counted(RUN, received=2, sampled=2)
    assert final["dropped_rate"] == 0 and final["refused_unauthenticated"] == n
    assert [task["request"] for task in queued_kwargs(shadow_redis)] == [CHAT, CHAT]
    assert SECRET not in collector.log.read_text()


def test_a_rotated_out_secret_is_accepted_until_its_grace_ends(start_collector, shadow_redis):
    new, previous, older = SECRET, mirror_auth.new_secret(), mirror_auth.new_secret()
    now = time.time()
    publish_gateways({ROUTE: {GATEWAY: [
        (mirror_auth.route_token(new, ROUTE), None),
        (mirror_auth.route_token(previous, ROUTE), now + 600),  # rotated out just now
        (mirror_auth.route_token(older, ROUTE), now - 1),  # its grace is over
    ]}})
    live.publish_run(RUN, ROUTE, max_rps=100, max_tokens_per_day=10**6)
    collector = start_collector()
    collector.wait_for_gateways(ROUTE, [str(GATEWAY)], run=RUN)

    answers = [collector.post(CHAT, auth=mirror_auth.header_value(GATEWAY, secret, ROUTE))
               .status_code for secret in (new, previous, older)]

    assert answers == [204, 204, 403]
    counted(RUN, received=2, sampled=2, refused_unauthenticated=1)


def test_a_run_whose_route_no_gateway_carries_refuses_every_copy(start_collector,
                                                                 shadow_redis):
    publish_gateways({})  # e.g. the route's gateways were deleted, or Redis lost them
    live.publish_run(RUN, ROUTE, max_rps=100, max_tokens_per_day=10**6)
    collector = start_collector()
    collector.wait_for_gateways(ROUTE, [], run=RUN)

    assert [collector.post(CHAT).status_code for _ in range(2)] == [403, 403]

    counted(RUN, refused_unauthenticated=2, received=0)
    assert shadow_redis.llen(live.SHADOW_QUEUE) == 0


def test_it_never_connects_to_the_database(start_collector, settings):
    database = settings.DATABASES["default"]
    assert database["ENGINE"].endswith("postgresql"), "make test runs on PostgreSQL"
    collector = start_collector()
    collector.publish()
    collector.post_many(3)
    counted(RUN, received=3, sampled=3)

    remote_ports = {c.raddr.port for c in psutil.Process(collector.proc.pid).net_connections()
                    if c.raddr}

    assert int(database.get("PORT") or 5432) not in remote_ports
    assert remote_ports  # it does hold its Redis connections


def test_the_rate_cap_drops_the_excess(start_collector, shadow_redis):
    collector = start_collector()
    collector.publish(max_rps=2)
    started = time.monotonic()

    collector.post_many(40)

    final = counters_when(RUN, lambda c: c["received"] == 40 and settled(c),
                          what="every request to be sampled or dropped")
    elapsed = time.monotonic() - started
    # A burst of 2, then one per 0.5 s, over at most `elapsed` seconds.
    assert 1 <= final["sampled"] <= 2 + int(elapsed * 2) + 1
    assert final["dropped_rate"] == 40 - final["sampled"]
    assert len(queued_kwargs(shadow_redis)) == final["sampled"]


def test_the_daily_token_cap_drops_with_dropped_tokens(start_collector, shadow_redis):
    collector = start_collector()
    live.add_tokens(RUN, 1500)
    collector.publish(max_tokens_per_day=1000)

    collector.post_many(3)

    counted(RUN, received=3, dropped_tokens=3, sampled=0)
    assert shadow_redis.llen(live.SHADOW_QUEUE) == 0


def test_it_drops_as_behind_while_the_shadow_queue_holds_shadow_max_queued(
        start_collector, shadow_redis):
    collector = start_collector(SHADOW_MAX_QUEUED="3")
    collector.publish()
    for n in range(1, 4):
        collector.post(CHAT)
        counted(RUN, sampled=n)
    wait_until(lambda: collector.healthz()["shadow_queue_length"] >= 3,
               what="the collector to read the shadow queue's length")

    collector.post_many(4)

    counted(RUN, received=7, sampled=3, dropped_behind=4)
    assert shadow_redis.llen(live.SHADOW_QUEUE) == 3


def test_unpublishing_the_run_stops_the_collector_enqueuing_for_the_route(
        start_collector, shadow_redis):
    collector = start_collector()
    collector.publish()
    collector.post(CHAT)
    counted(RUN, received=1, sampled=1)

    live.unpublish_run(ROUTE)

    # Keep mirroring, as a gateway would until its mirror is cleared: the collector's next
    # read of the routes hash (every 0.5 s) turns the route's requests into unmatched ones.
    def unmatched_now() -> bool:
        assert collector.post(CHAT).status_code == 204
        return live.unmatched().get(ROUTE, 0) > 0

    wait_until(unmatched_now, timeout_s=10, every_s=0.05, what="the route to be unmatched")
    received = live.counters(RUN)["received"]
    for _ in range(5):
        collector.post(CHAT)
    wait_until(lambda: collector.healthz()["counters"].get("unmatched", 0) >= 6,
               what="the collector to count the requests")
    assert live.counters(RUN)["received"] == received
    assert ROUTE not in collector.healthz()["routes"]


def test_a_flood_keeps_its_memory_and_queues_bounded(start_collector, shadow_redis):
    collector = start_collector()
    collector.publish(max_rps=1000, max_tokens_per_day=10**9)
    body = json.dumps({**CHAT, "messages": [
        {"role": "user", "content": "Summarise this paragraph. " + "lorem ipsum " * 160}]})
    process = psutil.Process(collector.proc.pid)

    async def flood(n: int) -> int:
        ok = 0
        connector = aiohttp.TCPConnector(limit=32)
        headers = {collector_module.ROUTE_HEADER: ROUTE, "content-type": "application/json",
                   MIRROR_AUTH_HEADER: mirror_auth.header_value(GATEWAY, SECRET, ROUTE)}
        async with aiohttp.ClientSession(connector=connector) as session:
            async def one() -> None:
                nonlocal ok
                async with session.post(f"{collector.url}/v1/chat/completions", data=body,
                                        headers=headers) as answer:
                    ok += answer.status == 204

            pending = [one() for _ in range(n)]
            for start in range(0, n, 256):
                await asyncio.gather(*pending[start:start + 256])
        return ok

    assert asyncio.run(flood(2000)) == 2000
    after_2k = process.memory_info().rss
    assert asyncio.run(flood(18_000)) == 18_000
    after_20k = process.memory_info().rss

    assert after_20k < after_2k + 48 * 1024 * 1024, (after_2k, after_20k)
    health = collector.healthz()
    assert health["intake"]["peak"] <= health["intake"]["max"]
    assert health["send_queue"]["peak"] <= health["send_queue"]["max"]
    final = counters_when(RUN, lambda c: c["received"] == 20_000 and settled(c),
                          timeout_s=30, what="every request to be sampled or dropped")
    assert final["sampled"] > 0 and final["dropped_behind"] + final["dropped_rate"] > 0


def test_it_answers_even_when_redis_is_unreachable(start_collector):
    collector = start_collector(redis_url=f"redis://127.0.0.1:{free_port()}/0")

    assert collector.post(CHAT).status_code == 204
    assert collector.post(b"x" * 2_000_000).status_code == 413

    assert collector.healthz()["counters"]["unmatched"] == 2
    assert collector.proc.poll() is None


class FreezableProxy:
    """A TCP relay to Redis that can stop relaying (connections stay open, nothing moves):
    Redis and the broker hanging, as a saturated or partitioned Redis does."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.flowing = threading.Event()
        self.flowing.set()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.flowing.set()
        self.server.close()


def test_it_answers_at_once_while_redis_and_the_broker_hang(start_collector, settings):
    kwargs = redis.Redis.from_url(settings.REDIS_URL).connection_pool.connection_kwargs
    host, port, db = kwargs["host"], kwargs["port"], kwargs["db"]
    proxy = FreezableProxy((host, port))
    try:
        collector = start_collector(redis_url=f"redis://127.0.0.1:{proxy.port}/{db}")
        collector.publish(max_rps=1000)
        collector.post_many(2)
        counted(RUN, received=2, sampled=2)

        proxy.flowing.clear()  # every Redis call of the collector (and Celery's) now hangs
        collector.post_many(20)  # each answered 204 (httpx would time out after 10 s)

        assert collector.healthz()["counters"]["received"] == 22
        assert live.counters(RUN)["received"] == 2  # nothing reached Redis meanwhile
        proxy.flowing.set()
        final = counters_when(RUN, lambda c: c["received"] == 22 and settled(c),
                              timeout_s=30, what="the counters once Redis answers again")
        assert final["sampled"] >= 2
    finally:
        proxy.close()


def test_sigterm_stops_it_cleanly_with_every_answered_request_counted(
        start_collector, shadow_redis):
    collector = start_collector()
    collector.publish()
    collector.post_many(5)

    collector.proc.send_signal(signal.SIGTERM)

    assert collector.proc.wait(timeout=20) == 0, collector.log.read_text()
    final = live.counters(RUN)
    assert final["received"] == 5 and settled(final)
    assert len(queued_kwargs(shadow_redis)) == final["sampled"]
