"""A real HTTP server on localhost answering JSON (or not) per path, for the http-json metric
source kind: each path answers what the test set for it; `hang` holds a path's answer until
the test ends (a source that never answers), released on a condition, never on a clock."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    hang: bool = False


@dataclass
class JsonEndpoint:
    url: str
    answers: dict[str, Answer] = field(default_factory=dict)
    asked: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def json(self, path: str, body: Any, status: int = 200) -> None:
        self.answers[path] = Answer(status, json.dumps(body).encode())

    def text(self, path: str, body: str, content_type: str = "text/html") -> None:
        self.answers[path] = Answer(200, body.encode(), content_type)

    def hang(self, path: str) -> None:
        self.answers[path] = Answer(200, b"{}", hang=True)


def serve() -> Iterator[JsonEndpoint]:
    state: dict[str, JsonEndpoint] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            endpoint = state["endpoint"]
            with endpoint.lock:
                endpoint.asked.append((self.path, dict(self.headers.items())))
            answer = endpoint.answers.get(self.path.split("?")[0],
                                          Answer(404, b'{"error": "no such path"}'))
            if answer.hang:
                endpoint.released.wait()
                return
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state["endpoint"] = JsonEndpoint(url=f"http://127.0.0.1:{server.server_port}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield state["endpoint"]
    finally:
        state["endpoint"].released.set()
        server.shutdown()
        server.server_close()
