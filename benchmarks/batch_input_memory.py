"""Peak memory and time of taking in a 1,000,000-line batch input (target ≤ 200 MiB).

Writes an OpenAI Batch JSONL input of --lines requests (default 1,000,000; chat requests
with prompts of 40-400 characters, ~250 bytes a line, ~250 MB) to a temporary folder, then
measures two paths:

- **Upload through the web server**: gunicorn (`fleetctl.wsgi`, one worker process, 2
  threads, the production timeout raised to 900 s for the upload) on a free port, and the
  file POSTed as multipart to `/api/v1/batch/files/` with a bearer token (scope `jobs`), as
  `fleetctl batch submit` and any automation do: Django spools the upload to a temporary
  file, the view validates it line by line (fleetctl/batch/inputs.py) while storing it.
  Reported: the answer's status and requests counted, the time from the first byte sent to
  the answer, and the worker's peak RSS (VmHWM of the gunicorn worker process, which
  handled nothing else) before the upload and after it.
- **The validation function alone** (`inputs.read_input` on the file), in a fresh process
  of its own: time, lines/s, peak RSS (getrusage ru_maxrss) against the RSS after Django's
  set-up; and in a second fresh process, tracemalloc's peak of Python allocations during
  the call (slower: tracemalloc traces every allocation; --no-tracemalloc skips it).

PostgreSQL (--database-url, default a local `bench_h6_input`, recreated empty), Redis
(REDIS_URL, default db 9). Everything started here is a child of this script (one process
group) and stopped at the end. Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/batch_input_memory.py [--lines 1000000] [--repeat 1]
        [--no-tracemalloc] [--skip-web]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_h6_input"
MODEL = "llama-3.1-8b-instruct"
TARGET_MIB = 200
WORDS = ["the", "river", "stone", "light", "model", "pool", "answer", "token", "quick",
         "brown", "fox", "jumps", "over", "lazy", "dog", "summarise", "translate", "classify",
         "extract", "review", "explain", "following", "text", "please", "invoice", "customer",
         "order", "shipment", "delay", "refund", "policy", "account"]


def write_input(path: Path, lines: int) -> int:
    """The input file; returns its size in bytes."""
    rng = random.Random(16)
    with path.open("wb") as out:
        batch: list[str] = []
        for i in range(lines):
            prompt = " ".join(rng.choices(WORDS, k=rng.randrange(4, 32)))
            batch.append(json.dumps({
                "custom_id": f"req-{i:07d}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                         "max_tokens": 64 + i % 64, "temperature": 0}},
                separators=(",", ":")))
            if len(batch) >= 10_000:
                out.write(("\n".join(batch) + "\n").encode())
                batch.clear()
        if batch:
            out.write(("\n".join(batch) + "\n").encode())
    return path.stat().st_size


def _mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB"


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


# --- the validation function, in a process of its own ---------------------------------------

def role_validate(path: Path, dest: Path, trace: bool) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    import django

    django.setup()
    import tracemalloc

    from fleetctl.batch import inputs

    baseline_kib = _status_kib(os.getpid(), "VmRSS")
    if trace:
        tracemalloc.start()
    began = time.perf_counter()
    with path.open("rb") as stream:
        summary = inputs.read_input(stream, dest_dir=dest)
    elapsed = time.perf_counter() - began
    traced_peak = tracemalloc.get_traced_memory()[1] if trace else None
    summary.path.unlink()
    print(json.dumps({
        "requests": summary.requests, "seconds": elapsed, "baseline_kib": baseline_kib,
        "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "traced_peak_bytes": traced_peak}), flush=True)


def validate_in_child(env: dict[str, str], path: Path, dest: Path, trace: bool
                      ) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--role", "validate", "--file", str(path), "--dest",
         str(dest), *(["--trace"] if trace else [])],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"validation process failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --- the web server --------------------------------------------------------------------------

def recreate_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(database_url: str, files_dir: Path) -> dict[str, str]:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
    from fleetctl.demo.devstack import local_destinations
    local_destinations(os.environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    os.environ["BATCH_FILES_DIR"] = str(files_dir)
    recreate_database(database_url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return {**os.environ, "PYTHONPATH": str(REPO)}


def make_token() -> str:
    from django.contrib.auth.models import Group, User

    from fleetctl.accounts.actor import Actor
    from fleetctl.accounts.services import token_create_personal

    user = User.objects.create_user("bench-batch", password="unused-" + os.urandom(8).hex())
    user.groups.set([Group.objects.get_or_create(name="on-call")[0]])
    return token_create_personal(actor=Actor(user=user), name="bench",
                                 scopes=["read", "jobs"]).secret


def start_web(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    """gunicorn with one worker; returns (master, base URL, the worker's pid)."""
    import httpx
    import psutil

    from fleetctl.core.ports import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "fleetctl.wsgi", "-b", f"127.0.0.1:{port}",
         "-w", "1", "--threads", "2", "--timeout", "900"],
        cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/api/v1/", timeout=2)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"web did not start; see {log}") from None
            time.sleep(0.2)
    workers = psutil.Process(proc.pid).children()
    if len(workers) != 1:
        raise SystemExit(f"expected one gunicorn worker, found {len(workers)}")
    return proc, url, workers[0].pid


