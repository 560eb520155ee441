"""Hostile inputs shared by the tests of what fleetctl reads (core, evals, batch): JSON nested
any depth, written as text (json.dumps itself would recurse), and a real HTTP server that
records every request, so a test can prove that none was sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The depths the security review (issue 25) tried: 300 was accepted, 450 to 900 answered 500,
# 5,000 was refused by the decoder.
REVIEWED_DEPTHS = (300, 450, 900, 5000)


def nested_text(depth: int, leaf: str = "1") -> str:
    """JSON text of arrays and objects alternating `depth` levels deep around `leaf`:
    {"k": [{"k": [... 1 ...]}]}."""
    opens = "".join('{"k": ' if i % 2 == 0 else "[" for i in range(depth))
    closes = "".join("}" if i % 2 == 0 else "]" for i in reversed(range(depth)))
    return opens + leaf + closes


def with_nested(value: Any, depth: int) -> str:
    """`value` as JSON text, with every string "@NESTED@" in it replaced by nested_text(depth):
    a whole request line with one deep value inside it."""
    return json.dumps(value).replace('"@NESTED@"', nested_text(depth))


def nested_schema(depth: int) -> dict[str, Any]:
    """A JSON Schema `depth` levels deep as JSON (an object property inside another)."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range((depth - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@dataclass
class Recorder:
    """What the server saw: one path per request, any method."""

    url: str
    hits: list[str] = field(default_factory=list)


@contextmanager
def recording_server() -> Iterator[Recorder]:
    """A real HTTP server on a free port of 127.0.0.1 that answers every GET with a valid
    schema ({"type": "integer"}) and records the path; stopped on exit."""
    recorder = Recorder(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            recorder.hits.append(self.path)
            body = b'{"type": "integer"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorder.url = f"http://127.0.0.1:{httpd.server_port}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
