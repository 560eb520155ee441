"""How many mirrored requests per second does the shadow collector take in on one core, and
how much memory does it hold while doing it?

Starts `python -m fleetctl.shadow.collector` pinned to core 0 (taskset), publishes a running
run for one route with a low rate cap (5 requests/s: nearly every request is answered,
parsed, checked and dropped as dropped_rate — the intake path a busy route's mirror takes),
and floods it from this process pinned to core 1: an asyncio load generator with several
keep-alive connections, each posting realistic ~2 KB chat bodies with the route header, as a
gateway's mirror does. The generator speaks HTTP/1.1 over asyncio streams directly: an
aiohttp or httpx client costs more CPU per request than the collector does, and would
measure itself.

Per round (default 5 rounds of 5 s) it prints requests/s answered 204 and the collector's CPU
use (near 100 %: the collector, not the generator, is the limit) and requests per CPU-second
of the collector (its capacity when a core is all its own); then the median, the
collector's peak RSS (VmHWM) and its RSS at the end, and checks in the collector's counters
that every request was counted (received = sampled + dropped). Prints figures; asserts
nothing. Redis: --redis-url (default a database of its own, 13, on the local Redis; its
shadow keys and `shadow` queue are emptied afterwards).

Every request carries the mirror token of a gateway of the route (fleetctl/traffic/
mirror_auth.py), as a gateway's copy does, so the collector's check of it is part of every
figure; before the rounds, the check alone is timed in this process (µs per call: what it
adds to each request). With --forged every request carries a wrong token instead: the
refusal path (403, counted refused_unauthenticated, body discarded unparsed) forged copies
takes. Usage:

    .venv/bin/python benchmarks/shadow_collector_intake.py [--rounds 5] [--seconds 5]
        [--connections 128] [--redis-url redis://127.0.0.1:6379/13] [--forged]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_RPS = 2000
RUN = 9_900_001
ROUTE = "bench-intake"
GATEWAY = 9_900
SECRET = "5e" * 32  # a gateway's mirror secret, for the benchmark only


def chat_body(i: int) -> bytes:
    """A chat request of about 2 KB, as an application sends one."""
    history = [
        {"role": "system", "content": "You are a concise assistant for a logistics company. "
                                      "Answer in plain English, cite the order number."},
        {"role": "user", "content": f"Order {10_000 + i}: the pallet left Rotterdam on "
                                    "Monday and has not reached the Duisburg hub. "
                                    + "The carrier's tracking page shows no scan since. " * 30},
        {"role": "assistant", "content": "I have asked the carrier for the last scan."},
        {"role": "user", "content": "Draft a short note to the customer explaining the delay."},
    ]
    return json.dumps({"model": "llama-3.1-8b-instruct", "temperature": 0, "max_tokens": 256,
                       "messages": history}).encode()


def request_bytes(port: int, body: bytes, auth: str) -> bytes:
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nx-fleetctl-shadow-route: {ROUTE}\r\n"
            f"x-fleetctl-mirror-auth: {auth}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def time_the_check() -> tuple[float, float]:
    """µs per mirror_auth.check of a genuine and of a forged header, in this process."""
    import timeit

    from fleetctl.traffic import mirror_auth

    accepted = mirror_auth.decode(mirror_auth.encode(
        {GATEWAY: [(mirror_auth.route_token(SECRET, ROUTE), None)]}))
    genuine = mirror_auth.header_value(GATEWAY, SECRET, ROUTE)
    forged = f"{GATEWAY}.{'0' * 64}"
    now = time.time()
    assert mirror_auth.check(accepted, genuine, now)
    assert not mirror_auth.check(accepted, forged, now)
    n = 200_000
    genuine_us, forged_us = (
        min(timeit.repeat(lambda h=header: mirror_auth.check(accepted, h, now),
                          number=n, repeat=5)) / n * 1e6
        for header in (genuine, forged))
    return genuine_us, forged_us


async def connection(port: int, requests: list[bytes], stop_at: float,
                     expected: bytes) -> int:
    """One keep-alive connection posting until stop_at; returns the answers with the
    `expected` status it got (204 for genuine copies, 403 for forged ones)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    try:
        i = 0
        while time.monotonic() < stop_at:
            writer.write(requests[i % len(requests)])
            i += 1
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            if status != b"204":
                done += status == expected
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                continue
            done += expected == b"204"
    finally:
        writer.close()
    return done


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_round(port: int, connections: int, seconds: float,
                    pid: int, auth: str, expected: bytes) -> tuple[float, float, float]:
    """(requests/s answered `expected`, the collector's and this generator's CPU use in
    that time: 1.0 = one core)."""
    requests = [request_bytes(port, chat_body(i), auth) for i in range(64)]
    cpu, own = cpu_seconds(pid), time.process_time()
    started = time.monotonic()
    answered = await asyncio.gather(*(connection(port, requests, started + seconds, expected)
                                      for _ in range(connections)))
    elapsed = time.monotonic() - started
    return (sum(answered) / elapsed, (cpu_seconds(pid) - cpu) / elapsed,
            (time.process_time() - own) / elapsed)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=128)
    parser.add_argument("--max-rps", type=float, default=5.0,
                        help="the run's rate cap (low: the excess is the intake path)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--forged", action="store_true",
                        help="every request carries a wrong mirror token: the refusal path")
    args = parser.parse_args()

    os.environ["DJANGO_SETTINGS_MODULE"] = "fleetctl.settings"
    os.environ["REDIS_URL"] = args.redis_url
    from fleetctl.shadow import live
    from fleetctl.traffic import mirror_auth

    genuine_us, forged_us = time_the_check()
    print(f"the mirror token check alone: {genuine_us:.2f} µs for a genuine header, "
          f"{forged_us:.2f} µs for a forged one (best of 5 × 200,000 calls)")
    r = live.client()
    r.delete(*r.scan_iter("fleetctl:shadow:*"), live.SHADOW_QUEUE)
    mirror_auth.write({ROUTE: mirror_auth.encode(
        {GATEWAY: [(mirror_auth.route_token(SECRET, ROUTE), None)]})})
    live.publish_run(RUN, ROUTE, max_rps=args.max_rps, max_tokens_per_day=10**12)
    auth, expected = ((f"{GATEWAY}.{'0' * 64}", b"403") if args.forged else
                      (mirror_auth.header_value(GATEWAY, SECRET, ROUTE), b"204"))

    cores = os.sched_getaffinity(0)
    pinned = shutil.which("taskset") is not None and {0, 1} <= cores
    port = free_port()
    argv = [sys.executable, "-m", "fleetctl.shadow.collector", "--port", str(port)]
    if pinned:
        argv = ["taskset", "-c", "0", *argv]
        os.sched_setaffinity(0, {1})
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    collector = subprocess.Popen(argv, cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        time.sleep(1.5)  # the collector reads the routes hash
        print(f"collector pid {collector.pid} on port {port}, "
              + ("pinned to core 0, load generator on core 1" if pinned
                 else "NOT pinned (no taskset or fewer than 2 cores)")
              + f"; {args.connections} connections, ~{len(chat_body(0))} B bodies, "
              f"run cap {args.max_rps:g} req/s")
        figures, per_cpu_s = [], []
        for n in range(1, args.rounds + 1):
            rps, busy, generator = asyncio.run(one_round(
                port, args.connections, args.seconds, collector.pid, auth, expected))
            figures.append(rps)
            per_cpu_s.append(rps / busy if busy else 0.0)
            print(f"  round {n}: {rps:8.0f} requests/s answered {expected.decode()}, CPU: "
                  f"collector "
                  f"{busy:.0%}, generator {generator:.0%} of a core; "
                  f"load average {os.getloadavg()[0]:.1f}")
        time.sleep(1.0)  # the last counters are flushed every 0.25 s
        counted = live.counters(RUN)
        dropped = sum(v for k, v in counted.items() if k.startswith("dropped_"))
        peak = rss_kib(collector.pid, "VmHWM")
        now = rss_kib(collector.pid, "VmRSS")
        median = statistics.median(figures)
        print(f"median {median:.0f} requests/s on one core (target ≥ {TARGET_RPS:,}): "
              f"{'met' if median >= TARGET_RPS else 'NOT met'}")
        median_cpu = statistics.median(per_cpu_s)
        print(f"per CPU-second of the collector: median {median_cpu:.0f} "
              "requests (what one fully busy core would take in; the figure above is lower "
              "when the generator or other load on the machine is the limit)")
        print(f"collector RSS: peak {peak / 1024:.1f} MiB, at the end {now / 1024:.1f} MiB")
        print(f"refused_unauthenticated {counted['refused_unauthenticated']:,}; the check is "
              f"{genuine_us / (1e6 / median_cpu):.1%} of a genuine request's CPU at "
              f"{median_cpu:.0f} requests per CPU-second" if median_cpu else "")
        print(f"counted: received {counted['received']:,}, sampled {counted['sampled']:,}, "
              f"dropped {dropped:,} ({', '.join(f'{k} {v:,}' for k, v in counted.items() if k.startswith('dropped_') and v)}); "  # noqa: E501
              f"every request counted: {counted['received'] == counted['sampled'] + dropped}")
    finally:
        collector.terminate()
        collector.wait(timeout=30)
        live.unpublish_run(ROUTE)
        r.delete(*r.scan_iter("fleetctl:shadow:*"), live.SHADOW_QUEUE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