def upload_through_web(url: str, token: str, path: Path, worker: int) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=900) as client:
        client.get("/api/v1/batch/files/").raise_for_status()  # warm: imports, first queries
        before = _status_kib(worker, "VmHWM")
        began = time.perf_counter()
        with path.open("rb") as stream:
            answer = client.post("/api/v1/batch/files/",
                                 files={"file": (path.name, stream, "application/jsonl")},
                                 data={"name": path.name})
        elapsed = time.perf_counter() - began
    body = answer.json() if answer.headers.get("content-type", "").startswith(
        "application/json") else {"text": answer.text[:300]}
    return {"status": answer.status_code, "seconds": elapsed, "before_kib": before,
            "peak_kib": _status_kib(worker, "VmHWM"), "body": body}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1,
                        help="timed validations in fresh processes (the median is printed)")
    parser.add_argument("--database-url", default=DEFAULT_PG)
    parser.add_argument("--no-tracemalloc", action="store_true")
    parser.add_argument("--skip-web", action="store_true")
    parser.add_argument("--role", choices=["validate"], help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dest", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "validate":
        return role_validate(args.file, args.dest, args.trace)

    with tempfile.TemporaryDirectory(prefix="batch-input-bench-") as tmp:
        folder = Path(tmp)
        path = folder / "input.jsonl"
        began = time.perf_counter()
        size = write_input(path, args.lines)
        print(f"batch_input_memory: {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.2f}; input {args.lines:,} lines, {size / 1e6:.0f} MB "
              f"({size / args.lines:.0f} bytes a line), written in "
              f"{time.perf_counter() - began:.0f} s", flush=True)
        env = setup_django(args.database_url, folder / "files")

        runs = [validate_in_child(env, path, folder / "files", False)
                for _ in range(args.repeat)]
        for n, run in enumerate(runs, 1):
            print(f"validation alone, run {n}: {run['requests']:,} requests in "
                  f"{run['seconds']:.1f} s = {run['requests'] / run['seconds']:,.0f} lines/s; "
                  f"RSS after set-up {_mib(run['baseline_kib'])}, peak {_mib(run['peak_kib'])}",
                  flush=True)
        seconds = statistics.median(r["seconds"] for r in runs)
        peak = max(r["peak_kib"] for r in runs)
        traced = None
        if not args.no_tracemalloc:
            traced = validate_in_child(env, path, folder / "files", True)["traced_peak_bytes"]
            print(f"validation alone under tracemalloc: peak of Python allocations "
                  f"{traced / 2**20:.1f} MiB", flush=True)

        web = None
        if not args.skip_web:
            token = make_token()
            proc, url, worker = start_web(env, folder / "web.log")
            try:
                web = upload_through_web(url, token, path, worker)
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            requests = web["body"].get("requests") if isinstance(web["body"], dict) else None
            print(f"upload through gunicorn (POST /api/v1/batch/files/, multipart): HTTP "
                  f"{web['status']}, {requests if requests is not None else web['body']} "
                  f"requests, {web['seconds']:.1f} s = {size / 2**20 / web['seconds']:.1f} "
                  f"MiB/s; worker peak RSS {_mib(web['before_kib'])} before, "
                  f"{_mib(web['peak_kib'])} after", flush=True)

    print("\nsummary")
    print(f"  validation alone (inputs.read_input): median {seconds:.1f} s "
          f"({args.lines / seconds:,.0f} lines/s), peak RSS {_mib(peak)} "
          f"(target ≤ {TARGET_MIB} MiB)"
          + ("" if traced is None else f"; Python allocations peak {traced / 2**20:.1f} MiB"))
    if web is not None:
        print(f"  upload through the web server: {web['seconds']:.1f} s, worker peak RSS "
              f"{_mib(web['peak_kib'])} (target ≤ {TARGET_MIB} MiB)")
    print(f"  load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
