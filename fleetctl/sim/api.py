"""OpenAI request validation, response bodies and SSE chunks.

Kept apart from the aiohttp routes so the shapes can be read (and tested) on their own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .engine import Delta
from .textgen import (
    VOCAB,
    VOCAB_JSON,
    Token,
    render_chat,
    render_chat_other,
    tokenize,
    tokenize_other,
)

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_STOPS = 4
MAX_TOP_LOGPROBS_CHAT = 20
MAX_LOGPROBS_COMPLETIONS = 5
FUNCTION_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


class ApiError(Exception):
    """Becomes an OpenAI error object: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class Tool:
    """One function from `tools`: its name and its JSON-Schema `parameters`."""

    name: str
    parameters: dict[str, Any]


@dataclass
class GenRequest:
    endpoint: str  # "chat" or "completions"
    model: str
    prompt_text: str
    prompt_tokens: list[str]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    stops: tuple[str, ...]
    temperature: float
    top_p: float
    seed: int | None
    top_logprobs: int | None  # None: no logprobs; 0..20: logprob of chosen + that many top
    ignore_eos: bool
    # The function this answer calls (decided from tools and tool_choice), if any.
    tool_call: Tool | None = None
    # None (free text), "json_object" or "json_schema" (with its schema, possibly empty).
    json_format: str | None = None
    json_schema: dict[str, Any] | None = None
    # Chat messages as (role, text) for another tokenizer's template; None for completions.
    messages: list[tuple[str, str]] | None = None
    # The prompt was given as token ids: one token each, whatever the tokenizer.
    token_ids: bool = False
    tools: list[Tool] = field(default_factory=list)


# ---- field readers ---------------------------------------------------------------------

_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _type_error(name: str, expected: type, value: Any) -> ApiError:
    got = type(value).__name__ if value is not None else "null"
    return ApiError(
        400,
        f"Invalid type for '{name}': expected {_TYPE_NAMES[expected]}, but got {got} instead.",
        param=name,
        code="invalid_type",
    )


def _range_error(name: str, value: Any, low: float | None, high: float | None) -> ApiError:
    bound = f">= {low}" if high is None else f"between {low} and {high}"
    return ApiError(
        400,
        f"Invalid '{name}': expected a value {bound}, but got {value!r} instead.",
        param=name,
        code="invalid_value",
    )


def _read_int(
    body: dict[str, Any], name: str, low: int | None = None, high: int | None = None
) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, int, value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise _range_error(name, value, low, high)
    return value


def _read_float(body: dict[str, Any], name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(name, float, value)
    if not low <= value <= high:
        raise _range_error(name, value, low, high)
    return float(value)


def _read_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _type_error(name, bool, value)
    return value


def _read_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise ApiError(400, "Missing required parameter: 'model'.", param="model",
                       code="missing_required_parameter")
    if not isinstance(model, str):
        raise _type_error("model", str, model)
    return model


def _read_stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "Invalid 'stop': expected a string or an array of strings.",
                       param="stop", code="invalid_type")
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"Invalid 'stop': at most {MAX_STOPS} stop sequences are allowed.",
                       param="stop", code="invalid_value")
    if any(s == "" for s in stops):
        raise ApiError(400, "Invalid 'stop': stop sequences must not be empty.",
                       param="stop", code="invalid_value")
    return tuple(stops)


def _read_stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = _read_bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise ApiError(400, "Invalid type for 'stream_options': expected an object.",
                       param="stream_options", code="invalid_type")
    if not stream:
        raise ApiError(400, "The 'stream_options' parameter is only allowed when 'stream' is "
                       "enabled.", param="stream_options", code="invalid_value")
    return stream, _read_bool(options, "include_usage")


def _read_common(body: dict[str, Any]) -> dict[str, Any]:
    n = _read_int(body, "n", 1)
    if n is not None and n != 1:
        raise ApiError(400, "Invalid 'n': the simulator supports only n=1.", param="n",
                       code="invalid_value")
    stream, include_usage = _read_stream(body)
    return {
        "stream": stream,
        "include_usage": include_usage,
        "stops": _read_stops(body),
        # Deliberately greedy by default (OpenAI defaults to 1.0) so that requests without
        # sampling parameters are reproducible and shadow diffs compare like with like.
        "temperature": _read_float(body, "temperature", 0.0, 2.0, 0.0),
        "top_p": _read_float(body, "top_p", 0.0, 1.0, 1.0),
        "seed": _read_int(body, "seed"),
        "ignore_eos": _read_bool(body, "ignore_eos"),  # vLLM extension, used by benchmarks
    }


# ---- chat and completions ---------------------------------------------------------------


def _message_text(index: int, message: Any) -> tuple[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"Invalid type for '{where}': expected an object.", param=where,
                       code="invalid_type")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise ApiError(400, f"Invalid value for '{where}.role': expected one of "
                       f"{', '.join(sorted(CHAT_ROLES))}.", param=f"{where}.role",
                       code="invalid_value")
    text = _content_text(where, message.get("content"))
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise ApiError(400, f"Invalid type for '{where}.tool_calls': expected an array.",
                           param=f"{where}.tool_calls", code="invalid_type")
        text += "".join(json.dumps(call, sort_keys=True) for call in calls)
    return role, text


