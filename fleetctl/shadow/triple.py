"""One sampled request sent to the primary, the primary again (the secondary) and the
candidate at the same moment, each answer read into a compare.Answer with its timing.

Each call is fleetctl/inference/upstream.py's `call`: directly to each pool's endpoint, never
through a route (a route would add its own split, retries and failover, and a mirrored
request must not come back to the gateway that copied it). Never retried, never failed over:
an endpoint that does not answer within the timeout, refuses the connection or drops the
stream is an error answer (status 0), which is what the comparison is for. The body is sent
exactly as received, `model` and every parameter kept, nothing added: a request that did not
ask for usage is not made to carry it.

Concurrency: the three calls run on a shared thread pool (two) and the calling thread (one);
a shadow worker thread waits for its three and nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleetctl.inference.upstream import Reply, call

# One side's answer and what the pair row keeps about the call.
Side = Reply

SIDES = ("primary", "secondary", "candidate")
# Threads for the secondary and candidate calls of every pair in this process: a shadow
# worker runs 8 task threads (docs/queues.md), two calls each, with room for a test worker.
POOL_THREADS = 48


def pick_endpoints(primary_urls: Sequence[str], candidate_urls: Sequence[str],
                   index: int) -> dict[str, str]:
    """The three base URLs of pair `index`: the primary's i-th endpoint, the NEXT one of the
    primary for the secondary (the same again when the primary has only one: then the noise
    floor is one replica's own nondeterminism), the candidate's i-th."""
    n, m = len(primary_urls), len(candidate_urls)
    if not n or not m:
        raise ValueError("both pools need at least one endpoint")
    return {"primary": primary_urls[index % n],
            "secondary": primary_urls[(index + 1) % n] if n > 1 else primary_urls[index % n],
            "candidate": candidate_urls[index % m]}


_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=POOL_THREADS,
                                       thread_name_prefix="shadow-triple")
        return _pool


def send(request: Mapping[str, Any], endpoints: Mapping[str, str], *,
         timeout_s: float) -> dict[str, Side]:
    """The three calls at once: secondary and candidate on the shared pool, the primary on
    the calling thread. Returns role -> Side."""
    pool = _threads()
    futures = {role: pool.submit(call, endpoints[role], request, timeout_s=timeout_s,
                                 role=role)
               for role in ("secondary", "candidate")}
    sides = {"primary": call(endpoints["primary"], request, timeout_s=timeout_s,
                             role="primary")}
    for role, future in futures.items():
        sides[role] = future.result()
    return {role: sides[role] for role in SIDES}
