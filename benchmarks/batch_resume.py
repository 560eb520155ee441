"""How long from a batch worker's kill -9 to the work going on in another worker?

Two `python -m fleetctl.batch.worker` processes run side by side against one simulated pool.
Each round submits a job with the kill-worker drill (--requests lines, concurrency 8, chunks
of 20, the drill at 45 % done: mid-chunk, not at a chunk's start where one request is out):
the worker holding the job's chunk commits `drill_fired_at` and SIGKILLs itself with
requests in flight; the other worker takes the chunk over once its lease has lapsed, sends
the in-flight requests again and writes the next result. Measured
per round from the rows: `drill_fired_at` → the first result written by another worker
(`BatchResult.finished_at`, equal to the job's `drill_resumed_at`). The killed worker is
replaced before the next round, so two workers are always running. Also checked per round:
the drill's verdict (every custom_id exactly one result), resends, duplicates refused.

The lease decides most of the figure: a holder renews every lease/3, so a lease lapses
between 2/3 and all of BATCH_LEASE_S after the kill; the survivor polls every 0.1 s.
--lease-s sets BATCH_LEASE_S for the workers (default: the settings' value, 30 s).

PostgreSQL (--database-url, default a local `bench_h6_resume`, recreated empty), Redis
(REDIS_URL, default db 9). The simulator and the workers are children of this script (one
process group), stopped at the end. Prints each round, the median and the max; asserts
nothing. Usage:

    .venv/bin/python benchmarks/batch_resume.py [--rounds 5] [--lease-s 30] [--requests 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from batch_worker_overhead import (  # noqa: E402
    MODEL,
    PROFILE,
    job_done,
    make_pool,
    setup_django,
    start_sim,
    start_worker,
    stop,
    submit,
    wait_for,
)

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_h6_resume"


def lines(n: int) -> list[bytes]:
    import json

    return [json.dumps({"custom_id": f"req-{i}", "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": {"model": MODEL, "max_tokens": 32, "temperature": 0,
                                 "ignore_eos": True,
                                 "messages": [{"role": "user", "content": f"question {i}"}]}}
                       ).encode() + b"\n" for i in range(n)]


def one_round(pool: Any, data: list[bytes]) -> dict[str, Any]:
    from fleetctl.batch.drill import drill_verify
    from fleetctl.batch.models import BatchJob, BatchResult

    job = submit(pool, data, concurrency=8, chunk_size=20, drill="kill-worker", drill_at=0.45,
                 request_timeout_s=60)
    wait_for(lambda: job_done(job.pk), 600, f"job {job.pk} to complete", every_s=0.2)
    job = BatchJob.objects.get(pk=job.pk)
    if job.drill_fired_at is None:
        raise SystemExit(f"job {job.pk}: the drill never fired")
    first_other = (BatchResult.objects.filter(job=job, finished_at__gte=job.drill_fired_at)
                   .exclude(worker=job.drill_worker).order_by("finished_at")
                   .values_list("finished_at", "worker").first())
    verdict = drill_verify(job)
    return {
        "job": job.pk, "killed": job.drill_worker,
        "resumed_by": first_other[1] if first_other else None,
        "seconds": (first_other[0] - job.drill_fired_at).total_seconds() if first_other
        else None,
        "drill_resumed_s": (job.drill_resumed_at - job.drill_fired_at).total_seconds()
        if job.drill_resumed_at else None,
        "resends": job.resends.count(), "duplicates": job.duplicates_refused,
        "verdict": verdict,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--lease-s", type=float, default=None,
                        help="BATCH_LEASE_S for the workers (default: the settings' value)")
    parser.add_argument("--database-url", default=DEFAULT_PG)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="batch-resume-bench-"))
    extra = {"BATCH_LEASE_S": str(args.lease_s)} if args.lease_s is not None else {}
    env = setup_django(args.database_url, work / "files", **extra)
    from django.conf import settings

    lease = settings.BATCH_LEASE_S
    print(f"batch_resume: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"BATCH_LEASE_S={lease:g} (renewed every {lease / 3:g} s), {args.requests} "
          f"requests per job, concurrency 8, chunks of 20, drill at 45 %", flush=True)
    sim = start_sim(work, PROFILE, {"bench": "batchbench"})
    pool = make_pool("bench", sim.url("bench"))
    data = lines(args.requests)
    workers: list[Any] = []
    spawned = 0
    seconds: list[float] = []
    try:
        for round_no in range(1, args.rounds + 1):
            workers = [w for w in workers if w.poll() is None]
            while len(workers) < 2:
                spawned += 1
                workers.append(start_worker(env, work / f"worker-{spawned}.log",
                                            f"bench-{spawned}"))
            time.sleep(1.0)  # both have imported Django and are polling
            got = one_round(pool, data)
            verdict = got["verdict"]
            ok = getattr(verdict, "passed", None)
            print(f"round {round_no}: job {got['job']}: {got['killed']} killed, resumed by "
                  f"{got['resumed_by']} after {got['seconds']:.1f} s (drill_resumed_at: "
                  f"{got['drill_resumed_s']:.1f} s); {got['resends']} resends, "
                  f"{got['duplicates']} duplicates refused; verdict "
                  f"{'pass' if ok else ('FAIL' if ok is False else verdict)}", flush=True)
            if got["seconds"] is not None:
                seconds.append(got["seconds"])
    finally:
        for w in workers:
            stop(w)
        stop(sim)
    if seconds:
        print(f"\nkill -9 → first result by another worker, {len(seconds)} rounds: median "
              f"{statistics.median(seconds):.1f} s, max {max(seconds):.1f} s, min "
              f"{min(seconds):.1f} s (BATCH_LEASE_S={lease:g})")
    print(f"load average now {os.getloadavg()[0]:.2f}; logs: {work}")


if __name__ == "__main__":
    main()
