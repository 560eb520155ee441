"""The batch worker process: `python -m fleetctl.batch.worker [--name N] [--store
module:Class] [--idle-exit S] [--poll S]`.

A plain process, not a Celery task: the kill-worker drill kills it with SIGKILL, and its
state lives in rows (fleetctl/batch/store.py), so any number of workers on any machines can
run side by side and take each other's chunks over. It loops: claim a chunk (the oldest job
that can take one) → run it (fleetctl/batch/executor.py) → claim again; with nothing to
claim it waits `--poll` seconds. SIGTERM or Ctrl-C: stop dispatching, let the requests on the
wire finish and be recorded, release the chunk and exit 0.

Its owner name in the rows is `<name>:<pid>`: a worker restarted under the same name (the demo
supervisor, a compose replica) is another owner, so a drill can tell who resumed.

`--store module:Class` swaps the checkpoint store (a subclass of CheckpointStore with no
arguments): the tests use it to run a worker on a store with a bug in it and check that the
drill notices.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.batch.store import CheckpointStore

log = logging.getLogger("fleetctl.batch")

ERROR_PAUSE_S = 2.0  # after an unexpected error (database gone...), before claiming again


def load_store(spec: str | None) -> CheckpointStore:
    """The store named `module:Class` (default: the database CheckpointStore)."""
    from fleetctl.batch.store import CheckpointStore

    if not spec:
        return CheckpointStore()
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise SystemExit(f"--store {spec!r}: expected module:Class, e.g. "
                         "tests.batch.doubles:SkipsInFlightStore")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"--store {spec!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, CheckpointStore)):
        raise SystemExit(f"--store {spec!r} is not a CheckpointStore subclass")
    return cls()


def run(store: CheckpointStore, owner: str, stop: threading.Event, *, poll_s: float = 1.0,
        idle_exit_s: float | None = None) -> int:
    """Claim and run chunks until `stop` (or idle for idle_exit_s). Returns chunks run."""
    from django.db import close_old_connections

    from fleetctl.batch.executor import run_chunk
    from fleetctl.batch.models import BatchJob

    ran = 0
    idle_since = time.monotonic()
    while not stop.is_set():
        close_old_connections()
        try:
            claim = store.claim(owner)
        except Exception:
            log.exception("claiming a chunk failed")
            stop.wait(ERROR_PAUSE_S)
            continue
        if claim is None:
            if idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                log.info("idle for %.0f s: exiting (--idle-exit)", idle_exit_s)
                break
            stop.wait(poll_s)
            continue
        job = BatchJob.objects.select_related("pool", "input_file").get(pk=claim.job_id)
        log.info("job %s chunk %s (requests %s-%s): %d to send%s", job.pk, claim.number,
                 claim.first_index, claim.last_index, len(claim.pending),
                 f", {len(claim.resent)} resent after {claim.previous_owner}"
                 if claim.resent else "")
        try:
            result = run_chunk(store, claim, job, stop=stop)
        except Exception:
            # The lease lapses by itself; another worker (or this one) takes the chunk over.
            log.exception("job %s chunk %s failed in the worker", job.pk, claim.number)
            stop.wait(ERROR_PAUSE_S)
            continue
        ran += 1
        idle_since = time.monotonic()
        log.info("job %s chunk %s: %s", job.pk, claim.number, result)
    return ran


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fleetctl.batch.worker",
        description="Run batch jobs: claim chunks, send their requests, checkpoint every "
                    "result.")
    parser.add_argument("--name", default=socket.gethostname(),
                        help="this worker's name in the rows (the pid is added)")
    parser.add_argument("--store", default=None,
                        help="checkpoint store class, module:Class (tests)")
    parser.add_argument("--idle-exit", type=float, default=None, metavar="S",
                        help="exit after S seconds with nothing to claim")
    parser.add_argument("--poll", type=float, default=1.0, metavar="S",
                        help="seconds between claims when there is nothing to do")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.poll <= 0:
        parser.error("--poll must be above 0")
    if args.idle_exit is not None and args.idle_exit < 0:
        parser.error("--idle-exit must be 0 or more")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    import django

    django.setup()
    store = load_store(args.store)
    owner = f"{args.name}:{os.getpid()}"
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info("batch worker %s (lease %.1f s, store %s)", owner, store.lease_s,
             type(store).__name__)
    try:
        run(store, owner, stop, poll_s=args.poll, idle_exit_s=args.idle_exit)
    finally:
        from fleetctl.batch.executor import wait_for_drills

        wait_for_drills()
    log.info("batch worker %s stopped", owner)
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is committed and logged by now. Tearing the interpreter down (Django and
    # every app's modules) takes seconds on a loaded machine, and a stopping worker has
    # nothing left to clean up: exit at once.
    logging.shutdown()
    os._exit(code)
