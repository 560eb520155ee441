"""What Envoy's JSON access log costs a request: latency through two real Envoys, alike but
for the access log.

Both Envoys run from this process (same rendered routes and clusters, `--concurrency 1`,
`--file-flush-interval-msec 250`); one writes the JSON access log the telemetry ingester
follows, the other none. Requests alternate between them one by one, so load on the shared
machine falls on both alike. Two targets:

- `direct`: GET /v1/models, answered by Envoy itself (a direct_response route): the gateway's
  own cost, where the log's share is largest;
- `pool`: a one-token chat completion to a simulated pool on loopback: a request as the
  gateway sees it, with a tiny answer.

Each round sends `--requests` requests per Envoy per target over one keep-alive connection
each and takes the p50 and p99 of the client-side latency; the script prints the medians over
the rounds and the ratios (with log / without).

    .venv/bin/python benchmarks/access_log_cost.py [--requests 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
from benchmarks._sim import start_simulator as start  # noqa: E402

MODEL = "llama-3.1-8b-instruct"
PROFILES = """
[profiles.tiny]
base = "h200"
decode_base_ms = 0.5
decode_per_seq_ms = 0.0
network_latency_ms = 0.0
replica_noise = 0.0
"""
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 1}).encode()


def start_simulator(folder: Path) -> tuple[subprocess.Popen[str], str]:
    (folder / "profiles.toml").write_text(PROFILES)
    return start(folder / "profiles.toml", "--pool", "tiny=tiny@0", "--model", MODEL)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one(conn: http.client.HTTPConnection, target: str) -> float:
    started = time.perf_counter()
    if target == "direct":
        conn.request("GET", "/v1/models")
    else:
        conn.request("POST", "/v1/chat/completions", body=CHAT,
                     headers={"content-type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    elapsed = time.perf_counter() - started
    if answer.status != 200:
        raise SystemExit(f"{target}: status {answer.status}")
    return elapsed * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000, help="per Envoy, per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--targets", default="direct,pool")
    args = parser.parse_args()

    import django

    django.setup()
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.traffic.gateways.base import DesiredState, PoolTarget, RouteSpec
    from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter

    folder = Path(tempfile.mkdtemp(prefix="bench-access-log-"))
    sim, sim_url = start_simulator(folder)
    envoys = {
        "with log": EnvoyProcess(folder / "logged", free_port(), free_port()),
        "without": EnvoyProcess(folder / "quiet", free_port(), free_port(), access_log=False),
    }
    try:
        desired = DesiredState(
            routes=(RouteSpec(key="chat", model=MODEL, latency_class="", residency="",
                              revision=1, weights={"tiny": 10_000}),),
            pools={"tiny": PoolTarget("tiny", (sim_url,), "US")})
        for envoy in envoys.values():
            envoy.start(timeout_s=60)
            EnvoyAdapter(envoy.gateway("bench", load_timeout_s=30)).apply(desired)
        conns = {name: http.client.HTTPConnection("127.0.0.1", envoy.listen_port, timeout=30)
                 for name, envoy in envoys.items()}
        targets = [t for t in args.targets.split(",") if t]
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for target in targets:
            for name in conns:  # warm up: connections, Envoy's and the pool's first requests
                for _ in range(200):
                    one(conns[name], target)
            for _ in range(args.rounds):
                samples: dict[str, list[float]] = {name: [] for name in conns}
                for _ in range(args.requests):
                    for name, conn in conns.items():
                        samples[name].append(one(conn, target))
                for name, values in samples.items():
                    results.setdefault((target, name), []).append(
                        (percentile(values, 0.50), percentile(values, 0.99)))
        logged = envoys["with log"].access_log_path
        assert logged is not None
        time.sleep(0.5)  # the last flush
        lines = sum(1 for _ in logged.open("rb"))
        print(f"Envoy 1.40, --concurrency 1; {args.requests} requests per Envoy per round, "
              f"{args.rounds} rounds, alternating; medians over rounds; {lines} lines logged")
        print(f"{'target':8} {'envoy':9} {'p50 ms':>8} {'p99 ms':>8}  p99 of each round")
        for target in targets:
            medians = {}
            for name in conns:
                rounds = results[(target, name)]
                medians[name] = (statistics.median(p50 for p50, _ in rounds),
                                 statistics.median(p99 for _, p99 in rounds))
                spread = " ".join(f"{p99:.2f}" for _, p99 in rounds)
                print(f"{target:8} {name:9} {medians[name][0]:8.3f} {medians[name][1]:8.3f}"
                      f"  {spread}")
            on, off = medians["with log"], medians["without"]
            print(f"{target:8} {'ratio':9} {on[0] / off[0]:8.3f} {on[1] / off[1]:8.3f}"
                  f"   ({(on[0] - off[0]) * 1000:+.0f} µs at p50)")
    finally:
        for envoy in envoys.values():
            envoy.stop()
        sim.terminate()
        sim.wait(timeout=10)


if __name__ == "__main__":
    main()
