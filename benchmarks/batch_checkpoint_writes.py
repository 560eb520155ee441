"""How many checkpoint writes per second does the batch checkpoint store take, on SQLite and
on PostgreSQL, with one writer and with two?

A checkpoint write is `CheckpointStore.record`: one `BatchResult` row (a 64-token chat answer
body, ~0.8 kB, as the simulator returns it) and its chunk's counters, in one transaction,
durable before it counts. Each writer is a process of its own, as batch workers are: it
claims a chunk with `store.claim` (one job per writer: a job has one holder at a time) and
calls `record` in a loop for --writes requests, starting together with the other writers.
Reported per run: writes/s in all (writes / (last end - first start)); the median over
--repeat runs; and, separately, a request's whole checkpoint cost, `dispatched` (the
UPDATE before it is sent) + `record`, per second.

Databases: a SQLite file in a temporary folder (the settings' WAL, synchronous=NORMAL,
IMMEDIATE transactions), and PostgreSQL (--database-url, default a local
`bench_h6_checkpoint`, recreated empty each time). Everything runs in this script's process
group (the writers are its children). Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/batch_checkpoint_writes.py [--writes 2000] [--repeat 3]
        [--backends sqlite,postgresql] [--database-url postgres://.../bench_h6_checkpoint]
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


def role_writer(writes: int, start_at: float, dispatch: bool) -> None:
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
    began = time.time()
    for i in range(claim.first_index, claim.first_index + writes):
        if dispatch:
            store.dispatched(claim, i)
        store.record(claim, Outcome(
            index=i, custom_id=f"req-{i}", status_code=200, body=bodies[i % 64], error_code="",
            error_message="", attempts=1, prompt_tokens=32, output_tokens=64,
            latency_ms=12.5))
    ended = time.time()
    print(json.dumps({"began": began, "ended": ended, "writes": writes}), flush=True)


# --- the orchestration ---------------------------------------------------------------------------

def _child(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"a benchmark child failed (exit {proc.returncode})")
    return dict(json.loads(out.strip().splitlines()[-1]))


def one_run(env: dict[str, str], writers: int, writes: int, dispatch: bool) -> float:
    _result(_child(env, "--role", "setup", "--writers", str(writers), "--writes", str(writes)))
    start_at = time.time() + 4.0  # every writer has imported Django and claimed by then
    procs = [_child(env, "--role", "writer", "--writes", str(writes), "--start-at",
                    f"{start_at:.3f}", *(["--dispatch"] if dispatch else []))
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
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=2000, help="per writer and run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--database-url", default=DEFAULT_PG)
    parser.add_argument("--role", choices=["setup", "writer"], help=argparse.SUPPRESS)
    parser.add_argument("--writers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--dispatch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "setup":
        return role_setup(args.writers, args.writes)
    if args.role == "writer":
        return role_writer(args.writes, args.start_at, args.dispatch)

    print(f"batch_checkpoint_writes: {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}; {args.writes} writes per writer and run, "
          f"{args.repeat} runs", flush=True)
    table: list[tuple[str, str, float]] = []
    with tempfile.TemporaryDirectory(prefix="batch-checkpoint-bench-") as tmp:
        for backend in args.backends.split(","):
            env = backend_env(backend, args.database_url, Path(tmp) / backend)
            for label, writers, dispatch in (("record, 1 writer", 1, False),
                                             ("record, 2 writers", 2, False),
                                             ("dispatched + record, 1 writer", 1, True)):
                rates = [one_run(env, writers, args.writes, dispatch)
                         for _ in range(args.repeat)]
                median = statistics.median(rates)
                table.append((backend, label, median))
                print(f"{backend:>10}  {label:<30} runs "
                      f"{', '.join(f'{r:,.0f}' for r in rates)} /s  -> median {median:,.0f} /s",
                      flush=True)
    print("\nmedian checkpoint writes per second (one result row + the chunk's counters, one "
          "transaction each):")
    for backend, label, median in table:
        print(f"  {backend:<10} {label:<30} {median:8,.0f} /s")
    print(f"load average now {os.getloadavg()[0]:.2f} (2 cores shared with other work: "
          "figures are lower bounds)")


if __name__ == "__main__":
    main()
