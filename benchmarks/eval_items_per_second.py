"""How many items per second one eval worker scores at concurrency 32 against simulated pools.

An eval run of the bundled `fleetctl-core` suite (1,200 items) on two simulated pools (a
candidate and its primary: 2,400 (item, pool) rows), driven by one real Celery worker process
on the `evals` queue (`evals.run`, threads pool, as the demo's `worker-evals`), with the run's
concurrency at 32. Each row is one streamed request straight to a pool and one score. Measured
per run:

  * from the rows: the first row's `scored_at` to the last's (the worker's steady rate);
  * wall clock: `run_create` returns -> the run reads `complete` (queueing, the worker picking
    the task up, the statistics and the evidence included).

Reported: rows/s and items/s (an item is scored on both pools: rows / 2) for each, the median
of `--runs` runs (default 3), and the CPU time the worker process and the simulator spent per
row (from /proc: user + system), which does not depend on what else the machine runs: 1000 /
(worker CPU ms per row) is the rows/s one core would give the worker if nothing else ran.
Two pool profiles, one after the other:

  * `fast`: the simulator's H200 with 1 ms decode steps and no network delay, so the
    simulator answers almost at once and the worker's own cost (HTTP, parsing, scoring,
    writing rows) is what limits;
  * `demo`: the demo's built-in `h200` and `mi300x` profiles (10-11 ms per token), what a
    run against `make demo`'s fleet sees.

Everything real: PostgreSQL (`DATABASE_URL`, default a local `fleetctl_bench_evals`), Redis
(`REDIS_URL`, default db 7), the simulator in a process of its own, the worker in another. The
machine's cores are shared by the simulator, the worker and PostgreSQL: the figures are for
this box, whatever it is (the script prints its CPU count).

    .venv/bin/python benchmarks/eval_items_per_second.py [--runs 3] [--concurrency 32]
        [--profile fast|demo|both] [--suite fleetctl-core]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "llama-3.1-8b-instruct"
PROFILES = """
[profiles.fast]
base = "h200"
decode_base_ms = 1.0
decode_per_seq_ms = 0.0
network_latency_ms = 0.0
"""
POOLS = {"fast": {"primary": "fast", "candidate": "fast"},
         "demo": {"primary": "h200", "candidate": "mi300x"}}


def setup_env() -> None:
    os.environ.setdefault("DATABASE_URL",
                          "postgres://postgres@127.0.0.1:5432/fleetctl_bench_evals")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/7")
    from fleetctl.demo.devstack import local_destinations
    local_destinations(os.environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    from benchmarks.overview_and_pools_api import ensure_database

    ensure_database(os.environ["DATABASE_URL"])


def start_sim(workdir: Path, which: str) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """The two pools of profile set `which`, each on a free port, answering."""
    import httpx

    from fleetctl.core.ports import free_port

    (workdir / "profiles.toml").write_text(PROFILES)
    ports = {role: free_port() for role in POOLS[which]}
    args = [sys.executable, "-m", "fleetctl.sim", "--profiles", str(workdir / "profiles.toml"),
            "--model", MODEL, "--log-level", "WARNING"]
    for role, profile in POOLS[which].items():
        args += ["--pool", f"{role}={profile}@{ports[role]}"]
    log = workdir / f"sim-{which}.log"
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=log.open("wb"))
    urls = {role: f"http://127.0.0.1:{port}" for role, port in ports.items()}
    deadline = time.monotonic() + 30
    for url in urls.values():
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the simulator did not start; see {log}")
            time.sleep(0.05)
    return proc, urls


def start_worker(workdir: Path) -> subprocess.Popen[bytes]:
    """One worker on the evals queue, as the demo's worker-evals (threads)."""
    from fleetctl.celery import app

    log = workdir / "worker.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "fleetctl", "worker", "-Q", "evals",
         "-c", "2", "--pool", "threads", "-l", "WARNING", "--without-gossip",
         "--without-mingle", "-n", f"bench-evals-{os.getpid()}@%h"],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not app.control.ping(timeout=0.5):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the worker did not start; see {log}")
    return proc


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def purge_queues() -> None:
    from fleetctl.celery import QUEUES, app

    with app.connection_for_write() as conn:
        for queue in QUEUES:
            conn.default_channel.queue_purge(queue)  # type: ignore[attr-defined]


