"""How many results per second can one batch job checkpoint, on SQLite and on PostgreSQL:
per request (two commits a request, the old path) and with group commit (the default)?

Two parts, each run on each backend, old path and new in the same run:

**End to end, the real worker path** (`--e2e-requests`, default 3000; 0 skips it): one
simulator process (profile `ckptbench`: 1 ms decode steps, no network delay, room for 512
sequences), one job of that many one-token chat requests in one chunk at concurrency 64,
run by one `python -m fleetctl.batch.worker` process; results/s = requests / (the job's
first claim → completed), so every result is counted only once durable. The worker runs
with BATCH_CHECKPOINT_GROUP=1 (the per-request checkpoint: `dispatched` before each request,
one transaction per result) and with the settings' default group commit (100 results or
50 ms, whichever first; one dispatch checkpoint per 100 indices); both again at concurrency
8. And the ceiling: the same requests sent by the executor's `send` from as many threads, no
database at all (on a small machine the simulator and the HTTP client, not the checkpoint,
bound the worker).

**The store alone** (no pool, no HTTP), as below.

A checkpoint write is `CheckpointStore.record`: one `BatchResult` row (a 64-token chat answer
body, ~0.8 kB, as the simulator returns it) and its chunk's counters, in one transaction,
durable before it counts. Each writer is a process of its own, as batch workers are: it
claims a chunk with `store.claim` (one job per writer: a job has one holder at a time) and
calls `record` in a loop for --writes requests, starting together with the other writers.
Reported per run: writes/s in all (writes / (last end - first start)); the median over
--repeat runs; separately, a request's whole checkpoint cost, `dispatched` (the
UPDATE before it is sent) + `record`, per second; and the grouped path: `dispatched` once per
100 indices + `record_many` of 100 results (one transaction), in results/s.

Databases: a SQLite file in a temporary folder (the settings' WAL, synchronous=NORMAL,
IMMEDIATE transactions), and PostgreSQL (--database-url, default a local
`bench_h6_checkpoint`, recreated empty each time). Everything runs in this script's process
group (the writers are its children). Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/batch_checkpoint_writes.py [--writes 2000] [--repeat 3]
        [--backends sqlite,postgresql] [--database-url postgres://.../bench_h6_checkpoint]
        [--e2e-requests 3000] [--group 100]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_h6_checkpoint"
MODEL = "llama-3.1-8b-instruct"


def answer_body(i: int, tokens: int = 64) -> str:
    """A non-streamed chat completion body as the simulator returns it (what `record` stores)."""
    words = " ".join(f"word{(i * 7 + k) % 97}" for k in range(tokens))
    return json.dumps({
        "id": f"chatcmpl-{i:012d}", "object": "chat.completion", "created": 1_800_000_000,
        "model": MODEL, "system_fingerprint": "fp_sim",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": words},
                     "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 32, "completion_tokens": tokens, "total_tokens": 32 + tokens},
    })


# --- the child processes -----------------------------------------------------------------------

def django_setup(migrate: bool = False) -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
    from django.db import connection

    return connection.vendor


def role_setup(writers: int, writes: int) -> None:
    """End the previous run's jobs; one new job per writer, each one chunk of `writes`."""
    django_setup(migrate=True)
    from datetime import timedelta

    from django.utils import timezone

    from fleetctl.batch.models import BatchChunk, BatchFile, BatchJob
    from fleetctl.fleet.models import Pool, Region

    BatchJob.objects.filter(state__in=("queued", "running")).update(state="cancelled")
    region, _ = Region.objects.get_or_create(code="us-east", defaults={
        "name": "US East", "jurisdiction": "US"})
    pool = Pool.objects.filter(name="bench").first() or Pool.objects.create(
        name="bench", runtime="cuda", accelerator="H200", region=region,
        base_urls=["http://127.0.0.1:9"], max_context_tokens=4096, node_hourly_rate="10")
    batch_file = BatchFile.objects.create(name="bench.jsonl", sha256="0" * 64,
                                          path="bench.jsonl", size_bytes=0, requests=writes,
                                          uploaded_by="bench")
    for _ in range(writers):
        job = BatchJob.objects.create(input_file=batch_file, pool=pool, total=writes,
                                      created_by="bench",
                                      expires_at=timezone.now() + timedelta(hours=1))
        BatchChunk.objects.create(job=job, number=0, first_index=0, last_index=writes - 1,
                                  first_line=1, byte_start=0, byte_end=0)
    print(json.dumps({"jobs": writers}), flush=True)


