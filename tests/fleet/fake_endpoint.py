"""A tiny real HTTP server that answers like an OpenAI-compatible endpoint, and can be told
to fail. Health probing is the thing under test, not this server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeEndpoint:
    def __init__(self) -> None:
        self.status = 200
        self.has_health = True
        # What GET /version answers: None → 404 (no such endpoint), bytes → sent as they are.
        self.version: str | bytes | None = None
        self.requests: list[str] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint.requests.append(self.path)
                if self.path == "/health" and not endpoint.has_health:
                    return self._send(404, {"detail": "not found"})
                if self.path == "/version" and endpoint.version is not None:
                    if isinstance(endpoint.version, bytes):
                        return self._raw(200, endpoint.version)
                    return self._send(200, {"version": endpoint.version})
                if self.path in ("/v1/models", "/health"):
                    body = {"object": "list", "data": [{"id": "llama-3.1-8b-instruct"}]}
                    return self._send(endpoint.status, body)
                return self._send(404, {})

            def _send(self, status: int, body: dict[str, object]) -> None:
                self._raw(status, json.dumps(body).encode())

            def _raw(self, status: int, raw: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
