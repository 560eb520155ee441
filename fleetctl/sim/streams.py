"""Pieces of generating an answer: the direct SSE writer of a stream, structured (JSON and
tool call) text, and what a running sequence is expected to produce."""

from __future__ import annotations

import asyncio

from .api import GenRequest
from .apierror import ApiError
from .engine import Delta, Sequence
from .groundtruth import RequestInfo
from .responses import ChunkRenderer
from .structured import SchemaError, json_text
from .textgen import TextKey, stable_unit


class DirectStream:
    """Writes a stream's SSE chunks from inside the scheduler step, straight to the socket.

    Waking one writer task per stream per step costs more than the write itself; with a few
    hundred streams that burst is what delays the next step. The response has been
    prepared with chunked transfer encoding and its headers sent, so each chunk is framed
    here (size in hex, CRLF) exactly as aiohttp would, and `write_eof()` ends it normally.
    """

    MAX_BUFFERED_BYTES = 8 * 1024 * 1024

    def __init__(self, transport: asyncio.BaseTransport, renderer: ChunkRenderer,
                 seq: Sequence) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport
        self.renderer = renderer
        self.seq = seq

    def push(self, delta: Delta) -> None:
        data = self.renderer.render_one(delta, self.seq.cached_tokens)
        if not data:
            return
        transport = self.transport
        if transport.is_closing():
            self.seq.abort("client disconnected")
        elif transport.get_write_buffer_size() > self.MAX_BUFFERED_BYTES:
            self.seq.abort("client not reading its stream")
        else:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))


def structured_text(req: GenRequest, key: TextKey) -> str:
    """The JSON a tool call's arguments or a JSON answer will be, or a 400 naming the schema."""
    tool = req.tool_call
    try:
        if tool is not None:
            return json_text(tool.parameters, key, f"tool:{tool.name}")
        return json_text(req.json_schema, key, req.json_format or "json_object")
    except SchemaError as exc:
        if tool is not None:
            index = next(i for i, t in enumerate(req.tools) if t.name == tool.name)
            param = f"tools[{index}].function.parameters"
        else:
            param = "response_format.json_schema.schema"
        raise ApiError(400, f"Invalid '{param}': no value can be produced for this schema "
                       f"({exc}).", param=param, code="invalid_value") from None


def regressed(rate: float, what: str, profile_name: str, key: TextKey) -> bool:
    """Whether a regress switch hits this (model, prompt, seed): keyed like divergence, so a
    regressed pool gets the same prompts wrong every time, at `rate` of all prompts."""
    return rate > 0 and stable_unit(what, profile_name, key) < rate


def expected_length(seq: Sequence) -> int:
    """Tokens a running sequence will generate in all: its natural length or max_tokens."""
    if seq.params.ignore_eos:
        return seq.params.max_tokens
    return min(seq.params.max_tokens, seq.stream.natural_length)


def seq_request_id(seq: Sequence) -> str:
    info = seq.request_info
    return info.request_id if isinstance(info, RequestInfo) else ""
