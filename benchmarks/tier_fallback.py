"""What a context tier's per-request fallback costs the request that falls over, through a
real Envoy (docs/envoy.md, "Fallback and queues of context tiers").

One Envoy (`--concurrency 1`, access log on), one simulated pool `live` on loopback and a pool
`dead` in the same jurisdiction whose port is closed (a connect is refused at once, as for a
pool whose servers died). A `failover` tier splits 50/50 between them: a request the split
gives `live` is answered directly (1 attempt); one it gives `dead` is refused, retried on
`live` through the aggregate cluster and answered (2 attempts). Requests go one at a time over
one keep-alive connection; the access log (line i is request i: one at a time) says which
were which. Each round prints the p50 and p99 of both kinds; the script prints the medians
over the rounds and the difference.

    .venv/bin/python benchmarks/tier_fallback.py [--requests 400] [--rounds 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")

from benchmarks.access_log_cost import CHAT, MODEL, start_simulator  # noqa: E402


def one(conn: http.client.HTTPConnection) -> float:
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=CHAT,
                 headers={"content-type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    elapsed = time.perf_counter() - started
    if answer.status != 200:
        raise SystemExit(f"status {answer.status}")
    return elapsed * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import django

    django.setup()
    from fleetctl.bench.stats import percentile
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.traffic.gateways.base import DesiredState, PoolTarget, RouteSpec, TierSpec
    from fleetctl.traffic.gateways.envoy.accesslog import parse_line
    from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter

    folder = Path(tempfile.mkdtemp(prefix="bench-tier-fallback-"))
    sim, sim_url = start_simulator(folder)
    envoy = EnvoyProcess(folder / "envoy", free_port(), free_port())
    try:
        tier = TierSpec(bound=None, above=0, behaviour="failover", pools=("dead", "tiny"))
        desired = DesiredState(
            routes=(RouteSpec(key="chat", model=MODEL, latency_class="", residency="",
                              revision=1, weights={"dead": 5000, "tiny": 5000},
                              tiers=(tier,)),),
            pools={"tiny": PoolTarget("tiny", (sim_url,), "EU"),
                   "dead": PoolTarget("dead", (f"http://127.0.0.1:{free_port()}",), "EU")})
        envoy.start(timeout_s=60)
        EnvoyAdapter(envoy.gateway("bench", load_timeout_s=30)).apply(desired)
        log = envoy.access_log_path
        assert log is not None
        conn = http.client.HTTPConnection("127.0.0.1", envoy.listen_port, timeout=30)
        for _ in range(100):  # warm up
            one(conn)
        rounds: dict[str, list[tuple[float, float]]] = {"direct": [], "fell over": []}
        for number in range(args.rounds):
            time.sleep(0.5)  # the last flush of the log, so the offset is this round's
            offset = log.stat().st_size
            times = [one(conn) for _ in range(args.requests)]
            lines: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(lines) < len(times) and time.monotonic() < deadline:
                time.sleep(0.3)
                with log.open("rb") as f:
                    f.seek(offset)
                    lines = [line for line in f.read().splitlines() if line.strip()]
            records = [parse_line(line, {}) for line in lines[:len(times)]]
            kinds: dict[str, list[float]] = {"direct": [], "fell over": []}
            for record, ms in zip(records, times, strict=True):
                assert record is not None and record.pool == "tiny", record
                kinds["fell over" if record.fallback_from == "dead" else "direct"].append(ms)
            for kind, values in kinds.items():
                p50, p99 = percentile(values, 50), percentile(values, 99)
                assert p50 is not None and p99 is not None
                rounds[kind].append((p50, p99))
            print(f"round {number + 1}: " + "; ".join(
                f"{kind} n={len(values)} p50 {rounds[kind][-1][0]:.2f} ms "
                f"p99 {rounds[kind][-1][1]:.2f} ms" for kind, values in kinds.items()))
        print(f"Envoy 1.40, --concurrency 1; {args.requests} requests a round, one at a time, "
              f"{args.rounds} rounds; medians over rounds")
        medians = {kind: (statistics.median(p for p, _ in values),
                          statistics.median(p for _, p in values))
                   for kind, values in rounds.items()}
        for kind, (p50, p99) in medians.items():
            print(f"{kind:10} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms")
        print(f"a fallback adds p50 {medians['fell over'][0] - medians['direct'][0]:+.2f} ms "
              f"(ratio {medians['fell over'][0] / medians['direct'][0]:.2f})")
    finally:
        envoy.stop()
        sim.terminate()
        sim.wait(timeout=30)
        print(json.dumps({"folder": str(folder)}))


if __name__ == "__main__":
    main()
