"""A real HTTP receiver on localhost for webhook deliveries: it answers with the statuses it
is told to, in order (then 200), and keeps every request it got."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    url: str
    answers: list[int] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, *statuses: int) -> None:
        with self.lock:
            self.answers.extend(statuses)

    def next_status(self) -> int:
        with self.lock:
            return self.answers.pop(0) if self.answers else 200


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            rec = state["receiver"]
            with rec.lock:
                rec.requests.append(Received(self.path, dict(self.headers.items()), body))
            status = rec.next_status()
            answer = json.dumps({"ok": status < 300}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["receiver"] = Receiver(url=f"http://127.0.0.1:{server.server_port}/hook")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["receiver"]
    finally:
        server.shutdown()
        server.server_close()
