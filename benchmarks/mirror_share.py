"""How exactly gateways mirror the share asked for, and what changing it costs: Envoy and
nginx in front of one simulated pool, copying to the real shadow collector.

For each kind and each share (default 1 %, 10 %, 50 %): push the route at that mirror share
through the kind's adapter (as a gateway push does: apply, read back, the mirror fraction
verified), time the apply and note its method (Envoy: one admin runtime update; nginx: a
reload), send `--requests` chat requests through the gateway, and count the copies the
collector received for the route (it has no shadow run, so it counts them as unmatched, by
the route named in each copy's x-fleetctl-shadow-route header). Reported: copies / requests
with its 95 % Wilson interval, which should hold the share asked for.

    .venv/bin/python benchmarks/mirror_share.py [--requests 1000] [--shares 100,1000,5000]

Redis: REDIS_URL (default redis://127.0.0.1:6379/9), where the collector counts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
from fleetctl.demo.devstack import local_destinations  # noqa: E402

local_destinations(os.environ)

from shadow_mirror_overhead import MODEL, sim_and_collector  # noqa: E402

ROUTE = "mirror-bench"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000, help="per kind and share")
    parser.add_argument("--shares", default="100,1000,5000", help="basis points, comma-separated")
    args = parser.parse_args()
    shares = [int(s) for s in args.shares.split(",")]

    import logging

    import django
    import httpx

    django.setup()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.demo.nginx_process import NginxProcess
    from fleetctl.inference.confidence import wilson_interval
    from fleetctl.shadow import live
    from fleetctl.traffic.gateways.base import DesiredState, PoolTarget, RouteSpec, adapter_for

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        pool_url, collector_url = stack.enter_context(sim_and_collector(work))
        envoy = EnvoyProcess(work / "envoy", free_port(), free_port())
        nginx = NginxProcess(work / "nginx")
        rows = []
        try:
            envoy.start(60)
            nginx.start(60)
            pools = {"bench": PoolTarget("bench", (pool_url,), "US")}
            gateways = {"envoy": (adapter_for(envoy.gateway("bench", load_timeout_s=30)),
                                  envoy.listen_url),
                        "nginx": (adapter_for(nginx.gateway), nginx.url)}
            body = {"model": MODEL, "max_tokens": 1,
                    "messages": [{"role": "user", "content": "hello"}]}
            for kind, (adapter, url) in gateways.items():
                for bp in [0, *shares]:
                    desired = DesiredState(
                        routes=(RouteSpec(key=ROUTE, model=MODEL, latency_class="", residency="",
                                          revision=1, weights={"bench": 10_000},
                                          mirror_bp=bp),),
                        pools=pools, mirror_url=collector_url)
                    started = time.perf_counter()
                    result = adapter.apply(desired)
                    apply_ms = (time.perf_counter() - started) * 1000
                    adapter.read_back()
                    ok, why = adapter.mirror_matches(desired)
                    if not ok:
                        raise SystemExit(f"{kind} did not take mirror {bp} bp: {why}")
                    if not bp:
                        continue  # the starting state
                    time.sleep(0.5)
                    before = live.unmatched().get(ROUTE, 0)
                    with httpx.Client(timeout=30) as client:
                        for _ in range(args.requests):
                            answer = client.post(f"{url}/v1/chat/completions", json=body)
                            answer.raise_for_status()
                    time.sleep(1.0)  # the last copies reach the collector
                    copies = live.unmatched().get(ROUTE, 0) - before
                    interval = wilson_interval(copies, args.requests, confidence=0.95)
                    rows.append((kind, bp, copies, interval, apply_ms, result.method))
                    print(f"{kind:6} mirror {bp / 100:6.2f} %: {copies:5} of {args.requests} "
                          f"copied = {100 * copies / args.requests:6.2f} % (95 % Wilson "
                          f"{100 * interval.lower:.2f}–{100 * interval.upper:.2f} %), "
                          f"apply {apply_ms:.1f} ms ({result.method})", flush=True)
        finally:
            envoy.stop()
            nginx.stop()

    inside = sum(r[3].lower <= r[1] / 10_000 <= r[3].upper for r in rows)
    print(f"\nshare asked for inside the 95 % interval: {inside} of {len(rows)}")
    for kind in ("envoy", "nginx"):
        times = [r[4] for r in rows if r[0] == kind]
        methods = sorted({r[5] for r in rows if r[0] == kind})
        print(f"{kind}: share change median {statistics.median(times):.1f} ms "
              f"({', '.join(methods)})")


if __name__ == "__main__":
    main()
