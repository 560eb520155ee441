"""What people's writes and the workers share: where traces are stored and reading one back
(shadow replays read them too), and how long a run may go quiet."""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings

from fleetctl.bench import traces
from fleetctl.bench.models import Trace
from fleetctl.core.errors import ConflictError

log = logging.getLogger("fleetctl.bench")
MAX_TRACE_REQUESTS_IN_MEMORY = 1_000_000
HEARTBEAT_STALE_S = 120
QUEUED_STALE_S = 900


# --- traces -----------------------------------------------------------------------------------

def _trace_dir() -> Path:
    folder = Path(settings.DATA_DIR) / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def trace_requests(trace: Trace) -> list[traces.TraceRequest]:
    path = _trace_dir() / trace.path
    if not path.exists():
        raise ConflictError(f"The file of trace {trace.name} is missing on this machine "
                            f"({trace.path}); upload it again.")
    with path.open("rb") as fp:
        return list(traces.parse_jsonl(fp, max_requests=MAX_TRACE_REQUESTS_IN_MEMORY))
