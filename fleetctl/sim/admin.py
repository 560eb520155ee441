"""A pool's /admin routes: its state, faults and ground-truth recording (a mixin of
SimPool, which owns the attributes below)."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from .apierror import ApiError
from .engine import Engine
from .errors import query_int, read_json
from .faults import Faults
from .gcgovernor import GOVERNOR
from .groundtruth import GroundTruth
from .profiles import Profile

log = logging.getLogger("fleetctl.sim")


class PoolAdmin:
    """State and admin routes of a SimPool."""

    spec: Any  # the PoolSpec
    port: int
    profile: Profile
    models: tuple[str, ...]
    faults: Faults
    engine: Engine
    ground_truth: GroundTruth

    def state(self) -> dict[str, Any]:
        engine = self.engine
        lag = engine.lag
        return {
            "pool": self.spec.name,
            "port": self.port,
            "profile": self.profile.as_dict(),
            "models": list(self.models),
            "faults": self.faults.as_dict(),
            "engine": {
                "running": len(engine.running),
                "waiting": len(engine.waiting),
                "kv_used_tokens": engine.kv_used,
                "kv_capacity_tokens": self.profile.kv_cache_tokens,
                "kv_usage": engine.kv_usage(),
                "prefix_cache_blocks": len(engine.prefix_cache),
                "steps": engine.steps,
                "preemptions": engine.preemptions,
            },
            "schedule_lag": {
                "lagging": lag.lagging,
                "lagging_episodes": lag.episodes,
                "window_steps": len(lag.window),
                "p99_ms": lag.p99() * 1000.0,
                "max_ms": max(lag.window, default=0.0) * 1000.0,
            },
            "gc": GOVERNOR.stats(),
            "ground_truth": {
                "enabled": self.ground_truth.enabled,
                "capacity": self.ground_truth.capacity,
                "requests": len(self.ground_truth.requests),
                "steps": len(self.ground_truth.steps),
            },
        }

    async def admin_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def admin_faults(self, request: web.Request) -> web.Response:
        self.apply_faults(self.faults.validated(await read_json(request)))
        return web.json_response({"pool": self.spec.name, "faults": self.faults.as_dict()})

    async def admin_reset(self, request: web.Request) -> web.Response:
        self.apply_faults(Faults())
        return web.json_response({"pool": self.spec.name, "faults": self.faults.as_dict()})

    def apply_faults(self, faults: Faults) -> None:
        going_down = faults.down and not self.faults.down
        self.faults = faults
        self.engine.slowdown = faults.slowdown
        if going_down:
            self.engine.abort_all("pool is down")
        log.info("sim pool %s faults: %s", self.spec.name, faults.as_dict())

    async def admin_ground_truth(self, request: web.Request) -> web.Response:
        since = query_int(request, "since", 0)
        limit = query_int(request, "limit", None)
        kind = request.query.get("kind", "all")
        if kind not in ("all", "requests", "steps"):
            raise ApiError(400, "Invalid 'kind': expected all, requests or steps.", param="kind")
        return web.json_response(self.ground_truth.read(since=since or 0, limit=limit, kind=kind))

    async def admin_ground_truth_set(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not set(body) <= {"enabled", "clear", "capacity"}:
            raise ApiError(400, "Expected a JSON object with 'enabled' (bool), 'clear' (bool) "
                           "and/or 'capacity' (int >= 1).")
        enabled, clear, capacity = body.get("enabled"), body.get("clear"), body.get("capacity")
        if enabled is not None and not isinstance(enabled, bool):
            raise ApiError(400, "Invalid 'enabled': expected true or false.", param="enabled")
        if clear is not None and not isinstance(clear, bool):
            raise ApiError(400, "Invalid 'clear': expected true or false.", param="clear")
        if capacity is not None and (
            isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1
        ):
            raise ApiError(400, "Invalid 'capacity': expected an integer >= 1.",
                           param="capacity")
        if enabled is not None:
            self.ground_truth.enabled = enabled
        if clear:
            self.ground_truth.clear()
        if capacity is not None:
            self.ground_truth.resize(capacity)
        return web.json_response(self.state()["ground_truth"])

    async def admin_ground_truth_clear(self, request: web.Request) -> web.Response:
        self.ground_truth.clear()
        return web.json_response(self.state()["ground_truth"])
