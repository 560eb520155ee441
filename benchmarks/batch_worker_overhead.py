"""What does checkpointing cost? One batch worker process against a simulated pool, compared
with the project's benchmark client on the same pool at the same concurrency and request mix
(target: the worker within 10 % of the client's requests/s and output tokens/s).

One simulator process (profile `batchbench`: h200-like, 8 ms + 0.05 ms per sequence per
decode step, no network delay, room for 512 sequences) serves MODEL. The request mix: 64
rows of prompts of 64-512 tokens and 64-192 output tokens (`ignore_eos`, so every answer is
exactly its max_tokens), the same bodies both ways (fleetctl/bench/runner.py's PromptMaker;
the batch input has them without `stream`). Per repetition, alternating:

- **client**: `fleetctl.bench.runner.run_level` at fixed concurrency --concurrency, in this
  process (what `fleetctl bench run` drives): requests/s and output tokens/s over its
  steady-state window (after a 3 s warm-up), as it reports them. The client streams (SSE);
  the simulator's decode timing is the same streamed or not.
- **worker**: a job of --requests lines with that concurrency (chunk size --chunk-size),
  submitted through the services, run by one `python -m fleetctl.batch.worker` process
  (started once, before the first repetition). Its figures come from the result rows: the
  results between the 10th and the 90th percentile of finish times (the ramp and the tail
  left out, as the client's window leaves them out) over that span; the whole job
  (first claim → completed) is printed too, and the mean requests in flight (the results'
  latencies summed over the job's span: below the concurrency when the worker keeps fewer on
  the wire, e.g. while a chunk drains before the next is claimed). Every result is
  checkpointed as in production
  (group commit, fleetctl/batch/store.py): a dispatch checkpoint per 100 indices, results
  and the chunk's counters committed 100 at a time or every 50 ms, the lease renewed, chunks
  claimed one after another. (The figures in docs/figures.md predate group commit.)

PostgreSQL (--database-url, default a local `bench_h6_worker`, recreated empty), Redis
(REDIS_URL, default db 9). The simulator and the worker are children of this script (one
process group), stopped at the end. Prints medians and the overhead; asserts nothing. Usage:

    .venv/bin/python benchmarks/batch_worker_overhead.py [--repeat 3] [--requests 1500]
        [--concurrency 32] [--chunk-size 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MODEL = "llama-3.1-8b-instruct"
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_h6_worker"
TARGET_OVERHEAD = 0.10
PROFILE = """
[profiles.batchbench]
base = "h200"
description = "simulated, for the batch worker benchmarks"
max_seqs = 512
max_waiting = 4096
kv_cache_tokens = 4000000
decode_base_ms = 8.0
decode_per_seq_ms = 0.05
prefill_tokens_per_s = 200000.0
network_latency_ms = 0.0
divergence_rate = 0.0
"""


@dataclass(frozen=True)
class Row:
    """One request of the mix (fleetctl.bench.runner's TraceRequestLike)."""

    prompt_tokens: int
    completion_tokens: int
    arrival_s: float = 0.0
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prefix_group: str | None = None
    prefix_tokens: int = 0


def mix(n: int = 64, seed: int = 7) -> list[Row]:
    rng = random.Random(seed)
    return [Row(rng.randrange(64, 513), rng.randrange(64, 193)) for _ in range(n)]


# --- set-up shared with benchmarks/batch_resume.py ----------------------------------------------

def setup_django(database_url: str, files_dir: Path, **extra_env: str) -> dict[str, str]:
    """A fresh PostgreSQL database, migrated; returns the environment for child processes."""
    import psycopg

    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
    from fleetctl.demo.devstack import local_destinations
    local_destinations(os.environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    os.environ["BATCH_FILES_DIR"] = str(files_dir)
    os.environ.update(extra_env)
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    return {**os.environ, "PYTHONPATH": str(REPO)}


def start_sim(work: Path, profiles: str, pools: dict[str, str]) -> Any:
    from tests.sim.simproc import sim_with_profiles

    return sim_with_profiles(work, profiles, pools)


def make_pool(name: str, url: str) -> Any:
    """A Pool row for a simulated pool: serves MODEL, healthy."""
    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet.models import Region
    from fleetctl.fleet.services import (
        pool_create,
        pool_health_record,
        pool_model_create,
        region_create,
    )

    actor = Actor.for_system("bench")
    region = Region.objects.filter(code="us-east").first() or region_create(
        actor=actor, code="us-east", name="US East", jurisdiction="US")
    pool = pool_create(actor=actor, name=name, runtime="cuda", accelerator="H200",
                       region=region, base_urls=[url], max_context_tokens=32768,
                       node_hourly_rate="10.50")
    pool_model_create(actor=actor, pool=pool, model_id=MODEL, max_context_tokens=32768)
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0,
                       models_seen=[MODEL])
    pool.refresh_from_db()
    return pool


def start_worker(env: dict[str, str], log: Path, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "fleetctl.batch.worker", "--name", name, "--poll", "0.1",
         "--log-level", "WARNING"],
        cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def stop(proc: Any) -> None:
    if hasattr(proc, "stop") and not isinstance(proc, subprocess.Popen):
        proc.stop()
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def submit(pool: Any, lines: list[bytes], **options: Any) -> Any:
    """A job of `lines` (JSONL lines) on `pool`, through the services as an upload is."""
    from fleetctl.accounts.actor import Actor
    from fleetctl.batch import services

    actor = Actor.for_system("bench")
    batch_file = services.file_upload(actor=actor, name="bench.jsonl",
                                      stream=io.BytesIO(b"".join(lines)))
    return services.job_create(actor=actor, input_file=batch_file, pool=pool,
                               compare_sample=0, **options)


def wait_for(predicate: Any, timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


def job_done(job_id: int) -> bool:
    from fleetctl.batch.models import BatchJob

    state = BatchJob.objects.filter(pk=job_id).values_list("state", flat=True).first()
    if state in ("failed", "expired", "cancelled"):
        raise SystemExit(f"job {job_id} ended {state}")
    return state == "completed"


# --- this benchmark ----------------------------------------------------------------------------

def batch_lines(rows: list[Row], n: int, url: str) -> list[bytes]:
    from fleetctl.bench.runner import Endpoint, PromptMaker

    maker = PromptMaker(Endpoint(url, MODEL))
    out = []
    for i in range(n):
        body = json.loads(maker.body(rows[i % len(rows)], i))
        body.pop("stream", None)
        body.pop("stream_options", None)
        out.append(json.dumps({"custom_id": f"req-{i}", "method": "POST",
                               "url": "/v1/chat/completions", "body": body}).encode() + b"\n")
    return out


def client_level(url: str, rows: list[Row], concurrency: int, window_s: float
                 ) -> tuple[float, float]:
    from fleetctl.bench.runner import Endpoint, LevelPlan, run_level
    from fleetctl.bench.stats import summarize

    plan = LevelPlan(warmup_s=3.0, window_s=window_s, min_samples=1, max_duration_s=300.0,
                     request_timeout_s=120.0)
    level = asyncio.run(run_level(Endpoint(url, MODEL), rows, plan, concurrency=concurrency))
    summary = summarize(level.samples())
    if summary.n_errors or summary.n_timeouts:
        print(f"  (client: {summary.n_errors} errors, {summary.n_timeouts} timeouts)")
    return summary.request_rate_per_s, summary.output_tokens_per_s


def worker_job(pool: Any, lines: list[bytes], concurrency: int, chunk_size: int
               ) -> tuple[float, float, float, float]:
    """(requests/s, output tokens/s) over the 10th-90th percentile of finish times, the whole
    job's requests/s, and the mean requests in flight (the sum of the results' latencies over
    the job's span: below the concurrency when the worker keeps fewer on the wire)."""
    from fleetctl.batch.models import BatchJob, BatchResult

    job = submit(pool, lines, concurrency=concurrency, chunk_size=chunk_size,
                 request_timeout_s=120)
    wait_for(lambda: job_done(job.pk), 900, f"job {job.pk} to complete", every_s=0.5)
    job = BatchJob.objects.get(pk=job.pk)
    rows = list(BatchResult.objects.filter(job=job).order_by("finished_at")
                .values_list("finished_at", "output_tokens", "status_code", "latency_ms"))
    bad = sum(1 for _, _, status, _ in rows if not 200 <= status < 300)
    if bad:
        print(f"  (worker: {bad} failed requests)")
    lo, hi = len(rows) // 10, (len(rows) * 9) // 10
    span = (rows[hi][0] - rows[lo][0]).total_seconds()
    tokens = sum(t for _, t, _, _ in rows[lo + 1:hi + 1])
    job_span = (job.finished_at - job.started_at).total_seconds()
    in_flight = sum(latency or 0.0 for _, _, _, latency in rows) / 1000 / job_span
    return (hi - lo) / span, tokens / span, len(rows) / job_span, in_flight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1500, help="lines of each job")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunk-size", type=int, default=1000,
                        help="requests per chunk (1000: the job default, DEFAULT_CHUNK_SIZE)")
    parser.add_argument("--window", type=float, default=15.0, help="client window, seconds")
    parser.add_argument("--database-url", default=DEFAULT_PG)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="batch-worker-bench-"))
    env = setup_django(args.database_url, work / "files")
    print(f"batch_worker_overhead: {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}; concurrency {args.concurrency}, {args.requests} requests "
          f"per job in chunks of {args.chunk_size}; {args.repeat} repetitions", flush=True)
    sim = start_sim(work, PROFILE, {"bench": "batchbench"})
    url = sim.url("bench")
    pool = make_pool("bench", url)
    rows = mix()
    lines = batch_lines(rows, args.requests, url)
    worker = start_worker(env, work / "worker.log", "bench")
    client_rps, client_tps, worker_rps, worker_tps, whole_rps = [], [], [], [], []
    try:
        for rep in range(1, args.repeat + 1):
            rps, tps = client_level(url, rows, args.concurrency, args.window)
            client_rps.append(rps)
            client_tps.append(tps)
            wrps, wtps, whole, in_flight = worker_job(pool, lines, args.concurrency,
                                                      args.chunk_size)
            worker_rps.append(wrps)
            worker_tps.append(wtps)
            whole_rps.append(whole)
            print(f"rep {rep}: client {rps:6.1f} req/s {tps:8.0f} tok/s | worker {wrps:6.1f} "
                  f"req/s {wtps:8.0f} tok/s (whole job {whole:.1f} req/s, "
                  f"{in_flight:.1f} in flight on average) | overhead "
                  f"{1 - wrps / rps:+.1%} req/s, {1 - wtps / tps:+.1%} tok/s", flush=True)
    finally:
        stop(worker)
        stop(sim)
    c_rps, c_tps = statistics.median(client_rps), statistics.median(client_tps)
    w_rps, w_tps = statistics.median(worker_rps), statistics.median(worker_tps)
    print("\nmedians")
    print(f"  benchmark client: {c_rps:.1f} requests/s, {c_tps:,.0f} output tokens/s")
    print(f"  batch worker:     {w_rps:.1f} requests/s, {w_tps:,.0f} output tokens/s "
          f"(whole job, ramp and tail included: {statistics.median(whole_rps):.1f} req/s)")
    print(f"  worker / client:  {w_rps / c_rps:.3f} requests, {w_tps / c_tps:.3f} tokens -> "
          f"overhead {1 - w_rps / c_rps:.1%} requests/s, {1 - w_tps / c_tps:.1%} tokens/s "
          f"(target ≤ {TARGET_OVERHEAD:.0%})")
    print(f"  load average now {os.getloadavg()[0]:.2f}; logs: {work}")


if __name__ == "__main__":
    main()
