"""A real `python -m fleetctl.shadow.collector` process for tests, and what they read back:
its /healthz, a run's counters in Redis, the `shadow.pair` tasks it queued.

Copies posted by `Running.post` carry the mirror token of a gateway (id GATEWAY) that
carries ROUTE, as a gateway's mirror does; `publish()` publishes that token with the run.
The fixtures are in tests/shadow/conftest.py."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from fleetctl.core.ports import free_port
from fleetctl.shadow import collector as collector_module
from fleetctl.shadow import live
from fleetctl.traffic import mirror_auth
from fleetctl.traffic.gateways.base import MIRROR_AUTH_HEADER
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
RUN = 8_800_001
ROUTE = "chat-us"
# A gateway of ROUTE, as the tests' copies say they come from it.
GATEWAY = 4_001
SECRET = mirror_auth.new_secret()
CHAT = {"model": "llama-3.1-8b-instruct", "temperature": 0, "max_tokens": 64,
        "messages": [{"role": "user", "content": "Name three rivers."}]}
DROPS = ("dropped_rate", "dropped_tokens", "dropped_behind", "dropped_malformed",
         "dropped_too_large")
GENUINE = object()  # Running.post(auth=GENUINE): the token GATEWAY holds for the route


def publish_gateways(routes: dict[str, dict[int, list[tuple[str, float | None]]]]) -> None:
    """What fleetctl publishes from its gateway rows: route -> gateway id -> (token,
    accepted until) pairs. Replaces whatever was published."""
    mirror_auth.write({route: mirror_auth.encode(gateways) for route, gateways in
                       routes.items()})


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def healthz(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/healthz", timeout=5).json()

    def post(self, body: bytes | dict[str, Any], route: str | None = ROUTE, *,
             path: str = "/v1/chat/completions", auth: object = GENUINE,
             **kwargs: Any) -> httpx.Response:
        """POST a copy for `route`; `auth`: the mirror header's value (None: no header)."""
        headers = {"content-type": "application/json"}
        if route is not None:
            headers[collector_module.ROUTE_HEADER] = route
        if auth is GENUINE and route is not None:
            auth = mirror_auth.header_value(GATEWAY, SECRET, route)
        if isinstance(auth, str):
            headers[MIRROR_AUTH_HEADER] = auth
        content = json.dumps(body).encode() if isinstance(body, dict) else body
        return httpx.post(f"{self.url}{path}", content=kwargs.pop("content", content),
                          headers=headers, timeout=10, **kwargs)

    def post_many(self, n: int, body: dict[str, Any] = CHAT) -> None:
        for _ in range(n):
            assert self.post(body).status_code == 204

    def publish(self, *, max_rps: float = 100, max_tokens_per_day: int = 1_000_000) -> None:
        """Publish run RUN for ROUTE, GATEWAY as the route's gateway, and wait until this
        collector has read both."""
        publish_gateways({ROUTE: {GATEWAY: [(mirror_auth.route_token(SECRET, ROUTE), None)]}})
        live.publish_run(RUN, ROUTE, max_rps=max_rps, max_tokens_per_day=max_tokens_per_day)
        self.wait_for_gateways(ROUTE, [str(GATEWAY)], run=RUN)

    def wait_for_gateways(self, route: str, gateways: list[str], *, run: int) -> None:
        """Until this collector holds `run` for `route` and exactly `gateways` may mirror it."""
        def read() -> bool:
            health = self.healthz()
            return (health["routes"].get(route) == run
                    and health["mirror_gateways"].get(route) == gateways)

        wait_until(read, timeout_s=10, what=f"the collector to read route {route}'s run and "
                                            f"gateways")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def launch(redis_url: str, log_dir: Path, **env: str) -> Running:
    """Start a collector on a free port and wait until it answers /healthz."""
    port = free_port()
    log = log_dir / f"collector-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetctl.shadow.collector", "--port", str(port)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "REDIS_URL": redis_url, **env})
    running = Running(proc, f"http://127.0.0.1:{port}", log)

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return running.healthz()["max_body_bytes"] > 0
        except httpx.HTTPError:
            return False

    wait_until(up, timeout_s=60, what="the collector to answer /healthz")
    return running


def counters_when(run: int, predicate: Callable[[dict[str, int]], bool], *, what: str,
                  timeout_s: float = 10) -> dict[str, int]:
    """Wait until the run's counters in Redis (flushed every 0.25 s) satisfy `predicate`."""
    seen: dict[str, int] = {}

    def look() -> dict[str, int] | None:
        seen.update(live.counters(run))
        return dict(seen) if predicate(seen) else None

    return wait_until(look, timeout_s=timeout_s, what=what, explain=lambda: f"counters: {seen}")


def counted(run: int, **expected: int) -> dict[str, int]:
    return counters_when(run, lambda c: all(c[k] == v for k, v in expected.items()),
                         what=f"counters {expected}")


def queued_kwargs(r: redis.Redis) -> list[dict[str, Any]]:
    """The `shadow.pair` tasks waiting in the Celery `shadow` queue (oldest first)."""
    found = []
    for raw in reversed(r.lrange(live.SHADOW_QUEUE, 0, -1)):
        message = json.loads(raw)
        assert message["headers"]["task"] == "shadow.pair"
        _args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        found.append(kwargs)
    return found


def settled(counters: dict[str, int]) -> bool:
    return counters["received"] == counters["sampled"] + sum(counters[d] for d in DROPS)
