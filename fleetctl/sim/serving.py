"""Serving several simulated pools in one event loop (the `fleetctl sim` process)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
from typing import TextIO

from .gcgovernor import GOVERNOR
from .groundtruth import DEFAULT_REQUEST_CAPACITY
from .server import PoolSpec, SimPool


async def serve_async(
    pools: list[PoolSpec],
    host: str = "127.0.0.1",
    *,
    record_ground_truth: bool = False,
    ground_truth_size: int = DEFAULT_REQUEST_CAPACITY,
    out: TextIO = sys.stdout,
    stop: asyncio.Event | None = None,
    random_seed: int | None = None,
) -> None:
    """Run every pool until SIGINT/SIGTERM (or `stop` is set)."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Not possible outside the main thread (embedded use); the caller's `stop` then rules.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    sims = [
        SimPool(spec, record_ground_truth=record_ground_truth, ground_truth_size=ground_truth_size,
                random_seed=random_seed)
        for spec in pools
    ]
    started: list[SimPool] = []
    try:
        for sim in sims:
            await sim.start(host)
            started.append(sim)
            print(sim.banner(host), file=out, flush=True)
        # Start-up objects live for the whole run; keep the collector from rescanning them.
        gc.collect()
        gc.freeze()
        GOVERNOR.install()
        await stop.wait()
    finally:
        GOVERNOR.uninstall()
        for sim in started:
            await sim.stop()


def serve(
    pools: list[PoolSpec],
    host: str = "127.0.0.1",
    *,
    record_ground_truth: bool = False,
    ground_truth_size: int = DEFAULT_REQUEST_CAPACITY,
    random_seed: int | None = None,
) -> None:
    """Blocking entrypoint: serve `pools` on `host` until SIGINT or SIGTERM."""
    asyncio.run(serve_async(
        pools, host, record_ground_truth=record_ground_truth,
        ground_truth_size=ground_truth_size, random_seed=random_seed,
    ))
