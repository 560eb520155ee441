"""How fast a drain reaches every gateway, and whether anything slips through.

Ten Envoy gateways (or HAProxy / nginx, `--kind`) on loopback carry streamed traffic
(~50 requests/s, round robin) to two simulated pools split 50/50. Thirty times: drain the
candidate through the service the REST API calls, wait until the record is complete,
restore. Reported:
  * drain call → all gateways verified (median, p99) — `Drain.verified_at` is the moment the
    last gateway's read-back matched, taken by the push worker;
  * client requests that failed during the run (target 0);
  * requests the drained pool's own ground truth says arrived after the verified time
    (target 0).

Everything real: PostgreSQL (`DATABASE_URL`, default a local `fleetctl_bench_drain`), Redis
(db 9), a Celery worker on the `push` queue (16 threads), the simulator and Envoy processes.

    .venv/bin/python benchmarks/drain_latency.py [--gateways 10] [--drains 30] [--rps 50]
    .venv/bin/python benchmarks/drain_latency.py --kind haproxy --gateways 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "llama-3.1-8b-instruct"
PROFILES = """
[profiles.bench]
base = "h200"
decode_base_ms = 4.0
decode_per_seq_ms = 0.02
network_latency_ms = 0.0
divergence_rate = 0.0
"""


def setup_env() -> None:
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/fleetctl_bench_drain")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    from benchmarks.overview_and_pools_api import ensure_database

    ensure_database(os.environ["DATABASE_URL"])


def start_sim(workdir: Path, ports: dict[str, int]) -> subprocess.Popen[bytes]:
    (workdir / "profiles.toml").write_text(PROFILES)
    args = [sys.executable, "-m", "fleetctl.sim", "--profiles", str(workdir / "profiles.toml"),
            "--record-ground-truth", "--ground-truth-size", "200000", "--model", MODEL,
            "--log-level", "WARNING"]
    for name, port in ports.items():
        args += ["--pool", f"{name}=bench@{port}"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=open(workdir / "sim.log", "wb"))  # noqa: SIM115
    import httpx

    deadline = time.monotonic() + 20
    for port in ports.values():
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("simulator did not start; see " + str(workdir / "sim.log"))
            time.sleep(0.05)
    return proc


def start_worker(workdir: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "fleetctl", "worker", "-Q", "push,watch",
         "-c", "16", "--pool", "threads", "-l", "INFO", "--without-gossip",
         "--without-mingle", "-n", f"bench-{os.getpid()}@%h"],
        cwd=ROOT, stdout=open(workdir / "worker.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT)
    from fleetctl.celery import app

    deadline = time.monotonic() + 30
    while not app.control.ping(timeout=0.5):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("worker did not start; see " + str(workdir / "worker.log"))
    return proc


class Load:
    """Streamed chat requests at a steady rate, round robin over the gateways, from a process
    of its own (sharing the GIL with the drain call would slow the very thing measured)."""

    def __init__(self, urls: list[str], rps: float) -> None:
        import multiprocessing

        self._stop = multiprocessing.Event()
        self._results: multiprocessing.Queue[tuple[int, int, list[str]]] = (
            multiprocessing.Queue())
        self._proc = multiprocessing.Process(target=_load_main,
                                             args=(urls, rps, self._stop, self._results))
        self.sent = self.failed = 0
        self.errors: list[str] = []

    def start(self) -> None:
        self._proc.start()

    def stop(self) -> None:
        self._stop.set()
        self.sent, self.failed, self.errors = self._results.get(timeout=60)
        self._proc.join(timeout=10)


def _load_main(urls: list[str], rps: float, stop: object, results: object) -> None:
    import logging

    import httpx

    # Forked after django.setup(): without this every request is logged at INFO, which
    # costs the load generator CPU the system under test then lacks.
    logging.getLogger("httpx").setLevel(logging.WARNING)

    counts = {"sent": 0, "failed": 0}
    errors: list[str] = []

    async def one(client: httpx.AsyncClient, url: str) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"q{counts['sent']}"}],
                "max_tokens": 24, "stream": True}
        counts["sent"] += 1
        try:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
                text = "".join([chunk async for chunk in resp.aiter_text()])
            if resp.status_code != 200 or "[DONE]" not in text:
                raise RuntimeError(f"HTTP {resp.status_code}: {text[:120]}")
        except Exception as exc:  # every failure counts, whatever it is
            counts["failed"] += 1
            errors.append(f"{url}: {exc}")

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30,
                                     limits=httpx.Limits(max_connections=200)) as client:
            tasks: set[asyncio.Task[None]] = set()
            next_at, i = time.monotonic(), 0
            while not stop.is_set():  # type: ignore[attr-defined]
                task = asyncio.create_task(one(client, urls[i % len(urls)]))
                i += 1
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_at += 1 / rps
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    results.put((counts["sent"], counts["failed"], errors[:20]))  # type: ignore[attr-defined]


class GatewayProcess:
    """The benchmark's view of any gateway process: its spec (for the Gateway row), the URL
    clients use, and how to stop it."""

    def __init__(self, spec: object, url: str, stop: object) -> None:
        self.spec, self.url, self.stop = spec, url, stop


def start_gateway(kind: str, work: Path, index: int) -> GatewayProcess:
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.traffic.gateways.base import GatewaySpec

    name = f"{kind}-{index}"
    if kind == "envoy":
        envoy = EnvoyProcess(work / name, free_port(), free_port()).start()
        spec = GatewaySpec(name=name, kind="envoy", admin_address=envoy.admin_url,
                           options={"config_dir": str(envoy.workdir)})
        return GatewayProcess(spec, envoy.listen_url, envoy.stop)
    if kind == "haproxy":
        from fleetctl.demo.haproxy_process import HAProxyProcess

        haproxy = HAProxyProcess(work / name, name=name).start()
        return GatewayProcess(haproxy.gateway, haproxy.url, haproxy.stop)
    from fleetctl.demo.nginx_process import NginxProcess

    nginx = NginxProcess(work / name, name=name).start()
    return GatewayProcess(nginx.gateway, nginx.url, nginx.stop)


def arrivals(port: int) -> list[float]:
    import httpx

    rows = httpx.get(f"http://127.0.0.1:{port}/admin/ground-truth",
                     params={"kind": "requests", "limit": "1000000"}, timeout=30).json()
    records = rows.get("records", rows if isinstance(rows, list) else [])
    return [r["arrival_wall"] for r in records if "arrival_wall" in r]


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateways", type=int, default=10)
    parser.add_argument("--drains", type=int, default=30)
    parser.add_argument("--rps", type=float, default=50.0)
    parser.add_argument("--kind", choices=("envoy", "haproxy", "nginx"), default="envoy")
    args = parser.parse_args()
    setup_env()
    import django

    django.setup()
    from django.core.management import call_command

    from fleetctl.accounts.actor import Actor
    from fleetctl.core.ports import free_port
    from fleetctl.fleet import services as fleet
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic.models import Drain, GatewayPush

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    work = Path(tempfile.mkdtemp(prefix="fleetctl-drain-bench-"))
    ports = {"primary": free_port(), "candidate": free_port()}
    sim = start_sim(work, ports)
    envoys: list[GatewayProcess] = []
    worker = None
    system = Actor.for_system("benchmark")
    try:
        envoys.extend(start_gateway(args.kind, work, i) for i in range(args.gateways))
        worker = start_worker(work)
        region = fleet.region_create(actor=system, code="us-east", name="US", jurisdiction="US")
        pools = {}
        for name, port in ports.items():
            pools[name] = fleet.pool_create(
                actor=system, name=name, runtime="cuda", accelerator="sim", region=region,
                base_urls=[f"http://127.0.0.1:{port}"], max_context_tokens=32768,
                node_hourly_rate="1")
            fleet.pool_model_create(actor=system, pool=pools[name], model_id=MODEL,
                                    max_context_tokens=32768)
            fleet.pool_health_record(pool_id=pools[name].pk, ok=True, status_code=200,
                                     latency_ms=1)
        route = traffic.route_create(actor=system, name="bench", model_id=MODEL,
                                     primary_pool=pools["primary"],
                                     weights={"primary": 50, "candidate": 50})
        for gateway in envoys:
            spec = gateway.spec
            traffic.gateway_create(actor=system, name=spec.name, kind=spec.kind,
                                   admin_address=spec.admin_address, options=spec.options,
                                   routes=[route])
        wait(lambda: not GatewayPush.objects.exclude(status__in=["verified", "superseded"])
             .exists(), "initial pushes")
        load = Load([e.url for e in envoys], args.rps)
        load.start()
        time.sleep(2)
        verified_ms: list[float] = []
        call_ms: list[float] = []  # the service call itself (validate, store, first push)
        windows: list[tuple[float, float]] = []  # drained pool closed: verified → restore
        for _ in range(args.drains):
            started_wall = time.time()
            drain = traffic.drain_request(actor=system, pool=pools["candidate"],
                                          reason="benchmark")
            call_ms.append((time.time() - started_wall) * 1000)
            wait(lambda d=drain.pk: Drain.objects.get(pk=d).status == "complete", "drain")
            done = Drain.objects.get(pk=drain.pk)
            verified_ms.append((done.verified_at.timestamp() - started_wall) * 1000)
            time.sleep(0.5)  # traffic flows with the candidate drained
            closed_until = time.time()
            windows.append((done.verified_at.timestamp(), closed_until))
            restore = traffic.drain_restore(actor=system, drain=done, reason="benchmark")
            wait(lambda r=restore.pk: Drain.objects.get(pk=r).status == "complete", "restore")
            time.sleep(0.5)
        load.stop()
        late = [t for t in arrivals(ports["candidate"])
                if any(start <= t < end for start, end in windows)]
        phases = drain_phases()
    finally:
        if worker is not None:
            worker.terminate()
        for envoy in envoys:
            envoy.stop()
        sim.terminate()
    print(f"{args.gateways} {args.kind} gateways, {args.drains} drains, ~{args.rps:g} streamed "
          f"requests/s, 2 cores shared by everything ({datetime.now(UTC):%Y-%m-%d})")
    print(f"drain call → all gateways verified: median {statistics.median(verified_ms):.1f} ms,"
          f" p99 {p99(verified_ms):.1f} ms, max {max(verified_ms):.1f} ms")
    print(f"  the drain call returns after its first attempt at every gateway (validate, "
          f"store, push, read back): median {statistics.median(call_ms):.1f} ms")
    print("  where the time goes (medians over the drains, from the attempt rows): first "
          f"gateway contacted at {phases['first']:.1f} ms, last at {phases['last']:.1f} ms; "
          f"one push (apply + read back) {phases['push']:.1f} ms")
    print(f"client requests: {load.sent} sent, {load.failed} failed")
    for error in load.errors[:5]:
        print(f"  failed: {error}")
    print(f"requests that reached the drained pool after verified: {len(late)}")


def drain_phases() -> dict[str, float]:
    """From each drain's first push attempts: when the first and the last gateway were
    contacted after the drain was requested, and how long one push took (medians, ms)."""
    from fleetctl.traffic.models import Drain, GatewayPushAttempt

    first, last, push = [], [], []
    for drain in Drain.objects.filter(action="drain"):
        attempts = list(GatewayPushAttempt.objects.filter(
            push__revision__in=drain.revisions.all(), number=1))
        if not attempts:
            continue
        sent = [(a.sent_at - drain.requested_at).total_seconds() * 1000 for a in attempts]
        first.append(min(sent))
        last.append(max(sent))
        push.append(statistics.median(a.duration_ms for a in attempts))
    return {"first": statistics.median(first), "last": statistics.median(last),
            "push": statistics.median(push)}


def wait(predicate, what: str, timeout_s: float = 60) -> None:  # type: ignore[no-untyped-def]
    """Polls every 20 ms: the times reported are stamped by the worker, not by this loop, and
    polling faster only takes CPU from the worker being measured."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


if __name__ == "__main__":
    main()
