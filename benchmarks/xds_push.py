"""A weights change until it is verified on every Envoy: over xDS (ACKed by each) beside the
admin-API path (file mode: POST /runtime_modify and a read-back per Envoy), in the same run.

Real Envoy processes on loopback, one gateway whose N Envoys share a node cluster, three ways,
one after the other in the same run:

- xDS in-process: the ADS server runs in this process on a MemoryStore; EnvoyXdsAdapter.apply
  (render, set the snapshot, wait for every Envoy's ACK): a returned apply is verified;
- xDS shared (`--shared`): the ADS server is a `manage.py xds_serve` process; this process
  pushes through the shared store (the snapshot row in the database, a Redis wake-up; the
  ACK rows read once, then the replica's ACK reports from Redis), as a Celery worker would;
- admin API: N gateways in file mode, EnvoyAdapter.apply + read_back + matches per gateway,
  all gateways in parallel threads as the push task does.

Each round pushes a new 2-pool split. No Celery, no pools behind the clusters (nothing is
sent through the Envoys). `--shared` needs DATABASE_URL (a migrated database; rows of the
gateway "bench-shared" are written there) and REDIS_URL.

    .venv/bin/python benchmarks/xds_push.py [--envoys 1 10] [--rounds 30] [--shared]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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
    parser.add_argument("--shared", action="store_true",
                        help="also push through an xds_serve process (the shared store)")
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
    from fleetctl.xds.services import gateway_token_issue
    from fleetctl.xds.shared import SharedStore
    from fleetctl.xds.store import MemoryStore

    if args.shared:
        from django.db import connection
        from django.db.migrations.executor import MigrationExecutor

        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            sys.exit(f"--shared: the database {connection.settings_dict['NAME']} is not "
                     "migrated; run manage.py migrate on it first")

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
                token = store.issue_token("bench")
                envoys = [EnvoyProcess(Path(tmp) / f"x{i}", free_port(), free_port(),
                                       access_log=False,
                                       xds=XdsSource("127.0.0.1", server.port, "bench",
                                                     f"e{i}", token=token)).start(60)
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

            shared = measure_shared(count, Path(tmp)) if args.shared else ""

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
              f"(control-plane CPU {xds_cpu:.1f} ms); {shared}"
              f"admin API apply + read-back median {admin_wall:.1f} ms "
              f"(CPU {admin_cpu:.1f} ms)")


    def measure_shared(count: int, tmp: Path) -> str:
        port = free_port()
        log_path = tmp / "xds_serve.log"
        with log_path.open("wb") as log:
            replica = subprocess.Popen(
                [sys.executable, "manage.py", "xds_serve", "--port", str(port),
                 "--replica", "bench"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        store = SharedStore()
        try:
            deadline = time.monotonic() + 60
            while "serving on" not in log_path.read_text():
                if replica.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"xds_serve did not start:\n{log_path.read_text()}")
                time.sleep(0.05)
            token = gateway_token_issue(gateway="bench-shared")
            envoys = [EnvoyProcess(tmp / f"s{i}", free_port(), free_port(), access_log=False,
                                   xds=XdsSource("127.0.0.1", port, "bench-shared", f"e{i}",
                                                 token=token)).start(60)
                      for i in range(count)]
            try:
                adapter = EnvoyXdsAdapter(GatewaySpec("bench-shared", "envoy-xds",
                                                      envoys[0].admin_url,
                                                      {"ack_timeout_s": 30}), store=store)
                deadline = time.monotonic() + 30
                while sum(e.connected for e in store.envoys("bench-shared")) < count:
                    if time.monotonic() > deadline:
                        sys.exit("the Envoys were not all recorded connected within 30 s")
                    time.sleep(0.05)

                def push_shared(state: DesiredState) -> None:
                    result = adapter.apply(state)
                    assert f"ACKed by {count} Envoy(s)" in result.detail, result.detail

                wall, cpu = timed(push_shared)
            finally:
                for envoy in envoys:
                    envoy.stop()
        finally:
            replica.terminate()
            replica.wait(30)
            store.stop()
        return (f"xDS shared store (pushed from this process to an xds_serve process) "
                f"median {wall:.1f} ms (pushing process CPU {cpu:.1f} ms); ")

    for count in args.envoys:
        print(measure(count), flush=True)

if __name__ == "__main__":
    main()