def _content_text(where: str, content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                part.get("text"), str
            ):
                raise ApiError(400, f"Invalid '{where}.content': the simulator accepts only "
                               "text content parts.", param=f"{where}.content",
                               code="invalid_value")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ApiError(400, f"Invalid type for '{where}.content': expected a string or an array "
                   "of content parts.", param=f"{where}.content", code="invalid_type")


# ---- tools and response_format -----------------------------------------------------------


def _read_tools(body: dict[str, Any]) -> list[Tool]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ApiError(400, "Invalid type for 'tools': expected an array of tool objects.",
                       param="tools", code="invalid_type")
    if not tools:
        raise ApiError(400, "Invalid 'tools': empty array. Give at least one tool, or leave "
                       "'tools' out.", param="tools", code="invalid_value")
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ApiError(400, f"Invalid type for '{where}': expected an object like "
                           '{"type": "function", "function": {"name": ...}}.', param=where,
                           code="invalid_type")
        if tool.get("type") != "function":
            raise ApiError(400, f"Invalid value for '{where}.type': expected 'function'.",
                           param=f"{where}.type", code="invalid_value")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ApiError(400, f"Missing or invalid '{where}.function': expected an object "
                           "with 'name' and optional 'description' and 'parameters'.",
                           param=f"{where}.function", code="invalid_value")
        out.append(_read_function(f"{where}.function", function))
    names = [t.name for t in out]
    for name in names:
        if names.count(name) > 1:
            raise ApiError(400, f"Invalid 'tools': the function name '{name}' is used twice.",
                           param="tools", code="invalid_value")
    return out


def _read_function(where: str, function: dict[str, Any]) -> Tool:
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME_RE.match(name):
        raise ApiError(400, f"Invalid '{where}.name': expected 1 to 64 letters, digits, "
                       f"underscores or dashes, got {name!r}.", param=f"{where}.name",
                       code="invalid_value")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"Invalid type for '{where}.description': expected a string.",
                       param=f"{where}.description", code="invalid_type")
    parameters = function.get("parameters", {})
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise ApiError(400, f"Invalid type for '{where}.parameters': expected a JSON Schema "
                       "object.", param=f"{where}.parameters", code="invalid_type")
    if "type" in parameters and parameters["type"] != "object":
        raise ApiError(400, f"Invalid '{where}.parameters': the schema's type must be "
                       f"'object', got {parameters['type']!r}.", param=f"{where}.parameters",
                       code="invalid_value")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(400, f"Invalid type for '{where}.strict': expected a boolean.",
                       param=f"{where}.strict", code="invalid_type")
    return Tool(name=name, parameters=parameters)


def _read_tool_choice(body: dict[str, Any], tools: list[Tool]) -> str | Tool:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if choice == "none":
        return "none"
    if not tools:
        raise ApiError(400, "Invalid 'tool_choice': it is only allowed when 'tools' are "
                       "given.", param="tool_choice", code="invalid_value")
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise ApiError(400, f"Invalid value for 'tool_choice': expected one of "
                           f"{', '.join(TOOL_CHOICES)} or a named function, got {choice!r}.",
                           param="tool_choice", code="invalid_value")
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(
        name, str
    ):
        raise ApiError(400, "Invalid 'tool_choice': expected 'none', 'auto', 'required' or "
                       '{"type": "function", "function": {"name": "..."}}.',
                       param="tool_choice", code="invalid_value")
    for tool in tools:
        if tool.name == name:
            return tool
    raise ApiError(400, f"Invalid 'tool_choice': no function named '{name}' in 'tools' "
                   f"(given: {', '.join(t.name for t in tools)}).", param="tool_choice",
                   code="invalid_value")


def choose_tool(tools: list[Tool], choice: str | Tool,
                messages: list[tuple[str, str]]) -> Tool | None:
    """The function an answer calls. A named choice calls it; "required" calls the first
    tool whose name the last user message contains, else the first tool; "auto" calls a tool
    only when the last message is the user's and contains a tool's name (case-insensitive,
    first tool in `tools` order); "none" never calls one."""
    if isinstance(choice, Tool):
        return choice
    if choice == "none" or not tools:
        return None
    last_role, last_text = messages[-1]
    asked = None
    if last_role == "user":
        text = last_text.lower()
        asked = next((t for t in tools if t.name.lower() in text), None)
    if choice == "required":
        return asked or tools[0]
    return asked


