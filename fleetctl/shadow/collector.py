"""The shadow collector: where gateways send their mirrored copies of a route's requests.

    python -m fleetctl.shadow.collector [--host 127.0.0.1] [--port 9911]

It answers every mirrored POST under /v1/ at once (204; 413 for a body over
SHADOW_MAX_BODY_BYTES) and does everything else afterwards, so a gateway's mirror never
waits on Redis, Celery or a worker (Envoy and nginx do not wait for mirrors anyway; the
collector keeps their connections free). Afterwards, in the background:

1. the route (header `x-fleetctl-shadow-route`) → its running run, from the routes hash in
   Redis (fleetctl/shadow/live.py), cached and re-read every 0.5 s: a stop reaches every
   collector within a second. No running run → counted unmatched.
   Before anything else, and before the body is read: the copy must carry the mirror token
   of a gateway that carries the route (header `x-fleetctl-mirror-auth`, checked against
   the tokens traffic publishes in Redis, re-read with the routes: fleetctl/traffic/
   mirror_auth.py). Else it is answered 403 and counted refused_unauthenticated: a forged
   copy never counts as received, never spends the run's rate or token budget, and never
   takes a real copy's place in the queues.
2. The body must be a JSON object with a "model" → else dropped_malformed.
3. Caps: today's tokens ≥ max_tokens_per_day → dropped_tokens; the Celery `shadow` queue
   holding ≥ SHADOW_MAX_QUEUED messages → dropped_behind (both cached, re-read every 0.5 s);
   max_rps → dropped_rate: a local GCRA per run refuses the excess without a round trip, and
   what passes spends the run-wide budget in Redis (live.RATE_SCRIPT), so the cap holds for
   the run however many collectors there are.
4. Admitted samples go to a bounded queue drained by one thread that sends the
   `shadow.pair` task (Celery's send is blocking); full → dropped_behind.

Counters are added up locally and written to Redis every 0.25 s in one round trip. Memory is
bounded: the intake and send queues have fixed lengths and the bodies they hold a fixed byte
budget; beyond either, samples are dropped and counted, never buffered. If Redis cannot be
read for STALE_AFTER_S, the collector forgets every route and every token (fails closed:
nothing enqueued).

It never touches the database. GET /healthz answers this process's counters as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")

from aiohttp import web
from django.conf import settings

from fleetctl.shadow import live
from fleetctl.traffic import mirror_auth
from fleetctl.traffic.gateways.base import MIRROR_AUTH_HEADER

log = logging.getLogger("fleetctl.shadow.collector")

ROUTE_HEADER = "x-fleetctl-shadow-route"
DEFAULT_PORT = 9911
# Samples parsed but not yet checked, and samples admitted but not yet sent: each queue holds
# at most this many; beyond, dropped_behind.
INTAKE_MAX = 1000
SEND_QUEUE_MAX = 1000
# Bodies held by both queues together, bytes: a flood of large bodies cannot take more.
INFLIGHT_BYTES_MAX = 64 * 1024 * 1024
REFRESH_S = 0.5
FLUSH_S = 0.25
STALE_AFTER_S = 5.0
# A route header is the gateway's route name; a stray client could send anything, so the
# unmatched counter keeps a bounded number of distinct names per flush, each cut short.
ROUTE_NAME_MAX = 100
UNMATCHED_NAMES_PER_FLUSH = 200
OTHER_ROUTES = "(other)"

Sender = Callable[[dict[str, Any]], None]


def celery_sender() -> Sender:
    """Send `shadow.pair` on the `shadow` queue. No retry: with the broker down a sample is
    dropped (and counted), not held."""
    from fleetctl.celery import app

    def send(kwargs: dict[str, Any]) -> None:
        app.send_task("shadow.pair", kwargs=kwargs, queue=live.SHADOW_QUEUE, retry=False)

    return send


class Collector:
    def __init__(self, *, redis_url: str, max_body_bytes: int, max_queued: int,
                 sender: Sender | None = None) -> None:
        self.redis_url = redis_url
        self.max_body_bytes = max_body_bytes
        self.max_queued = max_queued
        self.sender = sender or celery_sender()
        self.routes: dict[str, live.RunConfig] = {}
        # route -> gateway id -> the mirror tokens (digests) it may present; read with routes
        self.auth: mirror_auth.AcceptedTokens = {}
        self.routes_read_at = 0.0  # monotonic; 0 = never
        self.tokens: dict[int, int] = {}
        self.queued = 0  # the Celery shadow queue's length at the last refresh
        self.rates: dict[int, live.LocalRate] = {}
        self.rate_of: dict[int, float] = {}
        self.intake: asyncio.Queue[tuple[live.RunConfig, bytes, float]] = asyncio.Queue(
            INTAKE_MAX)
        self.outbox: queue.Queue[tuple[int, int, dict[str, Any]] | None] = queue.Queue(
            SEND_QUEUE_MAX)
        self.inflight_bytes = 0
        self.peak_intake = 0
        self.peak_outbox = 0
        # Counted by the event loop and the send thread: this process's totals (healthz) and
        # what is still to be written to Redis.
        self._lock = threading.Lock()
        self.totals: Counter[str] = Counter()
        self._pending: defaultdict[int, Counter[str]] = defaultdict(Counter)
        self._pending_unmatched: Counter[str] = Counter()
        self._tasks: list[asyncio.Task[None]] = []
        self._flush_lock = asyncio.Lock()
        self._busy = False  # the consumer holds a sample taken from the intake
        self._thread: threading.Thread | None = None
        self._redis: Any = None

    # --- counting ---------------------------------------------------------------------------

    def _count(self, run_id: int, field: str, bytes_done: int = 0) -> None:
        with self._lock:
            self.totals[field] += 1
            self._pending[run_id][field] += 1
            self.inflight_bytes -= bytes_done

    def _count_unmatched(self, route: str) -> None:
        name = route[:ROUTE_NAME_MAX] or live.NO_ROUTE
        with self._lock:
            self.totals["unmatched"] += 1
            if (name not in self._pending_unmatched
                    and len(self._pending_unmatched) >= UNMATCHED_NAMES_PER_FLUSH):
                name = OTHER_ROUTES
            self._pending_unmatched[name] += 1

    # --- the handler: answer first --------------------------------------------------------

    def _run_for(self, route: str) -> live.RunConfig | None:
        return self.routes.get(route) if route else None

    def _authentic(self, route: str, request: web.Request) -> bool:
        """Mirrored by a gateway that carries `route` (mirror_auth.check: constant time)."""
        return mirror_auth.check(self.auth.get(route), request.headers.get(
            MIRROR_AUTH_HEADER, ""), time.time())

    async def mirror(self, request: web.Request) -> web.Response:
        route = request.headers.get(ROUTE_HEADER, "")
        config = self._run_for(route)
        if config is not None and not self._authentic(route, request):
            # Refused before its body is read: it costs the run nothing.
            self._count(config.run, "refused_unauthenticated")
            return web.Response(status=403, text=(
                "not mirrored by a gateway of this route (x-fleetctl-mirror-auth)\n"))
        received_at = time.time()
        length = request.content_length
        body: bytes | None = None
        if length is None or length <= self.max_body_bytes:
            try:
                body = await request.read()  # chunked: refused past client_max_size
            except web.HTTPRequestEntityTooLarge:
                body = None
        if config is None:
            self._count_unmatched(route)
        else:
            self._count(config.run, "received")
            if body is None:
                self._count(config.run, "dropped_too_large")
            else:
                self._enqueue(config, body, received_at)
        if body is None:
            return web.Response(status=413, text=(
                f"body over SHADOW_MAX_BODY_BYTES ({self.max_body_bytes} bytes)\n"))
        return web.Response(status=204)

    def _enqueue(self, config: live.RunConfig, body: bytes, received_at: float) -> None:
        if self.inflight_bytes + len(body) > INFLIGHT_BYTES_MAX:
            self._count(config.run, "dropped_behind")
            return
        try:
            self.intake.put_nowait((config, body, received_at))
        except asyncio.QueueFull:
            self._count(config.run, "dropped_behind")
            return
        with self._lock:
            self.inflight_bytes += len(body)
        self.peak_intake = max(self.peak_intake, self.intake.qsize())

    # --- afterwards: parse, caps, hand to the send thread ---------------------------------------

    async def _consume(self) -> None:
        while True:
            config, body, received_at = await self.intake.get()
            self._busy = True
            try:
                await self._admit(config, body, received_at)
            except asyncio.CancelledError:  # stopping while the rate check was out
                self._count(config.run, "dropped_behind", len(body))
                raise
            except Exception:  # one bad sample must not stop the collector
                log.exception("shadow sample of run %s could not be handled", config.run)
                self._count(config.run, "dropped_malformed", len(body))
            finally:
                self._busy = False

    async def _admit(self, config: live.RunConfig, body: bytes, received_at: float) -> None:
        run_id, size = config.run, len(body)
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            request = None
        if (not isinstance(request, dict) or not isinstance(request.get("model"), str)
                or not request["model"]):
            self._count(run_id, "dropped_malformed", size)
            return
        reason = live.over_caps(config, tokens_today=self.tokens.get(run_id, 0),
                                queued=self.queued, max_queued=self.max_queued)
        if not reason and not self._local_rate(config).allow():
            reason = "rate"
        if not reason:
            try:
                if not await live.arate(self._redis, run_id, config.max_rps):
                    reason = "rate"
            except Exception as exc:  # Redis gone: Celery's broker too; send nothing
                log.warning("run %s: rate check failed (%s); sample dropped", run_id, exc)
                reason = "behind"
        if reason:
            self._count(run_id, f"dropped_{reason}", size)
            return
        kwargs = {"run_id": run_id, "request": request,
                  "received_at": datetime.fromtimestamp(received_at, UTC).isoformat(),
                  "source": "mirror"}
        try:
            self.outbox.put_nowait((run_id, size, kwargs))
        except queue.Full:
            self._count(run_id, "dropped_behind", size)
            return
        self.peak_outbox = max(self.peak_outbox, self.outbox.qsize())

    def _local_rate(self, config: live.RunConfig) -> live.LocalRate:
        if self.rate_of.get(config.run) != config.max_rps:
            self.rates[config.run] = live.LocalRate(config.max_rps)
            self.rate_of[config.run] = config.max_rps
        return self.rates[config.run]

    def _send_loop(self) -> None:
        """The one thread that talks to Celery."""
        while (item := self.outbox.get()) is not None:
            run_id, size, kwargs = item
            try:
                self.sender(kwargs)
            except Exception as exc:
                log.warning("run %s: shadow.pair not sent (%s); sample dropped", run_id, exc)
                self._count(run_id, "dropped_behind", size)
            else:
                self._count(run_id, "sampled", size)

    # --- Redis: the cached snapshot and the counter flush --------------------------------------

    async def refresh(self) -> None:
        routes, tokens, queued = await live.asnapshot(
            self._redis, {c.run for c in self.routes.values()} | set(self.tokens))
        auth = await live.amirror_auth(self._redis)
        # Today's tokens of runs just published are read on the next refresh; until then the
        # run's last known figure (0 for a new run) stands.
        new = {c.run for c in routes.values()} - set(tokens)
        if new:
            _, more, _ = await live.asnapshot(self._redis, new)
            tokens.update(more)
        live_runs = {c.run for c in routes.values()}
        self.tokens = {run: n for run, n in tokens.items() if run in live_runs}
        self.queued = queued
        self.routes, self.auth = routes, auth
        self.routes_read_at = time.monotonic()
        for run in set(self.rates) - live_runs:
            del self.rates[run], self.rate_of[run]

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:
                age = time.monotonic() - self.routes_read_at
                if self.routes and age > STALE_AFTER_S:
                    log.warning("Redis unreadable for %.0f s (%s): forgetting every route "
                                "until it answers", age, exc)
                    self.routes, self.auth = {}, {}
            await asyncio.sleep(REFRESH_S)

    async def flush(self) -> None:
        with self._lock:
            runs, self._pending = self._pending, defaultdict(Counter)
            unmatched, self._pending_unmatched = self._pending_unmatched, Counter()
        if not runs and not unmatched:
            return
        try:
            await live.acount_many(self._redis, runs, unmatched)
        except Exception as exc:
            log.warning("counters not written to Redis (%s); kept for the next flush", exc)
            with self._lock:
                for run, fields in runs.items():
                    self._pending[run].update(fields)
                for name, n in unmatched.items():
                    key = (name if name in self._pending_unmatched
                           or len(self._pending_unmatched) < UNMATCHED_NAMES_PER_FLUSH
                           else OTHER_ROUTES)
                    self._pending_unmatched[key] += n

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            # Held while writing: stop() cancels this loop only between flushes. A flush
            # cancelled mid-write had already taken the counts out of _pending and lost them
            # (seen as 3 of 5 requests counted after a SIGTERM on a loaded machine).
            async with self._flush_lock:
                await self.flush()

    # --- life ----------------------------------------------------------------------------------

    async def start(self, app: web.Application) -> None:
        self._redis = live.aclient(self.redis_url)
        with contextlib.suppress(Exception):  # not up yet: the refresh loop keeps trying
            await self.refresh()
        self._thread = threading.Thread(target=self._send_loop, name="shadow-send",
                                        daemon=True)
        self._thread.start()
        self._tasks = [asyncio.create_task(coro) for coro in
                       (self._consume(), self._refresh_loop(), self._flush_loop())]

    async def stop(self, app: web.Application) -> None:
        """SIGTERM (the server has stopped taking requests): handle what was taken in, send
        what was admitted (a few seconds at most), count what is left as dropped_behind,
        write the counters."""
        settle_by = time.monotonic() + 2
        while (self._busy or not self.intake.empty()) and time.monotonic() < settle_by:
            await asyncio.sleep(0.01)
        async with self._flush_lock:  # a flush under way finishes first
            for task in self._tasks:
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while not self.intake.empty():
            config, body, _ = self.intake.get_nowait()
            self._count(config.run, "dropped_behind", len(body))
        if self._thread is not None:
            stop_by = time.monotonic() + 5
            while time.monotonic() < stop_by:
                try:
                    self.outbox.put(None, timeout=0.1)
                    break
                except queue.Full:
                    continue
            await asyncio.to_thread(self._thread.join, max(0.1, stop_by - time.monotonic()))
        with contextlib.suppress(Exception):
            await self.flush()
        if self._redis is not None:
            await self._redis.aclose()

    async def healthz(self, request: web.Request) -> web.Response:
        with self._lock:
            totals = dict(self.totals)
            inflight = self.inflight_bytes
        age = (time.monotonic() - self.routes_read_at) if self.routes_read_at else None
        return web.json_response({
            "counters": totals,
            "intake": {"depth": self.intake.qsize(), "max": INTAKE_MAX,
                       "peak": self.peak_intake},
            "send_queue": {"depth": self.outbox.qsize(), "max": SEND_QUEUE_MAX,
                           "peak": self.peak_outbox},
            "inflight_bytes": inflight,
            "routes": {name: c.run for name, c in self.routes.items()},
            # Who may mirror what, by gateway id (never a token or a digest).
            "mirror_gateways": {name: sorted(self.auth.get(name, {}), key=_as_int)
                                for name in self.routes},
            "routes_age_s": None if age is None else round(age, 3),
            "shadow_queue_length": self.queued,
            "max_queued": self.max_queued,
            "max_body_bytes": self.max_body_bytes,
        })


def _as_int(text: str) -> int:
    return int(text) if text.isdigit() else -1


def make_app(collector: Collector) -> web.Application:
    # One more byte than the limit: aiohttp refuses a body whose size reaches client_max_size.
    app = web.Application(client_max_size=collector.max_body_bytes + 1)
    app.router.add_post("/v1/{tail:.*}", collector.mirror)
    app.router.add_get("/healthz", collector.healthz)
    app.on_startup.append(collector.start)
    app.on_cleanup.append(collector.stop)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetctl.shadow.collector",
                                     description="Receive mirrored requests for shadow runs.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(
        os.environ.get("FLEETCTL_SHADOW_COLLECTOR_PORT", str(DEFAULT_PORT))))
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    collector = Collector(redis_url=settings.REDIS_URL,
                          max_body_bytes=settings.SHADOW_MAX_BODY_BYTES,
                          max_queued=settings.SHADOW_MAX_QUEUED)
    log.info("shadow collector on http://%s:%s (Redis %s, bodies up to %d bytes, drops while "
             "the shadow queue holds %d)", args.host, args.port, settings.REDIS_URL,
             collector.max_body_bytes, collector.max_queued)
    # run_app turns SIGTERM and SIGINT into a clean stop (on_cleanup above).
    web.run_app(make_app(collector), host=args.host, port=args.port, access_log=None,
                print=None, shutdown_timeout=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
