"""The streamed call every shadow pair and eval row makes (fleetctl/inference/upstream.py),
against small real HTTP servers: a stream's connection is reused for the next call, a
stream that trickles past the timeout is a timeout answer, and a forked child gets a loop of
its own.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetctl.inference import upstream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def sse(*events: dict[str, object]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + \
        b"data: [DONE]\n\n"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0
    trickle = False

    def get_request(self) -> tuple[socket.socket, object]:
        self.connections += 1
        return super().get_request()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if self.server.trickle:  # an event every 0.2 s, never ending
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"data: " + json.dumps(
                        {"choices": [{"index": 0, "delta": {"content": "x"}}]}).encode()
                        + b"\n\n")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                return
        body = sse({"choices": [{"index": 0, "delta": {"content": "hello"}}]},
                   {"choices": [{"index": 0, "delta": {"content": " there"}}]},
                   {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_a_streams_connection_is_reused_by_the_next_call(server):
    replies = [upstream.call(url(server), BODY, timeout_s=5) for _ in range(5)]
    assert [r.answer.text for r in replies] == ["hello there"] * 5
    assert all(r.answer.ttft_s is not None and r.first_byte for r in replies)
    assert replies[0].answer.usage is not None and replies[0].answer.usage.completion_tokens == 2
    assert server.connections == 1


def test_a_stream_that_trickles_past_the_timeout_is_a_timeout_answer(server):
    server.trickle = True
    started = time.monotonic()
    reply = upstream.call(url(server), BODY, timeout_s=1)
    assert time.monotonic() - started < 4
    assert (reply.answer.status, reply.answer.error_code, reply.first_byte) == (
        0, "timeout", True)


def test_a_forked_child_calls_on_a_loop_of_its_own(server):
    assert upstream.call(url(server), BODY, timeout_s=5).answer.text == "hello there"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's loop thread did not survive the fork
        try:
            text = upstream.call(url(server), BODY, timeout_s=5).answer.text
            os.write(write, text.encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 100) == b"hello there"
    os.close(read)
