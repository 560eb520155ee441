"""What the gateways' access-log tests share (tests/traffic/{envoy,haproxy,nginx},
tests/telemetry/test_live.py and tests/ramps): a chat request sent through a gateway and read
to its end, one abandoned by its client, and the records a gateway wrote after a given offset
of its log, waited for."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from fleetctl.traffic.gateways.base import LogRecord
from tests.sim.simproc import MODEL
from tests.support.waiting import wait_until

Parser = Callable[[bytes, Mapping[str, str]], LogRecord | None]


def chat(url: str, *, stream: bool, prompt: str = "ping", max_tokens: int = 4,
         latency_class: str = "") -> int:
    """One chat completion through `url`, its body read to the end (so the gateway logs the
    whole request); returns the status code."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": stream}
    headers = {"x-fleetctl-latency-class": latency_class} if latency_class else {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers,
                      timeout=30) as answer:
        for _ in answer.iter_bytes():
            pass
        return answer.status_code


def log_offset(path: Path) -> int:
    """Where the next line will start (nginx creates its log on the first request)."""
    return path.stat().st_size if path.exists() else 0


def read_records(path: Path, since: int, count: int, parse: Parser,
                 endpoints: Mapping[str, str] | None = None,
                 timeout_s: float = 30.0) -> list[LogRecord]:
    """The records of the whole lines written after byte `since`, once there are `count` (a
    gateway flushes its log a little after the answer; `count` 0: what there is now)."""
    found: list[LogRecord] = []

    def enough() -> bool:
        lines = []
        if path.exists():
            with path.open("rb") as log:
                log.seek(since)
                lines = [line for line in log.read().splitlines(keepends=True)
                         if line.endswith(b"\n")]
        found[:] = [r for r in (parse(line, endpoints or {}) for line in lines) if r is not None]
        return len(found) >= count

    wait_until(enough, timeout_s=timeout_s, what=f"{count} records in {path.name}",
               explain=lambda: f"{len(found)} found: {found}")
    return found


def abandon(url: str, *, stream: bool, max_tokens: int = 512, prompt: str = "ping",
            read_until: bytes = b"", timeout_s: float = 30.0) -> bytes:
    """A chat request the client abandons, as anyone on the gateway's port can (no
    credentials): sent whole on a socket of its own, which is closed as soon as `read_until`
    has come back (at once when it is empty). The answer would run to `max_tokens` (it
    ignores the end of text), so it is still going when the client leaves. Returns what was
    read before hanging up."""
    parts = urlsplit(url)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "stream": stream,
                       "ignore_eos": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    got = b""
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80),
                                  timeout=timeout_s) as sock:
        sock.sendall(head + body)
        while read_until and read_until not in got:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    return got