def role_writer(writes: int, start_at: float, dispatch: bool, group: int) -> None:
    django_setup()
    from fleetctl.batch.store import CheckpointStore, Outcome

    store = CheckpointStore(lease_s=600)
    claim = store.claim(f"bench-writer-{os.getpid()}")
    if claim is None:
        raise SystemExit("no chunk to claim")
    bodies = [answer_body(i) for i in range(64)]
    pause = start_at - time.time()
    if pause > 0:
        time.sleep(pause)
    def outcome(i: int) -> Outcome:
        return Outcome(index=i, custom_id=f"req-{i}", status_code=200, body=bodies[i % 64],
                       error_code="", error_message="", attempts=1, prompt_tokens=32,
                       output_tokens=64, latency_ms=12.5)

    began = time.time()
    last = claim.first_index + writes
    if group > 1:  # the executor's group commit: one reservation, one record_many a group
        for start in range(claim.first_index, last, group):
            end = min(last, start + group)
            store.dispatched(claim, end - 1)
            store.record_many(claim, [outcome(i) for i in range(start, end)])
    else:
        for i in range(claim.first_index, last):
            if dispatch:
                store.dispatched(claim, i)
            store.record(claim, outcome(i))
    ended = time.time()
    print(json.dumps({"began": began, "ended": ended, "writes": writes}), flush=True)


# --- end to end: a worker process, a simulated pool --------------------------------------------

E2E_PROFILE = """
[profiles.ckptbench]
base = "h200"
description = "simulated, for the batch checkpoint benchmark: answers in a few ms"
max_seqs = 512
max_waiting = 4096
kv_cache_tokens = 4000000
decode_base_ms = 1.0
decode_per_seq_ms = 0.0
prefill_tokens_per_s = 1000000.0
network_latency_ms = 0.0
divergence_rate = 0.0
replica_noise = 0.0
"""


def role_e2e(url: str, requests: int, concurrency: int, group: int, log_path: str) -> None:
    """One job on a pool at `url`, run by one worker process started here with
    BATCH_CHECKPOINT_GROUP=`group` (0: the settings' default); prints its results/s."""
    django_setup(migrate=True)

    from fleetctl.batch.models import BatchJob, BatchResult

    sys.path.insert(0, str(REPO / "benchmarks"))
    from batch_worker_overhead import make_pool, stop, submit, wait_for

    from fleetctl.fleet.models import Pool

    BatchJob.objects.filter(state__in=("queued", "running")).update(state="cancelled")
    pool = Pool.objects.filter(name="ckpt").first() or make_pool("ckpt", url)
    lines = [json.dumps(e2e_line(i)).encode() + b"\n" for i in range(requests)]
    env = dict(os.environ)
    if group:
        env["BATCH_CHECKPOINT_GROUP"] = str(group)
    worker = subprocess.Popen(
        [sys.executable, "-m", "fleetctl.batch.worker", "--name", "ckpt", "--poll", "0.05",
         "--log-level", "WARNING"], cwd=REPO, env=env,
        stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115
    try:
        time.sleep(3.0)  # the worker has imported Django and is polling
        job = submit(pool, lines, concurrency=concurrency, chunk_size=requests,
                     request_timeout_s=60)

        def completed() -> bool:
            state = BatchJob.objects.filter(pk=job.pk).values_list("state", flat=True)[0]
            if state in ("failed", "expired", "cancelled"):
                raise SystemExit(f"job {job.pk} ended {state}")
            return state == "completed"

        wait_for(completed, 600, f"job {job.pk} to complete", every_s=0.05)
    finally:
        stop(worker)
    job = BatchJob.objects.get(pk=job.pk)
    results = BatchResult.objects.filter(job=job)
    assert job.finished_at is not None and job.started_at is not None
    span = (job.finished_at - job.started_at).total_seconds()
    print(json.dumps({"rate": results.count() / span, "results": results.count(),
                      "ok": results.filter(status_code=200).count(),
                      "resends": job.resends.count(),
                      "duplicates": job.duplicates_refused}), flush=True)


def e2e_line(i: int) -> dict[str, Any]:
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "max_tokens": 1, "temperature": 0,
                     "messages": [{"role": "user", "content": f"q {i}"}]}}


def role_http(url: str, requests: int, concurrency: int) -> None:
    """The ceiling without a database: the executor's `send` of the same requests from
    `concurrency` threads (as the worker's senders), results/s."""
    django_setup()
    from concurrent.futures import ThreadPoolExecutor

    from fleetctl.batch.executor import send

    began = time.monotonic()
    with ThreadPoolExecutor(concurrency) as senders:
        replies = list(senders.map(lambda i: send(url, e2e_line(i), timeout_s=60),
                                   range(requests)))
    rate = requests / (time.monotonic() - began)
    print(json.dumps({"rate": rate, "results": requests, "ok": sum(r.ok for r in replies),
                      "duplicates": 0}), flush=True)


# --- the orchestration ---------------------------------------------------------------------------

def _child(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"a benchmark child failed (exit {proc.returncode})")
    return dict(json.loads(out.strip().splitlines()[-1]))


