"""How fast a drain reaches every gateway, how soon its answer arrives, and whether anything
slips through.

Ten Envoy gateways (or HAProxy / nginx, `--kind`) on loopback carry streamed traffic
(~50 requests/s, round robin) to two simulated pools split 50/50. Thirty times per path:
drain the candidate, wait until the record is complete, restore. Two paths:
  * `service`: the service call in this process, then its first push (what the API does);
  * `rest`: `POST /api/v1/drains/` to gunicorn with a bearer token, as the CLI and any
    automation do (restores through `POST /api/v1/drains/<id>/restore/`).
Reported per path:
  * request → all gateways verified (median, p99) — `Drain.verified_at` is the moment the
    last gateway's read-back matched (from the rows);
  * request → answer arrives (client side), and the gap between verified and answered;
  * where the time goes, from the attempt rows: first and last gateway contacted, one push;
  * client requests that failed during the run (target 0);
  * requests the drained pool's own ground truth says arrived after the verified time
    (target 0).

Everything real: PostgreSQL (`DATABASE_URL`, default a local `fleetctl_bench_drain`), Redis
(db 9), gunicorn (2 workers, 4 threads), a Celery worker on the push queues (16 threads), the
simulator and gateway processes. The script also runs against an older checkout (the layout
before gateways moved under traffic/gateways/ and the push engine under traffic/push.py):
copy it there and give that run a database of its own.

    .venv/bin/python benchmarks/drain_latency.py [--gateways 10] [--drains 30] [--rps 50]
    .venv/bin/python benchmarks/drain_latency.py --path rest --kind haproxy --gateways 3
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
    from fleetctl.demo.devstack import local_destinations
    local_destinations(os.environ)
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


def push_queues() -> str:
    """The queues pushes and drain watchers are on (`push`, and `watch` where it exists)."""
    from fleetctl.celery import QUEUES

    return ",".join(q for q in ("push", "watch") if q in QUEUES)


def start_web(workdir: Path, port: int) -> subprocess.Popen[bytes]:
    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "fleetctl.wsgi", "-b", f"127.0.0.1:{port}",
         "-w", "2", "--threads", "4"],
        cwd=ROOT, stdout=open(workdir / "web.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/api/v1/", timeout=2)
            return proc
        except httpx.HTTPError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("web did not start; see " + str(workdir / "web.log")) from None
            time.sleep(0.2)


def start_worker(workdir: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "fleetctl", "worker", "-Q", push_queues(),
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
    layout = Layout()
    EnvoyProcess, GatewaySpec, free_port = layout.envoy, layout.spec, layout.free_port

    name = f"{kind}-{index}"
    if kind == "envoy":
        envoy = EnvoyProcess(work / name, free_port(), free_port()).start()
        spec = GatewaySpec(name=name, kind="envoy", admin_address=envoy.admin_url,
                           options={"config_dir": str(envoy.workdir)})
        return GatewayProcess(spec, envoy.listen_url, envoy.stop)
    if kind == "haproxy":
        haproxy = layout.process("haproxy_process").HAProxyProcess(work / name, name=name).start()
        return GatewayProcess(haproxy.gateway, haproxy.url, haproxy.stop)
    nginx = layout.process("nginx_process").NginxProcess(work / name, name=name).start()
    return GatewayProcess(nginx.gateway, nginx.url, nginx.stop)


class Layout:
    """Where things are in the checkout being measured: today's (fleetctl/demo/ processes,
    traffic/gateways/, the push engine in traffic/push.py) or the older one."""

    def __init__(self) -> None:
        import fleetctl

        self.new = (Path(fleetctl.__file__).parent / "demo" / "envoy_process.py").exists()
        if self.new:
            from fleetctl.core.ports import free_port
            from fleetctl.demo.envoy_process import EnvoyProcess
            from fleetctl.traffic.gateways.base import GatewaySpec
        else:
            from fleetctl.traffic.adapters.base import GatewaySpec  # type: ignore[no-redef]
            from fleetctl.traffic.envoy_process import (  # type: ignore[no-redef]
                EnvoyProcess,
                free_port,
            )
        self.envoy, self.spec, self.free_port = EnvoyProcess, GatewaySpec, free_port
        try:
            from fleetctl.traffic import push
        except ImportError:  # the first push ran in a commit hook of the service call
            push = None  # type: ignore[assignment]
        self.push = push

    def process(self, module: str) -> object:
        import importlib

        return importlib.import_module(
            f"fleetctl.{'demo' if self.new else 'traffic'}.{module}")

    def drain(self, **kwargs: object) -> object:
        from fleetctl.traffic import services

        drain = services.drain_request(**kwargs)
        if self.push is not None:
            self.push.drain_push_now(drain)
        return drain

    def restore(self, **kwargs: object) -> object:
        from fleetctl.traffic import services

        record = services.drain_restore(**kwargs)
        if self.push is not None:
            self.push.drain_push_now(record)
        return record


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
    parser.add_argument("--drains", type=int, default=30, help="per path")
    parser.add_argument("--rps", type=float, default=50.0)
    parser.add_argument("--kind", choices=("envoy", "haproxy", "nginx"), default="envoy")
    parser.add_argument("--path", choices=("both", "service", "rest"), default="both")
    args = parser.parse_args()
    setup_env()
    import django

    django.setup()
    from django.core.management import call_command

    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet import services as fleet
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic.models import GatewayPush

    layout = Layout()
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    work = Path(tempfile.mkdtemp(prefix="fleetctl-drain-bench-"))
    ports = {"primary": layout.free_port(), "candidate": layout.free_port()}
    sim = start_sim(work, ports)
    envoys: list[GatewayProcess] = []
    children: list[subprocess.Popen[bytes]] = []
    system = Actor.for_system("benchmark")
    paths = ("service", "rest") if args.path == "both" else (args.path,)
    runs: dict[str, Run] = {}
    try:
        envoys.extend(start_gateway(args.kind, work, i) for i in range(args.gateways))
        children.append(start_worker(work))
        web_port = layout.free_port()
        if "rest" in paths:
            children.append(start_web(work, web_port))
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
        for path in paths:
            if path == "service":
                runs[path] = drain_through_service(layout, system, pools["candidate"],
                                                   args.drains)
            else:
                runs[path] = drain_through_rest(f"http://127.0.0.1:{web_port}", args.drains)
        load.stop()
        candidate_arrivals = arrivals(ports["candidate"])
        for run in runs.values():
            run.late = [t for t in candidate_arrivals
                        if any(start <= t < end for start, end in run.windows)]
            run.phases = drain_phases(run.drain_ids)
    finally:
        for child in children:
            child.terminate()
        for envoy in envoys:
            envoy.stop()
        sim.terminate()
    print(f"{args.gateways} {args.kind} gateways, {args.drains} drains per path, ~{args.rps:g} "
          f"streamed requests/s, 2 cores shared by everything ({datetime.now(UTC):%Y-%m-%d}); "
          f"code: {'push engine' if layout.push is not None else 'first push in commit hooks'}")
    for path, run in runs.items():
        run.report(path)
    print(f"client requests: {load.sent} sent, {load.failed} failed")
    for error in load.errors[:5]:
        print(f"  failed: {error}")


class Run:
    """One path's drains: what the rows say and what the caller saw."""

    def __init__(self) -> None:
        self.verified_ms: list[float] = []  # request → last gateway verified (rows)
        self.answer_ms: list[float] = []  # request → the answer is in the caller's hands
        self.drain_ids: list[int] = []
        self.windows: list[tuple[float, float]] = []  # drained pool closed: verified → restore
        self.late: list[float] = []
        self.phases: dict[str, float] = {}

    def drained(self, drain_id: int, started_wall: float, answered_wall: float) -> object:
        from fleetctl.traffic.models import Drain

        self.answer_ms.append((answered_wall - started_wall) * 1000)
        wait(lambda: Drain.objects.get(pk=drain_id).status == "complete", "drain")
        done = Drain.objects.get(pk=drain_id)
        self.verified_ms.append((done.verified_at.timestamp() - started_wall) * 1000)
        self.drain_ids.append(drain_id)
        time.sleep(0.5)  # traffic flows with the candidate drained
        self.windows.append((done.verified_at.timestamp(), time.time()))
        return done

    def report(self, path: str) -> None:
        gaps = [a - v for a, v in zip(self.answer_ms, self.verified_ms, strict=True)]
        what = ("service call + first push, in this process" if path == "service" else
                "POST /api/v1/drains/ through gunicorn, bearer token")
        print(f"[{path}] {what}")
        print(f"  request → all gateways verified (rows): median "
              f"{statistics.median(self.verified_ms):.1f} ms, p99 {p99(self.verified_ms):.1f} ms,"
              f" max {max(self.verified_ms):.1f} ms")
        print(f"  request → answer arrives (caller): median {statistics.median(self.answer_ms):.1f}"
              f" ms, p99 {p99(self.answer_ms):.1f} ms")
        print(f"  answer after verified: median {statistics.median(gaps):.1f} ms, "
              f"p99 {p99(gaps):.1f} ms")
        print(f"  where the time goes (medians, from the attempt rows): first gateway contacted "
              f"at {self.phases['first']:.1f} ms, last at {self.phases['last']:.1f} ms; one push "
              f"(apply + read back) {self.phases['push']:.1f} ms")
        print(f"  requests that reached the drained pool after verified: {len(self.late)}")


