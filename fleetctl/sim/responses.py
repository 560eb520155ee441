"""OpenAI response bodies and SSE chunks of a generated answer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .apierror import ApiError
from .engine import Delta
from .textgen import VOCAB, VOCAB_JSON, Token


@dataclass
class ResponseMeta:
    response_id: str
    created: int
    model: str
    fingerprint: str
    endpoint: str
    prompt_tokens: int
    # Set when the answer is a tool call: its id and the function's name. The generated
    # text is then the call's `arguments`.
    tool_call_id: str | None = None
    tool_name: str | None = None

    def finish(self, finish_reason: str) -> str:
        """A tool call that ends by itself finishes with "tool_calls" (cut short: "length")."""
        return "tool_calls" if self.tool_name is not None and finish_reason == "stop" \
            else finish_reason

    def tool_call(self, arguments: str) -> dict[str, Any]:
        return {"id": self.tool_call_id, "type": "function",
                "function": {"name": self.tool_name, "arguments": arguments}}


def usage(meta: ResponseMeta, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": meta.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": meta.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _chat_logprob_entry(token: Token) -> dict[str, Any]:
    return {
        "token": token.text,
        "logprob": token.logprob,
        "bytes": list(token.text.encode()),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in token.top or []
        ],
    }


def _completion_logprobs(tokens: list[Token], offset: int) -> dict[str, Any]:
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.text)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [dict(t.top or []) for t in tokens],
        "text_offset": offsets,
    }


def completion_body(
    meta: ResponseMeta, deltas: list[Delta], finish_reason: str, cached_tokens: int,
    with_logprobs: bool,
) -> dict[str, Any]:
    text = "".join(d.text for d in deltas)
    tokens = [d.token for d in deltas if d.token is not None]
    logprobs: dict[str, Any] | None = None
    if meta.endpoint == "chat":
        if with_logprobs:
            logprobs = {"content": [_chat_logprob_entry(t) for t in tokens], "refusal": None}
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if meta.tool_name is not None:
            message["content"] = None
            message["tool_calls"] = [meta.tool_call(text)]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": meta.finish(finish_reason),
        }
        obj = "chat.completion"
    else:
        if with_logprobs:
            logprobs = _completion_logprobs(tokens, 0)
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "text_completion"
    return {
        "id": meta.response_id,
        "object": obj,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.fingerprint,
        "choices": [choice],
        "usage": usage(meta, len(tokens), cached_tokens),
    }


_VOCAB_JSON_BYTES: tuple[bytes, ...] = tuple(j.encode() for j in VOCAB_JSON)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class ChunkRenderer:
    """SSE bytes for a stream. The common chunk (one vocabulary token, no logprobs) is the
    precomputed prefix + the token's precomputed JSON string + the suffix: no json.dumps."""

    def __init__(self, meta: ResponseMeta, include_usage: bool, with_logprobs: bool) -> None:
        self.meta = meta
        self.include_usage = include_usage
        self.with_logprobs = with_logprobs
        self.chat = meta.endpoint == "chat"
        self.tool = self.chat and meta.tool_name is not None
        self._sent_role = False
        self._text_offset = 0
        self._completion_tokens = 0
        head = {
            "id": meta.response_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": meta.created,
            "model": meta.model,
            "system_fingerprint": meta.fingerprint,
        }
        self._head = _compact(head)[:-1]  # open object: choices and usage follow
        text_key = '"delta":{"content":' if self.chat else '"text":'
        self._prefix = f'data: {self._head},"choices":[{{"index":0,{text_key}'.encode()
        close = "}" if self.chat else ""
        usage_null = ',"usage":null' if include_usage else ""
        self._suffix = f'{close},"logprobs":null,"finish_reason":null}}]{usage_null}}}\n\n'.encode()

    def render(self, deltas: list[Delta], cached_tokens: int) -> bytes:
        return b"".join(self.render_one(delta, cached_tokens) for delta in deltas)

    def render_one(self, delta: Delta, cached_tokens: int) -> bytes:
        if self.tool:
            return self._tool_one(delta, cached_tokens)
        out = self._token_chunk(delta)
        if self.chat and not self._sent_role:
            # The role chunk goes out with the first token, so clients' TTFT stays honest.
            self._sent_role = True
            out = self._event({"role": "assistant", "content": ""}, None, None) + out
        self._completion_tokens += delta.token is not None
        if delta.finish_reason is not None:
            out += self._finish(delta.finish_reason, cached_tokens)
        return out

    def _tool_one(self, delta: Delta, cached_tokens: int) -> bytes:
        """A streamed tool call: the first chunk names the call (id, type, function name,
        empty arguments), then each token's text is a piece of `arguments`, as OpenAI and
        vLLM stream them."""
        out = b""
        if not self._sent_role:
            self._sent_role = True
            head = {"role": "assistant", "content": None,
                    "tool_calls": [{"index": 0, **self.meta.tool_call("")}]}
            out = self._event(head, None, None)
        token = delta.token
        self._completion_tokens += token is not None
        if delta.text or (self.with_logprobs and token is not None):
            logprobs = None
            if self.with_logprobs and token is not None:
                logprobs = {"content": [_chat_logprob_entry(token)], "refusal": None}
            piece = {"tool_calls": [{"index": 0, "function": {"arguments": delta.text}}]}
            out += self._event(piece, logprobs, None)
        if delta.finish_reason is not None:
            out += self._finish(self.meta.finish(delta.finish_reason), cached_tokens)
        return out

    def _token_chunk(self, delta: Delta) -> bytes:
        token = delta.token
        if self.with_logprobs and token is not None:
            return self._logprob_chunk(delta, token)
        if not delta.text:
            return b""
        if token is not None and delta.text is VOCAB[token.vocab_index]:
            text_json = _VOCAB_JSON_BYTES[token.vocab_index]
        else:
            text_json = json.dumps(delta.text).encode()
        return self._prefix + text_json + self._suffix

    def _logprob_chunk(self, delta: Delta, token: Token) -> bytes:
        if self.chat:
            logprobs: dict[str, Any] = {"content": [_chat_logprob_entry(token)], "refusal": None}
            return self._event({"content": delta.text}, logprobs, None)
        logprobs = _completion_logprobs([token], self._text_offset)
        self._text_offset += len(token.text)
        return self._event(delta.text, logprobs, None)

    def _finish(self, finish_reason: str, cached_tokens: int) -> bytes:
        final = self._event({} if self.chat else "", None, finish_reason)
        if self.include_usage:
            body = usage(self.meta, self._completion_tokens, cached_tokens)
            final += self._raw(f'{self._head},"choices":[],"usage":{_compact(body)}}}')
        return final + b"data: [DONE]\n\n"

    def _event(self, content: Any, logprobs: Any, finish_reason: str | None) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        choice["delta" if self.chat else "text"] = content
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish_reason
        tail = ',"usage":null' if self.include_usage else ""
        return self._raw(f'{self._head},"choices":[{_compact(choice)}]{tail}}}')

    @staticmethod
    def _raw(payload: str) -> bytes:
        return f"data: {payload}\n\n".encode()

    @staticmethod
    def error_event(error: ApiError) -> bytes:
        return f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()