def one_run(env: dict[str, str], writers: int, writes: int, dispatch: bool,
            group: int = 1) -> float:
    _result(_child(env, "--role", "setup", "--writers", str(writers), "--writes", str(writes)))
    start_at = time.time() + 4.0  # every writer has imported Django and claimed by then
    procs = [_child(env, "--role", "writer", "--writes", str(writes), "--start-at",
                    f"{start_at:.3f}", "--group", str(group),
                    *(["--dispatch"] if dispatch else []))
             for _ in range(writers)]
    try:
        done = [_result(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    span = max(d["ended"] for d in done) - min(d["began"] for d in done)
    return sum(d["writes"] for d in done) / span


def backend_env(backend: str, database_url: str, folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PYTHONPATH"] = str(REPO)
    if backend == "postgresql":
        import psycopg

        name = database_url.rsplit("/", 1)[1]
        with psycopg.connect(database_url.rsplit("/", 1)[0] + "/postgres",
                             autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        env["DATABASE_URL"] = database_url
    else:
        env["FLEETCTL_DATA_DIR"] = str(folder / "sqlite")
    env["BATCH_FILES_DIR"] = str(folder / "files")
    from fleetctl.demo.devstack import local_destinations

    local_destinations(env)  # the simulated pool listens on loopback
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=2000, help="per writer and run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--database-url", default=DEFAULT_PG)
    parser.add_argument("--e2e-requests", type=int, default=3000,
                        help="requests of the end-to-end job (0: skip the end-to-end part)")
    parser.add_argument("--group", type=int, default=100,
                        help="results per group on the store-alone grouped row")
    parser.add_argument("--role", choices=["setup", "writer", "e2e", "http"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=64, help=argparse.SUPPRESS)
    parser.add_argument("--log", default="", help=argparse.SUPPRESS)
    parser.add_argument("--writers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--dispatch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "setup":
        return role_setup(args.writers, args.writes)
    if args.role == "writer":
        return role_writer(args.writes, args.start_at, args.dispatch, args.group)
    if args.role == "e2e":
        return role_e2e(args.url, args.e2e_requests, args.concurrency, args.group, args.log)
    if args.role == "http":
        return role_http(args.url, args.e2e_requests, args.concurrency)

    print(f"batch_checkpoint_writes: {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}; {args.writes} writes per writer and run, "
          f"{args.repeat} runs", flush=True)
    table: list[tuple[str, str, float]] = []
    grouped = f"grouped by {args.group}, 1 writer"
    with tempfile.TemporaryDirectory(prefix="batch-checkpoint-bench-") as tmp:
        sim = None
        if args.e2e_requests:
            sys.path.insert(0, str(REPO / "benchmarks"))
            from batch_worker_overhead import start_sim

            sim = start_sim(Path(tmp) / "sim", E2E_PROFILE, {"ckpt": "ckptbench"})
        try:
            for backend in args.backends.split(","):
                env = backend_env(backend, args.database_url, Path(tmp) / backend)
                if sim is not None:
                    for label, group, concurrency in (
                            ("HTTP alone, no database, c=64", -1, 64),
                            ("worker, per request (old), c=64", 1, 64),
                            ("worker, group commit, c=64", 0, 64),
                            ("HTTP alone, no database, c=8", -1, 8),
                            ("worker, per request (old), c=8", 1, 8),
                            ("worker, group commit, c=8", 0, 8)):
                        if group < 0 and backend != args.backends.split(",")[0]:
                            continue  # the same figure for every backend
                        runs = [_result(_child(
                            env, "--role", "e2e" if group >= 0 else "http", "--url",
                            sim.url("ckpt"), "--e2e-requests", str(args.e2e_requests),
                            "--concurrency", str(concurrency),
                            "--group", str(group), "--log", str(Path(tmp) / "worker.log")))
                            for _ in range(args.repeat)]
                        rates = [r["rate"] for r in runs]
                        median = statistics.median(rates)
                        table.append((backend, label, median))
                        checks = "; ".join(f"{r['results']} results, {r['ok']} ok, "
                                           f"{r['duplicates']} dup" for r in runs[:1])
                        print(f"{backend:>10}  {label:<34} runs "
                              f"{', '.join(f'{r:,.0f}' for r in rates)} results/s -> median "
                              f"{median:,.0f} /s ({checks})", flush=True)
                for label, writers, dispatch, group in (
                        ("record, 1 writer", 1, False, 1),
                        ("record, 2 writers", 2, False, 1),
                        ("dispatched + record, 1 writer", 1, True, 1),
                        (grouped, 1, True, args.group)):
                    rates = [one_run(env, writers, args.writes, dispatch, group)
                             for _ in range(args.repeat)]
                    median = statistics.median(rates)
                    table.append((backend, label, median))
                    print(f"{backend:>10}  {label:<34} runs "
                          f"{', '.join(f'{r:,.0f}' for r in rates)} /s  -> median "
                          f"{median:,.0f} /s", flush=True)
        finally:
            if sim is not None:
                sim.stop()
    print("\nmedian results checkpointed per second (worker rows: a job end to end, first "
          "claim to completed; the others: the store alone):")
    for backend, label, median in table:
        print(f"  {backend:<10} {label:<34} {median:8,.0f} /s")
    print(f"load average now {os.getloadavg()[0]:.2f} (2 cores shared with other work: "
          "figures are lower bounds)")


if __name__ == "__main__":
    main()
