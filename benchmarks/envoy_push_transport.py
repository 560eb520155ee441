"""What the outbound HTTP transport costs on the drain path: a weights push to ten Envoys.

Ten real Envoy gateways on loopback; each round pushes every gateway a new 2-pool split in
parallel threads (as the push task does) through the Envoy adapter — apply, read back,
compare — and times the round (wall clock) and this process's CPU time. No database, no
Celery: only the adapter and its admin client.

    .venv/bin/python benchmarks/envoy_push_transport.py [--gateways 10] [--rounds 200]
    .venv/bin/python benchmarks/envoy_push_transport.py --transport httpx

--transport keepalive (default): the admin client the adapter uses (plain HTTP/1.1 kept
alive per host); httpx: the module's general httpx client in its place, for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateways", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--transport", choices=("keepalive", "httpx"), default="keepalive")
    args = parser.parse_args()

    import logging

    import django

    django.setup()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    from fleetctl.core import http
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.traffic.gateways.base import DesiredState, GatewaySpec, PoolTarget, RouteSpec
    from fleetctl.traffic.gateways.registry import adapter_for

    if args.transport == "httpx":
        general = http.Client()
        http.admin_client = lambda: general  # type: ignore[assignment]

    pools = {name: PoolTarget(name, (f"http://127.0.0.1:{port}",), "US")
             for name, port in (("a", 18001), ("b", 18002))}

    def desired(share: int) -> DesiredState:
        return DesiredState(routes=(RouteSpec(key="r", model="m", latency_class="",
                                              residency="", revision=share,
                                              weights={"a": share, "b": 10_000 - share}),),
                            pools=pools)

    with tempfile.TemporaryDirectory() as tmp:
        envoys = [EnvoyProcess(Path(tmp) / f"e{i}", free_port(), free_port()).start(60)
                  for i in range(args.gateways)]
        try:
            adapters = [adapter_for(GatewaySpec(f"gw{i}", "envoy", e.admin_url,
                                                {"config_dir": str(e.workdir)}))
                        for i, e in enumerate(envoys)]

            def push(adapter: object, state: DesiredState) -> None:
                adapter.apply(state)  # type: ignore[attr-defined]
                held = adapter.read_back()  # type: ignore[attr-defined]
                assert adapter.matches(state, held), held  # type: ignore[attr-defined]

            with ThreadPoolExecutor(args.gateways) as pool:
                list(pool.map(push, adapters, [desired(5000)] * len(adapters)))  # structure
                walls, cpus = [], []
                for n in range(args.rounds):
                    state = desired(1000 + (n % 80) * 100)
                    wall, cpu = time.perf_counter(), time.process_time()
                    list(pool.map(push, adapters, [state] * len(adapters)))
                    walls.append((time.perf_counter() - wall) * 1000)
                    cpus.append((time.process_time() - cpu) * 1000)
        finally:
            for envoy in envoys:
                envoy.stop()
    walls.sort()
    print(f"{args.gateways} Envoys, {args.rounds} weight pushes, transport {args.transport}: "
          f"round median {statistics.median(walls):.1f} ms, "
          f"p90 {walls[int(len(walls) * 0.9)]:.1f} ms; "
          f"client CPU per round median {statistics.median(cpus):.1f} ms")


if __name__ == "__main__":
    main()