def drain_through_service(layout: Layout, system: object, candidate: object, count: int) -> Run:
    from fleetctl.traffic.models import Drain

    run = Run()
    for _ in range(count):
        started_wall = time.time()
        drain = layout.drain(actor=system, pool=candidate, reason="benchmark")
        done = run.drained(drain.pk, started_wall, time.time())  # type: ignore[attr-defined]
        restore = layout.restore(actor=system, drain=done, reason="benchmark")
        wait(lambda r=restore.pk: Drain.objects.get(pk=r).status == "complete",  # type: ignore[attr-defined]
             "restore")
        time.sleep(0.5)
    return run


def drain_through_rest(base_url: str, count: int) -> Run:
    import httpx
    from django.contrib.auth.models import Group, User

    from fleetctl.accounts.actor import Actor
    from fleetctl.accounts.services import token_create_personal
    from fleetctl.traffic.models import Drain

    oncall = User.objects.create_user("bench-oncall", password="unused-" + os.urandom(8).hex())
    oncall.groups.set([Group.objects.get_or_create(name="on-call")[0]])
    token = token_create_personal(actor=Actor(user=oncall), name="bench",
                                  scopes=["read", "drain"]).secret
    run = Run()
    with httpx.Client(base_url=base_url, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        client.get("/api/v1/drains/").raise_for_status()  # a warm connection, as a CLI has
        for _ in range(count):
            started_wall = time.time()
            answer = client.post("/api/v1/drains/",
                                 json={"pool": "candidate", "reason": "benchmark"})
            answered_wall = time.time()
            if answer.status_code != 202:
                raise SystemExit(f"drain refused: {answer.status_code} {answer.text[:300]}")
            drain_id = answer.json()["id"]
            run.drained(drain_id, started_wall, answered_wall)
            restore = client.post(f"/api/v1/drains/{drain_id}/restore/",
                                  json={"reason": "benchmark"})
            if restore.status_code != 202:
                raise SystemExit(f"restore refused: {restore.status_code} {restore.text[:300]}")
            restore_id = restore.json()["id"]
            wait(lambda r=restore_id: Drain.objects.get(pk=r).status == "complete", "restore")
            time.sleep(0.5)
    return run


def drain_phases(drain_ids: list[int]) -> dict[str, float]:
    """From each drain's first push attempts: when the first and the last gateway were
    contacted after the drain was requested, and how long one push took (medians, ms)."""
    from fleetctl.traffic.models import Drain, GatewayPushAttempt

    first, last, push = [], [], []
    for drain in Drain.objects.filter(pk__in=drain_ids):
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
