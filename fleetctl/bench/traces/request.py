"""One request of a trace: the fields, their limits and the checks every parser runs on
every line, the optional header, and the error a bad trace raises."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fleetctl.core import jsonl
from fleetctl.core.jsonl import JsonlError
from fleetctl.core.jsonl import show as _show

MAX_TOKENS = 10_000_000
MAX_GROUP_ID_CHARS = 200
LATENCY_CLASSES = ("interactive", "standard", "batch")
FORMAT_VERSION = 1

TraceFormat = Literal["fleetctl", "mooncake", "azure-csv"]

REQUIRED_KEYS = frozenset({"prompt_tokens", "completion_tokens", "arrival_s"})
OPTIONAL_KEYS = frozenset(
    {"prompt", "messages", "prefix_group", "prefix_tokens", "latency_class"})
REQUEST_KEYS = REQUIRED_KEYS | OPTIONAL_KEYS
HEADER_KEYS = frozenset({"fleetctl_trace", "name", "description"})

NO_REQUESTS = "the trace has no requests"


class TraceError(JsonlError):
    """A trace that cannot be used. `errors` holds (line number, message) pairs; line 0 means
    the file as a whole (for example "the trace has no requests")."""


# --- the request ------------------------------------------------------------------------------


def _positive_int(name: str, value: object) -> str | None:
    if type(value) is not int or value < 1:
        return f"{name} must be a positive integer, got {_show(value)}"
    if value > MAX_TOKENS:
        return f"{name} must be at most {MAX_TOKENS:,}, got {value:,}"
    return None


def _message_problem(messages: object) -> str | None:
    problem = jsonl.message_problem(messages)
    return f"{problem[0]} {problem[1]}" if problem else None


def request_problem(prompt_tokens: object, completion_tokens: object, arrival_s: object,
                    prompt: object = None, messages: object = None, prefix_group: object = None,
                    prefix_tokens: object = 0, latency_class: object = None) -> str | None:
    """What is wrong with these request fields, or None. Ordered so the common case (valid
    counts, no text) costs a handful of comparisons: parsers call this for every line."""
    if type(prompt_tokens) is not int or not 0 < prompt_tokens <= MAX_TOKENS:
        return _positive_int("prompt_tokens", prompt_tokens)
    if type(completion_tokens) is not int or not 0 < completion_tokens <= MAX_TOKENS:
        return _positive_int("completion_tokens", completion_tokens)
    if type(arrival_s) is float:
        if not 0.0 <= arrival_s < math.inf:  # also true for NaN
            return _arrival_problem(arrival_s)
    elif type(arrival_s) is not int or arrival_s < 0:
        return _arrival_problem(arrival_s)
    if prompt is not None or messages is not None:
        problem = _text_problem(prompt, messages)
        if problem:
            return problem
    if prefix_group is not None or type(prefix_tokens) is not int or prefix_tokens:
        problem = _prefix_problem(prompt_tokens, prefix_group, prefix_tokens)
        if problem:
            return problem
    if latency_class is not None and latency_class not in LATENCY_CLASSES:
        return (f"latency_class must be one of {', '.join(LATENCY_CLASSES)}, "
                f"got {_show(latency_class)}")
    return None


def _arrival_problem(arrival: object) -> str:
    return f"arrival_s must be a finite number of seconds ≥ 0, got {_show(arrival)}"


def _text_problem(prompt: object, messages: object) -> str | None:
    if prompt is not None:
        if type(prompt) is not str or not prompt:
            return f"prompt must be a non-empty string, got {_show(prompt)}"
        if messages is not None:
            return "give either prompt or messages, not both"
    if messages is not None:
        # The one place a trace line can nest (every other value is a number or a string);
        # a line over 200 levels never gets here (jsonl.retry refuses it).
        if jsonl.too_deep(messages, jsonl.MAX_DEPTH - 1):
            return jsonl.DEPTH_MESSAGE
        return _message_problem(messages)
    return None


def _prefix_problem(prompt_tokens: int, group: object, tokens: object) -> str | None:
    if group is not None and (type(group) is not str or not group
                              or len(group) > MAX_GROUP_ID_CHARS):
        return (f"prefix_group must be a non-empty string of at most "
                f"{MAX_GROUP_ID_CHARS} characters, got {_show(group)}")
    if type(tokens) is not int or tokens < 0:
        return f"prefix_tokens must be an integer ≥ 0, got {_show(tokens)}"
    if tokens > prompt_tokens:
        return f"prefix_tokens ({tokens}) cannot exceed prompt_tokens ({prompt_tokens})"
    if tokens and group is None:
        return "prefix_tokens needs a prefix_group naming the requests that share it"
    return None


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace. Construction validates; a bad field raises ValueError with a
    message that names it. `arrival_s` is the offset from the trace start in seconds."""

    prompt_tokens: int
    completion_tokens: int
    arrival_s: float
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prefix_group: str | None = None
    prefix_tokens: int = 0
    latency_class: str | None = None

    def __post_init__(self) -> None:
        problem = request_problem(self.prompt_tokens, self.completion_tokens, self.arrival_s,
                                  self.prompt, self.messages, self.prefix_group,
                                  self.prefix_tokens, self.latency_class)
        if problem:
            raise ValueError(problem)
        if type(self.arrival_s) is int:
            object.__setattr__(self, "arrival_s", float(self.arrival_s))

    def to_json(self) -> dict[str, Any]:
        """The trace-format object: required keys always, optional keys only when set."""
        out: dict[str, Any] = {"arrival_s": self.arrival_s, "prompt_tokens": self.prompt_tokens,
                               "completion_tokens": self.completion_tokens}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.messages is not None:
            out["messages"] = self.messages
        if self.prefix_group is not None:
            out["prefix_group"] = self.prefix_group
        if self.prefix_tokens:
            out["prefix_tokens"] = self.prefix_tokens
        if self.latency_class is not None:
            out["latency_class"] = self.latency_class
        return out


def _validated_builder() -> Callable[..., TraceRequest]:
    """A constructor for fields request_problem() has already passed. The frozen dataclass
    __init__ (eight object.__setattr__ calls, then __post_init__ validating again) is about
    half the cost of parsing a line; the slot descriptors set the same fields directly."""
    new = object.__new__
    setters = [getattr(TraceRequest, name).__set__ for name in TraceRequest.__slots__]
    s0, s1, s2, s3, s4, s5, s6, s7 = setters

    def build(prompt_tokens: int, completion_tokens: int, arrival_s: float, prompt: Any,
              messages: Any, prefix_group: Any, prefix_tokens: int,
              latency_class: Any) -> TraceRequest:
        request = new(TraceRequest)
        s0(request, prompt_tokens)
        s1(request, completion_tokens)
        s2(request, arrival_s)
        s3(request, prompt)
        s4(request, messages)
        s5(request, prefix_group)
        s6(request, prefix_tokens)
        s7(request, latency_class)
        return request

    assert TraceRequest.__slots__ == tuple(REQUEST_FIELDS)
    return build


REQUEST_FIELDS = ("prompt_tokens", "completion_tokens", "arrival_s", "prompt", "messages",
                  "prefix_group", "prefix_tokens", "latency_class")
_build_validated = _validated_builder()


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """The optional first line of a fleetctl trace."""

    name: str = ""
    description: str = ""
    version: int = FORMAT_VERSION
