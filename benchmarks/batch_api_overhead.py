"""What does the OpenAI Batch API add over fleetctl's own REST? The same job (--requests chat
lines, concurrency 8) submitted both ways against one Django server in this process, run by
one batch worker process on one simulated pool, alternating per repetition:

- **rest**: `POST /api/v1/batch/jobs/` (multipart `file` + `pool`: upload and create in one
  request), `GET /api/v1/batch/jobs/{id}/` every 0.1 s until completed, `GET …/output/`.
- **openai**: the official client, `files.create` + `batches.create` (two requests; the
  batch is placed through a batch-class route whose split gives the pool 100 %),
  `batches.retrieve` every 0.1 s until completed, `files.content(output_file_id)`.

Per way: the submit (ms, the requests until the job exists), one poll request (ms, the
median over the job's polls), the time from the submit's start to the first poll that sees
the job completed (s; the worker's time dominates it, and both ways poll at the same
interval), and the output download (ms). Prints medians; asserts nothing.

PostgreSQL (--database-url, default a local `bench_batch_api`, recreated empty), Redis
(REDIS_URL, default db 9). The simulator (profile `quick`, a few ms per answer) and the
worker are children of this script, stopped at the end. Usage:

    .venv/bin/python benchmarks/batch_api_overhead.py [--repeat 5] [--requests 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_batch_api"
MODEL = "llama-3.1-8b-instruct"
POLL_S = 0.1

from batch_worker_overhead import (  # noqa: E402
    make_pool,
    setup_django,
    start_sim,
    start_worker,
    stop,
)


def lines(n: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "max_tokens": 16, "temperature": 0,
                 "messages": [{"role": "user", "content": f"question {i}"}]}}).encode() + b"\n"
        for i in range(n))


def serve() -> str:
    """The Django app on a free port, in a thread (threaded WSGI, as runserver)."""
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet)
    server.set_app(get_wsgi_application())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def until_done(poll: Callable[[], str]) -> list[float]:
    """Poll every POLL_S until completed; the poll requests' durations."""
    took = []
    deadline = time.monotonic() + 300
    while True:
        state, seconds = timed(poll)
        took.append(seconds)
        if state == "completed":
            return took
        if state in ("failed", "expired", "cancelled") or time.monotonic() > deadline:
            raise SystemExit(f"the job ended {state}")
        time.sleep(POLL_S)


def via_rest(http: Any, content: bytes, pool: str) -> dict[str, float]:
    start = time.perf_counter()
    created, submit = timed(lambda: http.post("/api/v1/batch/jobs/", data={
        "pool": pool, "compare_sample": "0"}, files={"file": ("in.jsonl", content)}))
    assert created.status_code == 201, created.text
    job = created.json()["id"]
    polls = until_done(lambda: http.get(f"/api/v1/batch/jobs/{job}/").json()["state"])
    done = time.perf_counter() - start
    output, download = timed(lambda: http.get(f"/api/v1/batch/jobs/{job}/output/"))
    assert output.status_code == 200 and output.text.count("\n") == content.count(b"\n")
    return {"submit": submit, "poll": statistics.median(polls), "done": done,
            "download": download}


def via_openai(client: Any, content: bytes) -> dict[str, float]:
    start = time.perf_counter()

    def submit_both() -> Any:
        uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
        return client.batches.create(input_file_id=uploaded.id,
                                     endpoint="/v1/chat/completions", completion_window="24h")

    batch, submit = timed(submit_both)
    polls = until_done(lambda: client.batches.retrieve(batch.id).status)
    done = time.perf_counter() - start
    output_id = client.batches.retrieve(batch.id).output_file_id
    output, download = timed(lambda: client.files.content(output_id).text)
    assert output.count("\n") == content.count(b"\n")
    return {"submit": submit, "poll": statistics.median(polls), "done": done,
            "download": download}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--database-url", default=DEFAULT_PG)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-batch-api-"))
    env = setup_django(args.database_url, work / "files", BATCH_LEASE_S="10")
    import logging

    from django.conf import settings

    settings.ALLOWED_HOSTS = ["*"]
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    import httpx
    import openai
    from django.contrib.auth.models import Group, User

    from fleetctl.accounts.actor import Actor
    from fleetctl.accounts.services import token_create_personal
    from fleetctl.traffic.services.writes import route_create
    from tests.support.profiles import TEST_PROFILES

    sim = start_sim(work, TEST_PROFILES, {"batch": "quick"})
    worker = None
    try:
        pool = make_pool("bench-batch", sim.url("batch"))
        route_create(actor=Actor.for_system("bench"), name="llama-batch", model_id=MODEL,
                     primary_pool=pool, latency_class="batch", reason="bench")
        user = User.objects.create_user("bench-oncall")
        user.groups.set([Group.objects.get_or_create(name="on-call")[0]])
        secret = token_create_personal(actor=Actor(user=user), name="bench",
                                       scopes=["read", "jobs"]).secret
        worker = start_worker(env, work / "worker.log", "bench-1")
        base = serve()
        http = httpx.Client(base_url=base, timeout=60,
                            headers={"Authorization": f"Bearer {secret}"})
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key=secret, max_retries=0)
        content = lines(args.requests)
        via_rest(http, content, pool.name)  # warm-up: imports, connections, the worker
        via_openai(client, content)
        runs: dict[str, list[dict[str, float]]] = {"rest": [], "openai": []}
        for _ in range(args.repeat):
            runs["rest"].append(via_rest(http, content, pool.name))
            runs["openai"].append(via_openai(client, content))
        print(f"{args.requests} chat requests per job, concurrency 8, {args.repeat} jobs each "
              f"way, medians:")
        print(f"{'':8} {'submit ms':>10} {'poll ms':>9} {'to completed s':>15} "
              f"{'download ms':>12}")
        med: dict[str, dict[str, float]] = {}
        for way, rows in runs.items():
            med[way] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            m = med[way]
            print(f"{way:8} {m['submit'] * 1000:10.1f} {m['poll'] * 1000:9.2f} "
                  f"{m['done']:15.3f} {m['download'] * 1000:12.1f}")
        d = {k: med["openai"][k] - med["rest"][k] for k in med["rest"]}
        print(f"{'openai-rest':8} {d['submit'] * 1000:+10.1f} {d['poll'] * 1000:+9.2f} "
              f"{d['done']:+15.3f} {d['download'] * 1000:+12.1f}")
    finally:
        if worker is not None:
            stop(worker)
        stop(sim)


if __name__ == "__main__":
    main()