def one_run(suite_name: str, urls: dict[str, str], concurrency: int, number: int,
            which: str, pids: tuple[int, int]) -> tuple[float, float, int, str, float, float]:
    """(rows/s from the rows, rows/s wall clock, rows, verdict, worker CPU ms per row,
    simulator CPU ms per row) of one fresh run; `pids` the worker's and the simulator's."""
    from django.db.models import Max, Min

    from fleetctl.accounts.actor import Actor
    from fleetctl.evals import services
    from fleetctl.evals.models import EvalResult, EvalRun
    from fleetctl.fleet import services as fleet
    from fleetctl.fleet.models import Pool, Region

    system = Actor.for_system("benchmark")
    region = Region.objects.filter(code="us-east").first() or fleet.region_create(
        actor=system, code="us-east", name="US", jurisdiction="US")
    pools = {}
    for role, url in urls.items():
        name = f"{which}-{role}-{number}"
        pool = Pool.objects.filter(name=name).first()
        if pool is None:
            pool = fleet.pool_create(actor=system, name=name, runtime="cuda",
                                     accelerator="sim", region=region, base_urls=[url],
                                     max_context_tokens=32768, node_hourly_rate="1")
            fleet.pool_model_create(actor=system, pool=pool, model_id=MODEL,
                                    max_context_tokens=32768)
        pools[role] = pool
    suite = services.suite_lookup(suite_name)
    cpu_before = [cpu_s(pid) for pid in pids]
    start = time.perf_counter()
    run = services.run_create(actor=system, suite=suite, candidate=pools["candidate"],
                              primary=pools["primary"], model_id=MODEL,
                              concurrency=concurrency, timeout_s=60)
    deadline = time.monotonic() + 3600
    while EvalRun.objects.filter(pk=run.pk, status__in=EvalRun.ACTIVE).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{run} did not finish within an hour")
        time.sleep(0.05)
    wall = time.perf_counter() - start
    worker_cpu, sim_cpu = (cpu_s(pid) - before for pid, before in zip(pids, cpu_before,
                                                                       strict=True))
    run = EvalRun.objects.get(pk=run.pk)
    if run.status != "complete":
        raise SystemExit(f"{run} ended {run.status}: {run.error}")
    span = EvalResult.objects.filter(run=run).aggregate(first=Min("scored_at"),
                                                        last=Max("scored_at"))
    rows = EvalResult.objects.filter(run=run, status="done").count()
    from_rows = (span["last"] - span["first"]).total_seconds()
    return ((rows - 1) / from_rows, rows / wall, rows, run.verdict,
            1000 * worker_cpu / rows, 1000 * sim_cpu / rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--profile", choices=["fast", "demo", "both"], default="both")
    parser.add_argument("--suite", default="fleetctl-core")
    args = parser.parse_args()
    setup_env()
    import logging

    import django

    django.setup()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per health check otherwise
    from django.core.management import call_command

    from fleetctl.accounts.actor import Actor
    from fleetctl.evals import services

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    purge_queues()
    services.suite_install_bundled(actor=Actor.for_system("benchmark"), names=[args.suite])
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"eval items per second: one worker (evals queue, threads), run concurrency "
          f"{args.concurrency}, suite {args.suite}, two simulated pools; {os.cpu_count()} "
          f"CPUs shared by the simulator, the worker and PostgreSQL; median of {args.runs}")
    work = Path(tempfile.mkdtemp(prefix="fleetctl-evals-bench-"))
    worker = start_worker(work)
    try:
        for which in (["fast", "demo"] if args.profile == "both" else [args.profile]):
            sim, urls = start_sim(work, which)
            try:
                got = []
                for number in range(1, args.runs + 1):
                    by_rows, by_wall, rows, verdict, worker_ms, sim_ms = one_run(
                        args.suite, urls, args.concurrency, number, which,
                        (worker.pid, sim.pid))
                    got.append((by_rows, by_wall, worker_ms, sim_ms))
                    print(f"  {which:<5} run {number}: {rows} rows; {by_rows:7.1f} rows/s "
                          f"first->last scored, {by_wall:7.1f} rows/s wall clock; CPU per "
                          f"row: worker {worker_ms:.1f} ms, simulator {sim_ms:.1f} ms "
                          f"(verdict {verdict})", flush=True)
                rows_s, wall_s, worker_ms, sim_ms = (statistics.median(g[i] for g in got)
                                                     for i in range(4))
                print(f"{which:<5} ({' vs '.join(POOLS[which].values())}): "
                      f"{rows_s / 2:,.1f} items/s ({rows_s:,.1f} rows/s) first->last scored; "
                      f"{wall_s / 2:,.1f} items/s ({wall_s:,.1f} rows/s) wall clock; worker "
                      f"{worker_ms:.1f} CPU ms a row ({1000 / worker_ms:,.0f} rows/s a core), "
                      f"simulator {sim_ms:.1f}", flush=True)
            finally:
                stop(sim)
    finally:
        stop(worker)
        purge_queues()
    print(f"logs in {work}")


if __name__ == "__main__":
    main()
