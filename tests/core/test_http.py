"""The outbound HTTP module against a real HTTP server on loopback: answers are responses
(4xx and 5xx too), no answer is one of three errors, connections are kept alive."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetctl.core import http
from fleetctl.core.ports import free_port


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    connections: set[int] = set()

    def do_GET(self) -> None:
        Handler.connections.add(id(self.connection))
        if self.path.startswith("/slow"):
            time.sleep(1.0)
        status = 404 if self.path.startswith("/missing") else 200
        body = f'{{"path": "{self.path}"}}'.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Handler.connections = set()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("client", [http.Client, http.KeepAliveClient])
def test_an_answer_is_a_response_whatever_its_status(server: str, client: type) -> None:
    c = client()
    ok = c.get(f"{server}/models", params={"limit": "2"}, timeout_s=2)
    assert ok.status_code == 200 and ok.json() == {"path": "/models?limit=2"}
    assert ok.content_type == "application/json" and ok.latency_ms > 0
    assert c.get(f"{server}/missing", timeout_s=2).status_code == 404
    posted = c.post(f"{server}/x", form={"a": "1", "b": "two"}, timeout_s=2)
    assert posted.status_code == 201 and posted.text == "a=1&b=two"


@pytest.mark.parametrize("client", [http.Client, http.KeepAliveClient])
def test_no_answer_is_an_outbound_error_of_the_right_kind(server: str, client: type) -> None:
    c = client()
    with pytest.raises(http.OutboundUnreachable, match="could not connect"):
        c.get(f"http://127.0.0.1:{free_port()}/", timeout_s=2)
    with pytest.raises(http.OutboundTimeout, match=r"timed out after 0\.2 s"):
        c.get(f"{server}/slow", timeout_s=0.2)


def test_the_admin_client_keeps_one_connection_alive(server: str) -> None:
    client = http.KeepAliveClient()
    for _ in range(5):
        assert client.get(f"{server}/a", timeout_s=2).status_code == 200
    assert len(Handler.connections) == 1


def test_the_async_client_answers_and_fails_alike(server: str) -> None:
    async def calls() -> None:
        async with http.AsyncClient(base_url=server, timeout_s=2) as client:
            answer = await client.get("/models")
            assert answer.status_code == 200 and answer.json() == {"path": "/models"}
            with pytest.raises(http.OutboundTimeout):
                await client.get("/slow", timeout_s=0.2)
        async with http.AsyncClient(timeout_s=2) as client:
            with pytest.raises(http.OutboundUnreachable):
                await client.get(f"http://127.0.0.1:{free_port()}/")

    asyncio.run(calls())


def test_a_ca_bundle_that_cannot_be_read_is_a_certificate_error(tmp_path) -> None:
    with pytest.raises(http.OutboundCertificateError, match="cannot load CA bundle"):
        http.Client(verify=str(tmp_path / "missing.pem"))


def test_http_get_cuts_the_body(server: str) -> None:
    answer = http.http_get(f"{server}/{'x' * 50}", timeout_s=2, max_body=10)
    assert answer.body == b'{"path": "'
