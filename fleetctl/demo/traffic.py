"""Background traffic for the demo: a small, steady, polite load of chat requests through the
demo's Envoy to the llama-8b route, so the dashboard, the gateway counters and a mirror shadow
run have live requests to show without anyone typing curl.

    python -m fleetctl.demo.traffic --gateway http://127.0.0.1:8080 --rps 4 --stream-every 1

What it sends: model llama-3.1-8b-instruct, temperature 0 (greedy, so a shadow run can compare
the answers token for token), one prompt after another from a fixed rotation of a few hundred
varied prompts (`PROMPTS`), one in ten in JSON mode; the others ask for logprobs (top 5), as an
evaluation harness would, so a shadow comparison can tell a near-tie flip from a real
divergence, and one in `--stream-every` of them is streamed (default five; `make demo` streams
them all: a guarded ramp judges time to first token from the gateway's access log, which only
a streamed answer tells apart from the whole answer's duration).
The same position in the rotation is always the same request, so two demos send the same load.
With `--abandon-every N` one streamed request in N is hung up on after its first chunk, as a
user pressing "stop" does: the gateway logs a client disconnect, which the dashboards count
apart and no guard holds against the pool (`make demo` abandons one in 40).

Polite: requests leave on a fixed schedule (`--rps`), never more than `--max-in-flight` at once
(a slot that is still busy is skipped and counted, not queued up), and after a run of failed
requests it backs off (1 s doubling to 30 s) before trying again. It never exits on an error:
the demo starts it before Envoy carries the route, and a gateway restart is a blip. One
summary line a minute on stdout (the demo writes it to var/demo-traffic.log).

`make demo` starts it as the supervised child "demo-traffic" (FLEETCTL_DEMO_TRAFFIC_RPS, 0
switches it off). It imports no product code but the outbound HTTP client.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from fleetctl.core.http import Client, OutboundError

MODEL = "llama-3.1-8b-instruct"
STREAM_EVERY = 5  # one request in five is streamed
JSON_EVERY = 10  # one in ten asks for a JSON object
SUMMARY_EVERY_S = 60.0
BACKOFF_AFTER = 3  # failures in a row before backing off
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0

_TOPICS = [
    "the water cycle", "compound interest", "how vaccines work", "the French Revolution",
    "photosynthesis", "TCP congestion control", "black holes", "sourdough bread",
    "the stock market", "plate tectonics", "machine learning", "the Roman Empire",
    "climate change", "how a bill becomes law", "the human heart", "electric cars",
    "jazz music", "coffee roasting", "the Moon landing", "public key cryptography",
    "honeybees", "the printing press", "volcanoes", "marathon training",
]
_ASKS = [
    "Explain {t} to a ten-year-old.",
    "Give me three surprising facts about {t}.",
    "Write a haiku about {t}.",
    "Summarise {t} in two sentences.",
    "What are common misconceptions about {t}?",
    "Write a short quiz question about {t}, with the answer.",
    "How would you teach {t} in a five-minute talk?",
    "List the key terms someone should know about {t}.",
    "Compare {t} with something from everyday life.",
    "What is the history of {t}, briefly?",
    "Write a tweet-length announcement about {t}.",
    "What questions do experts still debate about {t}?",
]
# 24 topics x 12 asks = 288 distinct prompts, interleaved so neighbours differ in topic and
# ask: prompt i asks ask i mod 12 about topic (13·(i div 12) + i) mod 24 — 13 is prime to 24,
# so each ask meets every topic once. (Topic i mod 24 would pair each ask with only two topics:
# 24 prompts, and a shadow gate that counts distinct requests would never reach 200.)
PROMPTS: list[str] = [
    _ASKS[i % len(_ASKS)].format(t=_TOPICS[(13 * (i // len(_ASKS)) + i) % len(_TOPICS)])
    for i in range(len(_TOPICS) * len(_ASKS))]
# Completion budgets, in rotation: long enough (≥ 48) for the simulator's divergences to show.
MAX_TOKENS = (64, 96, 128, 80, 160)


def request_body(i: int, stream_every: int = STREAM_EVERY) -> dict[str, Any]:
    """The i-th request of the rotation (deterministic); a JSON-mode one is never streamed."""
    prompt = PROMPTS[i % len(PROMPTS)]
    body: dict[str, Any] = {
        "model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS[i % len(MAX_TOKENS)],
        "messages": [{"role": "user", "content": prompt}],
    }
    if i % JSON_EVERY == 3:
        body["messages"] = [
            {"role": "system", "content": "Answer with one JSON object."},
            {"role": "user", "content": f"{prompt} Reply as JSON with keys title and text."},
        ]
        body["response_format"] = {"type": "json_object"}
    else:
        # Logprobs let a shadow comparison tell a near-tie flip (what a GPU batch does on the
        # primary itself) from a real divergence; without them every text flip counts.
        body["logprobs"] = True
        body["top_logprobs"] = 5
        if i % stream_every == 0:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
    return body


@dataclass
class Window:
    """What happened since the last summary line."""

    sent: int = 0
    ok: int = 0
    streamed: int = 0
    json_mode: int = 0
    skipped: int = 0  # slots dropped because max_in_flight requests were still running
    abandoned: int = 0  # streamed requests hung up on after their first chunk, on purpose
    failures: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)

    def line(self, seconds: float) -> str:
        lat = sorted(self.latencies_ms)
        p50 = f"{statistics.median(lat):.0f}" if lat else "-"
        p99 = f"{lat[min(len(lat) - 1, int(0.99 * len(lat)))]:.0f}" if lat else "-"
        failed = sum(self.failures.values())
        why = ", ".join(f"{k} {v}" for k, v in self.failures.most_common(3))
        return (f"demo-traffic: last {seconds:.0f} s: sent {self.sent}, ok {self.ok}, failed "
                f"{failed}{f' ({why})' if why else ''}, skipped {self.skipped}; streamed "
                f"{self.streamed}, json {self.json_mode}, abandoned {self.abandoned}; latency "
                f"p50 {p50} ms p99 {p99} ms")


class Generator:
    """The schedule, the in-flight limit, the backoff and the counters; `send` does one
    request (replaceable in tests)."""

    def __init__(self, gateway: str, rps: float, *, max_in_flight: int = 8,
                 timeout_s: float = 60.0, start: int = 0, stream_every: int = STREAM_EVERY,
                 abandon_every: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rps <= 0:
            raise ValueError("rps must be > 0")
        if stream_every < 1 or abandon_every < 0:
            raise ValueError("stream_every must be >= 1 and abandon_every >= 0")
        self.stream_every = stream_every
        self.abandon_every = abandon_every
        self._streamed_seen = itertools.count(1)
        self.timeout_s = timeout_s
        self.gateway = gateway.rstrip("/")
        self.interval_s = 1.0 / rps
        self.max_in_flight = max_in_flight
        self.client = Client(base_url=self.gateway, timeout_s=timeout_s,
                             max_connections=max_in_flight)
        self.index = start
        self.clock = clock
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._failures_in_a_row = 0
        self._backoff_s = 0.0
        self._backoff_until = 0.0
        self.window = Window()
        self.total = Window()

    def send(self, body: dict[str, Any]) -> str:
        """One request; "" when it was answered 200 in full, else why not (short)."""
        try:
            answer = self.client.post("/v1/chat/completions", json=body)
        except OutboundError as exc:
            return type(exc).__name__
        if answer.status_code != 200:
            return f"HTTP {answer.status_code}"
        if body.get("stream"):
            return "" if "data: [DONE]" in answer.text else "stream cut short"
        try:
            json.loads(answer.text)["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            return "bad body"
        return ""

    def abandon(self, body: dict[str, Any]) -> str:
        """A streamed request hung up on after its first chunk ("" when one arrived). Its
        own connection, closed unread: the gateway sees its client leave mid-answer."""
        try:
            with httpx.Client(timeout=self.timeout_s) as client, client.stream(
                    "POST", f"{self.gateway}/v1/chat/completions", json=body) as answer:
                if answer.status_code != 200:
                    return f"HTTP {answer.status_code}"
                next(answer.iter_raw(), b"")
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return ""

    def _one(self, body: dict[str, Any], abandon: bool = False) -> None:
        started = self.clock()
        try:
            problem = self.abandon(body) if abandon else self.send(body)
        except Exception as exc:  # a bug here must not end the demo's traffic
            problem = f"{type(exc).__name__}: {exc}"[:80]
        elapsed_ms = (self.clock() - started) * 1000
        with self._lock:
            self._in_flight -= 1
            for window in (self.window, self.total):
                if problem:
                    window.failures[problem] += 1
                elif abandon:
                    window.abandoned += 1
                else:
                    window.ok += 1
                    window.latencies_ms.append(elapsed_ms)
            if problem:
                self._failures_in_a_row += 1
                if self._failures_in_a_row >= BACKOFF_AFTER:
                    self._backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_FIRST_S,
                                                             self._backoff_s * 2))
                    self._backoff_until = self.clock() + self._backoff_s
            else:
                self._failures_in_a_row = 0
                self._backoff_s = 0.0

    def tick(self) -> bool:
        """The slot that is due now: send the next request in a thread, or skip it (busy or
        backing off). True when a request left."""
        with self._lock:
            if self.clock() < self._backoff_until:
                return False
            if self._in_flight >= self.max_in_flight:
                self.window.skipped += 1
                self.total.skipped += 1
                return False
            self._in_flight += 1
            body = request_body(self.index, self.stream_every)
            self.index += 1
            abandon = bool(body.get("stream")) and self.abandon_every > 0 and \
                next(self._streamed_seen) % self.abandon_every == 0
            for window in (self.window, self.total):
                window.sent += 1
                window.streamed += bool(body.get("stream"))
                window.json_mode += "response_format" in body
        threading.Thread(target=self._one, args=(body, abandon), daemon=True).start()
        return True

    def summary(self, seconds: float) -> str:
        with self._lock:
            line = self.window.line(seconds)
            if self._backoff_s and self.clock() < self._backoff_until:
                line += f"; backing off {self._backoff_s:g} s"
            self.window = Window()
        return line

    def run(self, *, duration_s: float | None = None, out: Callable[[str], object] = print,
            summary_every_s: float = SUMMARY_EVERY_S) -> Window:
        """Send on schedule until `stop` is set (or `duration_s` passed)."""
        began = next_at = last_summary = self.clock()
        out(f"demo-traffic: {1 / self.interval_s:g} requests/s to {self.gateway}/v1 "
            f"(model {MODEL}, {len(PROMPTS)} prompts, 1 in {self.stream_every} streamed, "
            f"1 in {JSON_EVERY} JSON)")
        while not self.stop.is_set():
            now = self.clock()
            if duration_s is not None and now - began >= duration_s:
                break
            if now >= next_at:
                self.tick()
                # A late loop (a suspended laptop) does not send a burst to catch up.
                next_at = max(next_at + self.interval_s, now)
            if now - last_summary >= summary_every_s:
                out(self.summary(now - last_summary))
                last_summary = now
            self.stop.wait(max(0.0, min(next_at, last_summary + summary_every_s)
                               - self.clock()))
        return self.total

    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def close(self, wait_s: float = 5.0) -> None:
        """Let the requests in flight finish (up to `wait_s`), then close the connections."""
        deadline = self.clock() + wait_s
        while self.in_flight() and self.clock() < deadline:
            time.sleep(0.05)
        self.client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetctl.demo.traffic",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8080",
                        help="the gateway's listener (default %(default)s)")
    parser.add_argument("--rps", type=float, default=2.0,
                        help="requests per second (default %(default)s; 0 sends nothing)")
    parser.add_argument("--stream-every", type=int, default=STREAM_EVERY, metavar="N",
                        help="stream one request in N (1: all but the JSON-mode ones; "
                             "default %(default)s)")
    parser.add_argument("--abandon-every", type=int, default=0, metavar="N",
                        help="hang up on one streamed request in N after its first chunk "
                             "(0: never; default %(default)s)")
    parser.add_argument("--max-in-flight", type=int, default=8)
    parser.add_argument("--duration", type=float, default=None,
                        help="stop after this many seconds (default: until SIGTERM)")
    args = parser.parse_args(argv)
    if args.rps < 0 or args.max_in_flight < 1 or args.stream_every < 1 or \
            args.abandon_every < 0:
        parser.error("--rps must be ≥ 0, --max-in-flight ≥ 1, --stream-every ≥ 1 and "
                     "--abandon-every ≥ 0")
    if args.rps == 0:
        print("demo-traffic: --rps 0, sending nothing", flush=True)
        return 0
    generator = Generator(args.gateway, args.rps, max_in_flight=args.max_in_flight,
                          stream_every=args.stream_every, abandon_every=args.abandon_every)

    def stop(signum: int, frame: object) -> None:
        generator.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        total = generator.run(duration_s=args.duration,
                              out=lambda line: print(line, flush=True))
    finally:
        generator.close()
    print(f"demo-traffic: stopped after {total.sent} requests ({total.ok} answered)",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
