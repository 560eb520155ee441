"""A weights change until it is verified on every Envoy: over xDS (ACKed by each) beside the
admin-API path (file mode: POST /runtime_modify and a read-back per Envoy), in the same run.

Real Envoy processes on loopback, first N fed by fleetctl's ADS server (in this process, one
gateway whose N Envoys share a node cluster), then stopped, then N in file mode (N gateways,
pushed in parallel threads as the push task does). Each round pushes a new 2-pool split:

- xDS: EnvoyXdsAdapter.apply (render, set the snapshot, wait for every Envoy's ACK): a
  returned apply is verified;
- admin API: EnvoyAdapter.apply + read_back + matches per gateway, all gateways in parallel.

No database, no Celery, no pools behind the clusters (nothing is sent through the Envoys).

    .venv/bin/python benchmarks/xds_push.py [--envoys 1 10] [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envoys", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()

    import logging

    import django

    django.setup()
    logging.getLogger("fleetctl.xds.server").setLevel(logging.WARNING)
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess, XdsSource
    from fleetctl.traffic.gateways.base import DesiredState, GatewaySpec, PoolTarget, RouteSpec
    from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
    from fleetctl.traffic.gateways.envoy_xds.adapter import EnvoyXdsAdapter
    from fleetctl.xds.server import XdsServer
    from fleetctl.xds.store import MemoryStore

    pools = {name: PoolTarget(name, (f"http://127.0.0.1:{port}",), "US")
             for name, port in (("a", 18001), ("b", 18002))}

    def desired(share: int) -> DesiredState:
        return DesiredState(routes=(RouteSpec(key="r", model="m", latency_class="",
                                              residency="", revision=share,
                                              weights={"a": share, "b": 10_000 - share}),),
                            pools=pools)

    def timed(push: Callable[[DesiredState], None]) -> tuple[float, float]:
        push(desired(5000))  # the structure, once
        walls, cpus = [], []
        for n in range(args.rounds):
            state = desired(1000 + (n % 80) * 100)
            wall, cpu = time.perf_counter(), time.process_time()
            push(state)
            walls.append((time.perf_counter() - wall) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
        return statistics.median(walls), statistics.median(cpus)

    def measure(count: int) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            store = MemoryStore()
            with XdsServer(store=store) as server:
                envoys = [EnvoyProcess(Path(tmp) / f"x{i}", free_port(), free_port(),
                                       access_log=False,
                                       xds=XdsSource("127.0.0.1", server.port, "bench",
                                                     f"e{i}")).start(60)
                          for i in range(count)]
                try:
                    adapter = EnvoyXdsAdapter(GatewaySpec("bench", "envoy-xds",
                                                          envoys[0].admin_url,
                                                          {"ack_timeout_s": 30}), store=store)

                    def push_xds(state: DesiredState) -> None:
                        result = adapter.apply(state)
                        assert f"ACKed by {count} Envoy(s)" in result.detail, result.detail

                    xds_wall, xds_cpu = timed(push_xds)
                finally:
                    for envoy in envoys:
                        envoy.stop()

            envoys = [EnvoyProcess(Path(tmp) / f"f{i}", free_port(), free_port(),
                                   access_log=False).start(60) for i in range(count)]
            try:
                adapters = [EnvoyAdapter(GatewaySpec(f"gw{i}", "envoy", e.admin_url,
                                                     {"config_dir": str(e.workdir)}))
                            for i, e in enumerate(envoys)]

                def verified(adapter: EnvoyAdapter, state: DesiredState) -> None:
                    adapter.apply(state)
                    held = adapter.read_back()
                    assert adapter.matches(state, held), held

                with ThreadPoolExecutor(count) as threads:
                    def push_admin(state: DesiredState) -> None:
                        list(threads.map(verified, adapters, [state] * count))

                    admin_wall, admin_cpu = timed(push_admin)
            finally:
                for envoy in envoys:
                    envoy.stop()
        return (f"{count} Envoy(s), {args.rounds} weight changes each: "
              f"xDS apply until every ACK median {xds_wall:.1f} ms "
              f"(control-plane CPU {xds_cpu:.1f} ms); "
              f"admin API apply + read-back median {admin_wall:.1f} ms "
              f"(CPU {admin_cpu:.1f} ms)")


    for count in args.envoys:
        print(measure(count), flush=True)

if __name__ == "__main__":
    main()
