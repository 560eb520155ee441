"""OpenAI request validation: a chat or completions body read into a GenRequest, or an
ApiError naming the field.

Kept apart from the aiohttp routes so the shapes can be read (and tested) on their own; the
tools and response_format fields are read in tools.py, response bodies and SSE chunks are
built in responses.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .apierror import ApiError
from .textgen import (
    render_chat,
    render_chat_other,
    tokenize,
    tokenize_other,
)
from .tools import (
    Tool,
    choose_tool,
    read_response_format,
    read_tool_choice,
    read_tools,
)

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_STOPS = 4
MAX_TOP_LOGPROBS_CHAT = 20
MAX_LOGPROBS_COMPLETIONS = 5


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
        tools = read_tools(body)
        tool = choose_tool(tools, read_tool_choice(body, tools), parsed)
    json_format, json_schema = read_response_format(body) if json_mode else (None, None)
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