def _read_response_format(body: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    fmt = body.get("response_format")
    if fmt is None:
        return None, None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise ApiError(400, "Invalid 'response_format': expected an object with 'type' one of "
                       f"{', '.join(RESPONSE_FORMATS)}.", param="response_format",
                       code="invalid_value")
    if kind == "text":
        return None, None
    if kind == "json_object":
        return "json_object", None
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise ApiError(400, "Invalid 'response_format.json_schema': expected an object with "
                       "'name' and 'schema'.", param="response_format.json_schema",
                       code="invalid_value")
    name = spec.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME_RE.match(name):
        raise ApiError(400, "Invalid 'response_format.json_schema.name': expected 1 to 64 "
                       f"letters, digits, underscores or dashes, got {name!r}.",
                       param="response_format.json_schema.name", code="invalid_value")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise ApiError(400, "Invalid type for 'response_format.json_schema.schema': expected "
                       "a JSON Schema object.", param="response_format.json_schema.schema",
                       code="invalid_type")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(400, "Invalid type for 'response_format.json_schema.strict': expected "
                       "a boolean.", param="response_format.json_schema.strict",
                       code="invalid_type")
    return "json_schema", schema


def parse_chat(
    body: dict[str, Any], *, tool_calls: bool = True, json_mode: bool = True
) -> GenRequest:
    """A chat request. With `tool_calls` False the pool ignores `tools` and `tool_choice`
    (a server without tool parsing); with `json_mode` False it ignores `response_format`."""
    model = _read_model(body)
    messages = body.get("messages")
    if messages is None:
        raise ApiError(400, "Missing required parameter: 'messages'.", param="messages",
                       code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "Invalid 'messages': expected a non-empty array of messages.",
                       param="messages", code="invalid_value")
    parsed = [_message_text(i, m) for i, m in enumerate(messages)]
    rendered = render_chat(parsed)
    tools: list[Tool] = []
    tool = None
    if tool_calls:
        tools = _read_tools(body)
        tool = choose_tool(tools, _read_tool_choice(body, tools), parsed)
    json_format, json_schema = _read_response_format(body) if json_mode else (None, None)
    max_tokens = _read_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _read_int(body, "max_tokens", 1)
    logprobs = _read_bool(body, "logprobs")
    top = _read_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS_CHAT)
    if top is not None and not logprobs:
        raise ApiError(400, "Invalid 'top_logprobs': 'logprobs' must be set to true when "
                       "'top_logprobs' is used.", param="top_logprobs", code="invalid_value")
    return GenRequest(
        endpoint="chat", model=model, prompt_text=rendered, prompt_tokens=tokenize(rendered),
        max_tokens=max_tokens, top_logprobs=(top or 0) if logprobs else None,
        tool_call=tool, json_format=json_format, json_schema=json_schema, messages=parsed,
        tools=tools, **_read_common(body),
    )


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        return " ".join(str(t) for t in prompt)  # token ids: one simulator token each
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "Invalid 'prompt': the simulator accepts one prompt per request.",
                       param="prompt", code="invalid_value")
    raise ApiError(400, "Invalid type for 'prompt': expected a string, an array with one "
                   "string, or an array of token ids.", param="prompt", code="invalid_type")


def parse_completion(body: dict[str, Any]) -> GenRequest:
    model = _read_model(body)
    if body.get("prompt") is None:
        raise ApiError(400, "Missing required parameter: 'prompt'.", param="prompt",
                       code="missing_required_parameter")
    text = _prompt_text(body["prompt"])
    logprobs = _read_int(body, "logprobs", 0, MAX_LOGPROBS_COMPLETIONS)
    prompt = body["prompt"]
    token_ids = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)
    return GenRequest(
        endpoint="completions", model=model, prompt_text=text, prompt_tokens=tokenize(text),
        max_tokens=_read_int(body, "max_tokens", 1), top_logprobs=logprobs,
        token_ids=token_ids, **_read_common(body),
    )


def prompt_token_list(req: GenRequest, tokenizer: str = "llama3") -> list[str]:
    """The prompt's tokens under a pool's tokenizer ("llama3" or "other"). The generated text
    never depends on it: only the prompt's token count (and its prefix-cache blocks) do."""
    if tokenizer == "llama3" or req.token_ids:
        return req.prompt_tokens
    if req.messages is not None:
        return tokenize_other(render_chat_other(req.messages))
    return tokenize_other(req.prompt_text)


def prompt_token_count(req: GenRequest, tokens: list[str] | None = None) -> int:
    """Tokens of the (rendered) prompt plus one BOS token."""
    return len(req.prompt_tokens if tokens is None else tokens) + 1


def resolve_max_tokens(req: GenRequest, prompt_tokens: int, max_context: int) -> int:
    """max_tokens within the context window, or the OpenAI context_length_exceeded error."""
    if req.max_tokens is not None and req.max_tokens > max_context:
        raise _range_error("max_tokens", req.max_tokens, 1, max_context)
    wanted = req.max_tokens if req.max_tokens is not None else max_context - prompt_tokens
    if prompt_tokens + max(wanted, 1) > max_context:
        param = "messages" if req.endpoint == "chat" else "prompt"
        raise ApiError(
            400,
            f"This model's maximum context length is {max_context} tokens. However, you "
            f"requested {prompt_tokens + max(wanted, 1)} tokens ({prompt_tokens} in the "
            f"prompt, {max(wanted, 1)} for the completion). Please reduce the length of the "
            "prompt or the completion.",
            param=param,
            code="context_length_exceeded",
        )
    return wanted


# ---- response bodies --------------------------------------------------------------------


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
