"""A replica's writer under a reconnect storm: N Envoys open a stream on one replica, are
sent the three types and ACK them (the store calls the ADS server makes for each), until
every ACK row is committed, which is what a push after the storm waits on (wait_acked
applies the published reports only to Envoys whose new stream's record is in). No Envoy and
no gRPC: only the SharedStore and its writer thread, on PostgreSQL (DATABASE_URL: a migrated
scratch database) and Redis (REDIS_URL).

    DATABASE_URL=postgres://…/scratch REDIS_URL=redis://…/n \\
        .venv/bin/python benchmarks/xds_writer.py [--envoys 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envoys", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from fleetctl.xds.protos import SERVED_TYPES
    from fleetctl.xds.shared import SharedStore, envoy_states

    store = SharedStore(replica=f"writer-bench-{os.getpid()}")
    took = []
    try:
        for r in range(args.rounds):
            gateway = f"writer-bench-{os.getpid()}-{r}"  # a fresh gateway: no rows yet
            started = time.monotonic()
            for i in range(args.envoys):
                node = f"e{i}"
                store.stream_opened(gateway, node, f"http://127.0.0.1:{10000 + i}")
                for type_url in SERVED_TYPES:
                    store.sent(gateway, node, type_url, f"{i}-{type_url}", "v1", 1)
                for type_url in SERVED_TYPES:
                    store.answered(gateway, node, type_url, f"{i}-{type_url}", None)

            def recorded(gateway: str = gateway) -> int:
                return sum(1 for e in envoy_states(gateway) if e.connected
                           and len(e.types) == len(SERVED_TYPES)
                           and all(a.acked_number == 1 for a in e.types.values()))

            while recorded() < args.envoys:
                time.sleep(0.005)
            took.append((time.monotonic() - started) * 1000)
            print(f"round {r}: {args.envoys} Envoys' reports committed after "
                  f"{took[-1]:.0f} ms", flush=True)
        # What one batch costs in queries: 10 Envoys' reports, written directly.
        gateway = f"writer-bench-{os.getpid()}-count"
        batch: list[tuple[object, ...] | None] = []
        for i in range(10):
            batch.append(("open", gateway, f"e{i}", i + 1, timezone.now(), ""))
            batch += [("sent", gateway, f"e{i}", i + 1, t, "v1", 1) for t in SERVED_TYPES]
            batch += [("answer", gateway, f"e{i}", i + 1, t, "v1", 1, None)
                      for t in SERVED_TYPES]
        with CaptureQueriesContext(connection) as queries:
            store._write_batch(batch, {}, beat_due=False)
        print(f"median {statistics.median(took):.0f} ms over {args.rounds} rounds of "
              f"{args.envoys} Envoys; {len(queries.captured_queries) / 10:.1f} queries per "
              f"Envoy's 7 reports")
    finally:
        store.stop()


if __name__ == "__main__":
    main()
