"""The OpenAI-contract suite: a registry of cases, each saying what it sends and how it judges
the answer. `services.run_execute` runs them against every endpoint of a pool (and, side by
side, one endpoint of the reference pool); nothing here writes a row.

A case returns an `Outcome`: pass / fail / skip / error (no answer to judge), what was
expected and what came back in a sentence each, a short phrase for the run's summary, and
excerpts of the request and the response. Parity cases compare the pool under test with the
reference pool and are skipped when there is none.

Required cases are the contract callers rely on (`REQUIRED_BY_DEFAULT`); the others are
optional (a failure makes the verdict *warn*). A run may require more (`required_keys`).
The saturation case floods the pool and only runs when a run asks for it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import jsonschema

from fleetctl.core.http import AsyncClient, Client, OutboundError, OutboundResponse

PASS, FAIL, SKIP, ERROR = "pass", "fail", "skip", "error"
EXCERPT_CHARS = 1500
UNKNOWN_MODEL = "fleetctl-conformance-no-such-model"
SATURATION_REQUESTS = 1024
SATURATION_WAVES = 3

MESSAGES = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The three primary colours are"
# The message sets whose prompt-token counts must match the reference pool's.
PARITY_MESSAGES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello!"}],
    MESSAGES,
    [{"role": "system", "content": "You answer questions about shipping logistics."},
     {"role": "user", "content": "How long does a container take from Rotterdam to Shanghai?"},
     {"role": "assistant", "content": "About 30 to 35 days by sea, depending on the route."},
     {"role": "user", "content": "And by rail, through Kazakhstan? Give a range in days."}],
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                   "population": {"type": "integer"}},
    "required": ["city", "country"],
}


@dataclass
class Outcome:
    status: str
    expected: str
    got: str
    brief: str = ""  # the phrase the run's summary uses when this case does not pass
    request: Any = None
    response: str = ""
    latency_ms: float | None = None
    numbers: dict[str, Any] = field(default_factory=dict)


class Probe:
    """One endpoint of one pool, as the cases talk to it. Answers are kept per endpoint so a
    parity case asks the reference pool only once."""

    def __init__(self, *, pool_name: str, base_url: str, model: str, expected_models: list[str],
                 registry_max_context: int | None, timeout_s: float = 30.0) -> None:
        self.pool_name = pool_name
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.expected_models = expected_models
        self.registry_max_context = registry_max_context
        self.timeout_s = timeout_s
        self.client = Client(base_url=self.base_url, timeout_s=timeout_s,
                             headers={"Authorization": "Bearer fleetctl-conformance"})
        self._memo: dict[str, Any] = {}

    def close(self) -> None:
        self.client.close()

    def post(self, path: str, body: Any = None, *, content: bytes | None = None
             ) -> OutboundResponse:
        if content is not None:
            return self.client.post(path, content=content,
                                    headers={"Content-Type": "application/json"})
        return self.client.post(path, json=body)

    def chat(self, **fields: Any) -> tuple[dict[str, Any], OutboundResponse]:
        body = {"model": self.model, "messages": MESSAGES, "max_tokens": 16,
                "temperature": 0, **fields}
        return body, self.post("/v1/chat/completions", body)

    def models_card(self) -> tuple[OutboundResponse | None, dict[str, Any] | None]:
        """GET /v1/models once; (the answer, this model's card or None)."""
        if "models" not in self._memo:
            try:
                answer: OutboundResponse | None = self.client.get("/v1/models")
            except OutboundError:
                answer = None
            card = None
            if answer is not None and answer.status_code == 200:
                try:
                    data = answer.json().get("data") or []
                    card = next((m for m in data if isinstance(m, dict)
                                 and m.get("id") == self.model), None)
                except (ValueError, AttributeError):
                    card = None
            self._memo["models"] = (answer, card)
        return self._memo["models"]  # type: ignore[no-any-return]

    def max_context(self) -> tuple[int | None, str]:
        """The model's context window and where it was read: the server's `max_model_len`
        from /v1/models when it reports one, else the pool registry's entry."""
        _, card = self.models_card()
        reported = (card or {}).get("max_model_len")
        if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
            return reported, "max_model_len from /v1/models"
        if self.registry_max_context:
            return self.registry_max_context, "the pool registry's max context"
        return None, "unknown"

    def prompt_tokens(self, index: int) -> tuple[int | None, str]:
        """usage.prompt_tokens for PARITY_MESSAGES[index] (max_tokens 1), or why not."""
        key = f"prompt_tokens:{index}"
        if key not in self._memo:
            try:
                _, answer = self.chat(messages=PARITY_MESSAGES[index], max_tokens=1)
            except OutboundError as exc:
                self._memo[key] = (None, f"no answer: {exc}")
                return self._memo[key]  # type: ignore[no-any-return]
            value, why = None, f"HTTP {answer.status_code}"
            if answer.status_code == 200:
                try:
                    value = answer.json()["usage"]["prompt_tokens"]
                    why = ""
                except (ValueError, KeyError, TypeError):
                    why = "no usage.prompt_tokens in the answer"
            self._memo[key] = (value, why)
        return self._memo[key]  # type: ignore[no-any-return]


Judge = Callable[[Probe, "Probe | None"], Outcome]


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    required: bool
    sends: str
    judges: str
    judge: Judge
    parity: bool = False  # compares with the reference pool: runs on the pool under test only
    opt_in: bool = False  # runs only when the run asks for it
    short: str = ""  # how the run's summary names it

    @property
    def label(self) -> str:
        return self.short or self.key


CASES: list[Case] = []


def case(key: str, title: str, *, required: bool, sends: str, judges: str,
         parity: bool = False, opt_in: bool = False, short: str = ""
         ) -> Callable[[Judge], Judge]:
    def add(judge: Judge) -> Judge:
        CASES.append(Case(key, title, required, sends, judges, judge, parity, opt_in, short))
        return judge

    return add


def by_key() -> dict[str, Case]:
    return {c.key: c for c in CASES}


# --- helpers ----------------------------------------------------------------------------------

def _excerpt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + " …(cut)"


def _outcome(status: str, expected: str, got: str, *, brief: str = "", request: Any = None,
             answer: OutboundResponse | None = None, **numbers: Any) -> Outcome:
    return Outcome(status=status, expected=expected, got=got, brief=brief or got,
                   request=request,
                   response=_excerpt(f"HTTP {answer.status_code} {answer.text}") if answer
                   else "",
                   latency_ms=round(answer.latency_ms, 1) if answer else None, numbers=numbers)


def _json(answer: OutboundResponse) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None


def _not_ok(expected: str, body: Any, answer: OutboundResponse) -> Outcome:
    message = ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = f": {str(body['error'].get('message', ''))[:200]}"
    return _outcome(FAIL, expected, f"HTTP {answer.status_code}{message}", request=body,
                    answer=answer, brief=f"HTTP {answer.status_code}")


def sse_events(text: str) -> tuple[list[Any], bool, str]:
    """The `data:` payloads of an SSE body: (decoded chunks, saw [DONE], first problem)."""
    chunks: list[Any] = []
    done = False
    problem = ""
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        if done and not problem:
            problem = "data after [DONE]"
        try:
            chunks.append(json.loads(payload))
        except ValueError:
            problem = problem or f"a data line is not JSON: {payload[:80]!r}"
    return chunks, done, problem


def _usage_problem(usage: Any) -> str:
    if not isinstance(usage, dict):
        return "no usage object"
    numbers = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
        return f"usage fields are not counts: {usage}"
    if numbers[0] + numbers[1] != numbers[2]:  # type: ignore[operator]
        return f"total_tokens {numbers[2]} ≠ prompt {numbers[0]} + completion {numbers[1]}"
    if numbers[0] == 0:
        return "usage.prompt_tokens is 0"
    return ""


def _first_choice(body: Any) -> dict[str, Any] | None:
    if not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]


def _content(body: Any) -> str | None:
    choice = _first_choice(body)
    message = (choice or {}).get("message")
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    return content if isinstance(content, str) else None


def _call(judge: Callable[[], Outcome], expected: str) -> Outcome:
    try:
        return judge()
    except OutboundError as exc:
        return Outcome(ERROR, expected, f"no answer: {exc}", brief="no answer")


# --- the cases --------------------------------------------------------------------------------

@case("models.list", "/v1/models lists the model",
      short="/v1/models", required=True,
      sends="GET /v1/models",
      judges="200, an object of type list whose data holds every model the plan's routes "
             "serve (or the run's model), each with id and object \"model\"")
def models_list(probe: Probe, ref: Probe | None) -> Outcome:
    expected = f"200 listing {', '.join(probe.expected_models)}"

    def judge() -> Outcome:
        answer, _ = probe.models_card()
        if answer is None:
            answer = probe.client.get("/v1/models")
        body = _json(answer)
        if answer.status_code != 200:
            return _not_ok(expected, body, answer)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or body.get("object") != "list":
            return _outcome(FAIL, expected, "not an object of type list with data",
                            answer=answer)
        ids = [m.get("id") for m in data if isinstance(m, dict)]
        missing = [m for m in probe.expected_models if m not in ids]
        if missing:
            return _outcome(FAIL, expected, f"missing {', '.join(missing)} (lists "
                            f"{', '.join(map(str, ids)) or 'nothing'})", answer=answer,
                            brief=f"does not list {', '.join(missing)}")
        return _outcome(PASS, expected, f"lists {', '.join(map(str, ids))}", answer=answer)

    return _call(judge, expected)


@case("chat.basic", "Chat completion (not streamed) with usage",
      short="chat", required=True,
      sends="POST /v1/chat/completions, a system and a user message, max_tokens 16",
      judges="200, object chat.completion, one choice with an assistant message and text "
             "content, finish_reason stop or length, usage with prompt, completion and total "
             "token counts that add up")
def chat_basic(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "a chat.completion with content, finish_reason and usage that adds up"

    def judge() -> Outcome:
        request, answer = probe.chat()
        body = _json(answer)
        if answer.status_code != 200:
            return _not_ok(expected, request, answer)
        choice = _first_choice(body)
        problems = []
        if body.get("object") != "chat.completion":
            problems.append(f"object is {body.get('object')!r}")
        if choice is None or _content(body) is None:
            problems.append("no choice with text content")
        elif (choice.get("message") or {}).get("role") != "assistant":
            problems.append("the message's role is not assistant")
        if choice is not None and choice.get("finish_reason") not in ("stop", "length"):
            problems.append(f"finish_reason {choice.get('finish_reason')!r}")
        if usage := _usage_problem(body.get("usage")):
            problems.append(usage)
        if problems:
            return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer)
        return _outcome(PASS, expected, f"{body['usage']['completion_tokens']} tokens, "
                        f"finish_reason {choice['finish_reason']}",  # type: ignore[index]
                        request=request, answer=answer)

    return _call(judge, expected)


def _stream_judge(probe: Probe, expected: str, *, chat: bool, include_usage: bool) -> Outcome:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    request: dict[str, Any] = {"model": probe.model, "max_tokens": 16, "temperature": 0,
                               "stream": True}
    if chat:
        request["messages"] = MESSAGES
    else:
        request["prompt"] = PROMPT
    if include_usage:
        request["stream_options"] = {"include_usage": True}
    answer = probe.post(path, request)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    chunks, done, problem = sse_events(answer.text)
    problems = [problem] if problem else []
    if "text/event-stream" not in answer.content_type:
        problems.append(f"content type {answer.content_type or 'missing'}")
    if not done:
        problems.append("the stream does not end with data: [DONE]")
    kind = "chat.completion.chunk" if chat else "text_completion"
    if any(not isinstance(c, dict) or c.get("object") != kind for c in chunks):
        problems.append(f"a chunk's object is not {kind}")
    texts, finishes = [], []
    for chunk in chunks:
        for choice in (chunk.get("choices") or []) if isinstance(chunk, dict) else []:
            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if isinstance(text, str) and text:
                texts.append(text)
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
    if not texts:
        problems.append("no text in any chunk")
    if len(finishes) != 1:
        problems.append(f"{len(finishes)} chunks carry a finish_reason (expected one)")
    numbers: dict[str, Any] = {"chunks": len(chunks)}
    if include_usage:
        last = chunks[-1] if chunks else None
        usage = last.get("usage") if isinstance(last, dict) else None
        if usage is None:
            problems.append("no usage in the final chunk")
            brief = "no usage in the final chunk"
        else:
            if why := _usage_problem(usage):
                problems.append(f"final chunk: {why}")
            if last.get("choices"):  # type: ignore[union-attr]
                problems.append("the usage chunk has choices (expected an empty list)")
            brief = "; ".join(problems)
            numbers["usage"] = usage
    else:
        brief = "; ".join(problems)
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), brief=brief, request=request,
                        answer=answer, **numbers)
    return _outcome(PASS, expected, f"{len(chunks)} chunks, {len(texts)} with text, "
                    f"finish_reason {finishes[0]}, [DONE]", request=request, answer=answer,
                    **numbers)


@case("chat.stream", "Chat completion, streamed",
      short="streamed chat", required=True,
      sends="POST /v1/chat/completions with stream: true",
      judges="200, text/event-stream of chat.completion.chunk objects with content deltas, "
             "exactly one finish_reason, ending with data: [DONE]")
def chat_stream(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "SSE chat.completion.chunk deltas, one finish_reason, [DONE]"
    return _call(lambda: _stream_judge(probe, expected, chat=True, include_usage=False),
                 expected)


@case("chat.stream_usage", "Streamed usage (stream_options.include_usage)",
      short="streamed usage", required=True,
      sends="POST /v1/chat/completions with stream: true and "
            "stream_options: {include_usage: true}",
      judges="the final chunk before [DONE] carries usage (counts that add up) and an empty "
             "choices list")
def chat_stream_usage(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "usage in the final chunk, with choices []"
    return _call(lambda: _stream_judge(probe, expected, chat=True, include_usage=True),
                 expected)


@case("completions.basic", "Text completion (not streamed)",
      short="completions", required=False,
      sends="POST /v1/completions with a prompt, max_tokens 16",
      judges="200, object text_completion, one choice with text and finish_reason, usage "
             "that adds up")
def completions_basic(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "a text_completion with text, finish_reason and usage"

    def judge() -> Outcome:
        request = {"model": probe.model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
        answer = probe.post("/v1/completions", request)
        body = _json(answer)
        if answer.status_code != 200:
            return _not_ok(expected, request, answer)
        choice = _first_choice(body)
        problems = []
        if body.get("object") != "text_completion":
            problems.append(f"object is {body.get('object')!r}")
        if choice is None or not isinstance(choice.get("text"), str):
            problems.append("no choice with text")
        elif choice.get("finish_reason") not in ("stop", "length"):
            problems.append(f"finish_reason {choice.get('finish_reason')!r}")
        if usage := _usage_problem(body.get("usage")):
            problems.append(usage)
        if problems:
            return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer)
        return _outcome(PASS, expected, f"text, finish_reason {choice['finish_reason']}",  # type: ignore[index]
                        request=request, answer=answer)

    return _call(judge, expected)


@case("completions.stream", "Text completion, streamed",
      short="streamed completions", required=False,
      sends="POST /v1/completions with stream: true",
      judges="text/event-stream of text_completion chunks with text, one finish_reason, "
             "[DONE]")
def completions_stream(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "SSE text_completion chunks, one finish_reason, [DONE]"
    return _call(lambda: _stream_judge(probe, expected, chat=False, include_usage=False),
                 expected)


@case("chat.stop", "A stop sequence ends the answer",
      short="stop", required=True,
      sends="a first answer (temperature 0, seed 7), then the same request with one of its "
            "words as stop",
      judges="finish_reason stop and the stop string absent from the content")
def chat_stop(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "finish_reason stop, the stop string not in the content"

    def judge() -> Outcome:
        first_request, first = probe.chat(max_tokens=24, seed=7)
        text = _content(_json(first)) if first.status_code == 200 else None
        if text is None:
            return _not_ok(expected, first_request, first)
        words = [w.strip(".,;:!?\"'()") for w in text.split()]
        words = [w for w in words[2:] if len(w) >= 3]
        if not words:
            return _outcome(SKIP, expected, f"the first answer has no word to stop on "
                            f"({text[:60]!r})", request=first_request, answer=first)
        stop = f" {words[0]}"
        request, answer = probe.chat(max_tokens=24, seed=7, stop=[stop])
        body = _json(answer)
        if answer.status_code != 200:
            return _not_ok(expected, request, answer)
        content = _content(body)
        finish = (_first_choice(body) or {}).get("finish_reason")
        problems = []
        if content is None:
            problems.append("no content")
        elif stop in content:
            problems.append(f"the content contains the stop string {stop!r}")
        if finish != "stop":
            problems.append(f"finish_reason {finish!r}")
        if problems:
            return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer,
                            stop=stop)
        return _outcome(PASS, expected, f"stopped before {stop!r}, finish_reason stop",
                        request=request, answer=answer, stop=stop)

    return _call(judge, expected)


@case("chat.length", "max_tokens ends the answer with finish_reason length",
      short="max_tokens → length", required=True,
      sends="POST /v1/chat/completions with max_tokens 4",
      judges="finish_reason length and usage.completion_tokens at most 4")
def chat_length(probe: Probe, ref: Probe | None) -> Outcome:
    expected = 'finish_reason "length", at most 4 completion tokens'

    def judge() -> Outcome:
        request, answer = probe.chat(max_tokens=4,
                                     messages=[{"role": "user",
                                                "content": "Write a long story about a ship."}])
        body = _json(answer)
        if answer.status_code != 200:
            return _not_ok(expected, request, answer)
        finish = (_first_choice(body) or {}).get("finish_reason")
        used = (body.get("usage") or {}).get("completion_tokens")
        problems = []
        if finish != "length":
            problems.append(f"finish_reason {finish!r}")
        if not isinstance(used, int) or used > 4:
            problems.append(f"usage.completion_tokens {used!r}")
        if problems:
            return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer)
        return _outcome(PASS, expected, f"finish_reason length after {used} tokens",
                        request=request, answer=answer)

    return _call(judge, expected)


@case("chat.seed", "Seed: the same request gives the same text at temperature 0",
      short="seed determinism", required=False,
      sends="the same chat request twice, temperature 0, seed 1234, max_tokens 24",
      judges="the two contents are identical")
def chat_seed(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "identical content"

    def judge() -> Outcome:
        request, one = probe.chat(max_tokens=24, seed=1234)
        _, two = probe.chat(max_tokens=24, seed=1234)
        if one.status_code != 200:
            return _not_ok(expected, request, one)
        if two.status_code != 200:
            return _not_ok(expected, request, two)
        a, b = _content(_json(one)), _content(_json(two))
        if a is None or a != b:
            return _outcome(FAIL, expected, f"{a!r} then {b!r}", brief="answers differ",
                            request=request, answer=two)
        return _outcome(PASS, expected, f"both {a[:60]!r}", request=request, answer=two)

    return _call(judge, expected)


@case("chat.logprobs", "Chat logprobs and top_logprobs",
      short="chat logprobs", required=False,
      sends="POST /v1/chat/completions with logprobs: true, top_logprobs: 2, max_tokens 8",
      judges="choices[0].logprobs.content: one entry per token, each with token, a logprob "
             "≤ 0 and 2 top_logprobs")
def chat_logprobs(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "logprobs.content entries with token, logprob ≤ 0 and 2 top_logprobs"

    def judge() -> Outcome:
        request, answer = probe.chat(max_tokens=8, logprobs=True, top_logprobs=2)
        body = _json(answer)
        if answer.status_code != 200:
            return _not_ok(expected, request, answer)
        content = ((_first_choice(body) or {}).get("logprobs") or {}).get("content")
        if not isinstance(content, list) or not content:
            return _outcome(FAIL, expected, "no logprobs.content", request=request,
                            answer=answer)
        bad = [e for e in content if not isinstance(e, dict)
               or not isinstance(e.get("token"), str)
               or not isinstance(e.get("logprob"), int | float) or e["logprob"] > 0
               or not isinstance(e.get("top_logprobs"), list) or len(e["top_logprobs"]) != 2]
        if bad:
            return _outcome(FAIL, expected, f"{len(bad)} of {len(content)} entries are not "
                            f"shaped so (first: {str(bad[0])[:120]})", request=request,
                            answer=answer, brief="logprobs misshapen")
        return _outcome(PASS, expected, f"{len(content)} entries", request=request,
                        answer=answer)

    return _call(judge, expected)


@case("completions.logprobs", "Completions logprobs",
      short="completions logprobs", required=False,
      sends="POST /v1/completions with logprobs: 2, max_tokens 8",
      judges="choices[0].logprobs has tokens, token_logprobs and top_logprobs of one length, "
             "2 alternatives per token")
def completions_logprobs(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "tokens, token_logprobs, top_logprobs (2 each) of one length"

    def judge() -> Outcome:
        request = {"model": probe.model, "prompt": PROMPT, "max_tokens": 8, "logprobs": 2,
                   "temperature": 0}
        answer = probe.post("/v1/completions", request)
        body = _json(answer)
        if answer.status_code != 200:
            return _not_ok(expected, request, answer)
        lp = (_first_choice(body) or {}).get("logprobs")
        if not isinstance(lp, dict):
            return _outcome(FAIL, expected, "no logprobs object", request=request,
                            answer=answer)
        tokens, values, tops = (lp.get("tokens"), lp.get("token_logprobs"),
                                lp.get("top_logprobs"))
        if not (isinstance(tokens, list) and isinstance(values, list)
                and isinstance(tops, list) and tokens
                and len(tokens) == len(values) == len(tops)):
            return _outcome(FAIL, expected, "tokens, token_logprobs and top_logprobs are not "
                            "lists of one length", request=request, answer=answer)
        if any(not isinstance(t, dict) or len(t) != 2 for t in tops):
            return _outcome(FAIL, expected, "top_logprobs does not give 2 alternatives per "
                            "token", request=request, answer=answer)
        return _outcome(PASS, expected, f"{len(tokens)} tokens", request=request,
                        answer=answer)

    return _call(judge, expected)


def _tool_calls_judge(probe: Probe, expected: str, tool_choice: Any,
                      want_name: str | None) -> Outcome:
    schemas = {t["function"]["name"]: t["function"]["parameters"]  # type: ignore[index]
               for t in (WEATHER_TOOL, TIME_TOOL)}
    request, answer = probe.chat(
        messages=[{"role": "user", "content": "What is the weather in Paris, and what time "
                                              "is it in Tokyo?"}],
        tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=tool_choice, max_tokens=128)
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    choice = _first_choice(body) or {}
    calls = (choice.get("message") or {}).get("tool_calls")
    if not isinstance(calls, list) or not calls:
        content = _content(body)
        got = "no tool_calls" + (f"; the content is text: {content[:100]!r}" if content else "")
        return _outcome(FAIL, expected, got, brief="no tool_calls", request=request,
                        answer=answer, finish_reason=choice.get("finish_reason"))
    problems = []
    for index, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or call.get("type") != "function" or not call.get("id"):
            problems.append(f"tool_calls[{index}] lacks id, type function or function")
            continue
        name = fn.get("name")
        if name not in schemas:
            problems.append(f"tool_calls[{index}] calls unknown function {name!r}")
            continue
        if want_name and name != want_name:
            problems.append(f"tool_calls[{index}] calls {name}, not the named {want_name}")
        try:
            arguments = json.loads(fn.get("arguments") or "")
        except (TypeError, ValueError):
            problems.append(f"{name}'s arguments are not JSON: {str(fn.get('arguments'))[:80]!r}")
            continue
        try:
            jsonschema.validate(arguments, schemas[name])
        except jsonschema.ValidationError as exc:
            problems.append(f"{name}'s arguments do not fit its parameters: {exc.message}")
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer,
                        brief=problems[0], finish_reason=choice.get("finish_reason"))
    names = ", ".join(c["function"]["name"] for c in calls)
    return _outcome(PASS, expected, f"tool_calls: {names}, arguments valid JSON per schema "
                    f"(finish_reason {choice.get('finish_reason')})", request=request,
                    answer=answer, finish_reason=choice.get("finish_reason"))


@case("tools.required", "Tools with tool_choice \"required\"",
      short="tools, tool_choice required", required=True,
      sends="two function tools (get_weather, get_time), tool_choice: \"required\"",
      judges="message.tool_calls present; each calls one of the tools with arguments that "
             "parse as JSON and validate against its parameters schema")
def tools_required(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "tool_calls with JSON arguments valid per the parameters schema"
    return _call(lambda: _tool_calls_judge(probe, expected, "required", None), expected)


@case("tools.named", "Tools with a named function in tool_choice",
      short="tools, named function", required=True,
      sends="the same tools, tool_choice: {type: function, function: {name: get_time}}",
      judges="message.tool_calls call get_time, with arguments valid against its schema")
def tools_named(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "a get_time tool call with arguments valid per its schema"
    return _call(lambda: _tool_calls_judge(
        probe, expected, {"type": "function", "function": {"name": "get_time"}}, "get_time"),
        expected)


def _json_content_judge(probe: Probe, expected: str, response_format: dict[str, Any],
                        schema: dict[str, Any] | None) -> Outcome:
    request, answer = probe.chat(
        messages=[{"role": "user", "content": "Describe Lyon as JSON with city, country "
                                              "and population."}],
        response_format=response_format, max_tokens=200)
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    content = _content(body)
    try:
        parsed = json.loads(content or "")
    except ValueError:
        return _outcome(FAIL, expected, f"the content is not JSON: {(content or '')[:100]!r}",
                        brief="content is not JSON", request=request, answer=answer)
    if not isinstance(parsed, dict):
        return _outcome(FAIL, expected, f"the content is JSON but not an object: "
                        f"{type(parsed).__name__}", request=request, answer=answer)
    if schema is not None:
        try:
            jsonschema.validate(parsed, schema)
        except jsonschema.ValidationError as exc:
            return _outcome(FAIL, expected, f"does not fit the schema: {exc.message}",
                            brief="content does not fit the schema", request=request,
                            answer=answer)
    return _outcome(PASS, expected, f"a JSON object with {', '.join(sorted(parsed)) or 'no keys'}",
                    request=request, answer=answer)


@case("response_format.json_object", "response_format json_object",
      short="json_object", required=False,
      sends="response_format: {type: json_object}",
      judges="the content parses as a JSON object")
def json_object(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "content that parses as a JSON object"
    return _call(lambda: _json_content_judge(probe, expected, {"type": "json_object"}, None),
                 expected)


@case("response_format.json_schema", "response_format json_schema",
      short="json_schema", required=False,
      sends="response_format: {type: json_schema, json_schema: {name: city, schema: …, "
            "strict: true}}",
      judges="the content parses as JSON and validates against the schema")
def json_schema(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "content valid against the given JSON schema"
    fmt = {"type": "json_schema",
           "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}
    return _call(lambda: _json_content_judge(probe, expected, fmt, CITY_SCHEMA), expected)


def _error_object_problem(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "no {\"error\": {…}} object"
    if not isinstance(error.get("message"), str) or not error["message"]:
        return "the error has no message"
    if "type" not in error:
        return "the error has no type"
    return ""


@case("errors.malformed", "A malformed body answers 400 with an error object",
      short="400 on a malformed body", required=True,
      sends="POST /v1/chat/completions with a body that is not valid JSON",
      judges="400 and an OpenAI error object (error.message, error.type)")
def errors_malformed(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "400 with an error object"

    def judge() -> Outcome:
        raw = b'{"model": "' + probe.model.encode() + b'", "messages": ['
        answer = probe.post("/v1/chat/completions", content=raw)
        body = _json(answer)
        problems = []
        if answer.status_code != 400:
            problems.append(f"HTTP {answer.status_code}")
        if problem := _error_object_problem(body):
            problems.append(problem)
        request = raw.decode()
        if problems:
            return _outcome(FAIL, expected, "; ".join(problems), request=request,
                            answer=answer)
        return _outcome(PASS, expected, f"400: {body['error']['message'][:100]}",
                        request=request, answer=answer)

    return _call(judge, expected)


@case("errors.unknown_model", "An unknown model answers 404",
      short="404 on an unknown model", required=True,
      sends=f"a chat request for model {UNKNOWN_MODEL}",
      judges="404 and an OpenAI error object (code model_not_found noted)")
def errors_unknown_model(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "404 with an error object"

    def judge() -> Outcome:
        request = {"model": UNKNOWN_MODEL, "messages": MESSAGES, "max_tokens": 4}
        answer = probe.post("/v1/chat/completions", request)
        body = _json(answer)
        problems = []
        if answer.status_code != 404:
            problems.append(f"HTTP {answer.status_code}")
        if problem := _error_object_problem(body):
            problems.append(problem)
        if problems:
            return _outcome(FAIL, expected, "; ".join(problems), request=request,
                            answer=answer)
        code = body["error"].get("code")
        return _outcome(PASS, expected, f"404, code {code}", request=request, answer=answer,
                        code=code)

    return _call(judge, expected)


@case("errors.context_length", "A prompt over the context answers context_length_exceeded",
      short="context_length_exceeded", required=True,
      sends="a user message of more words than the model's context (max_model_len from "
            "/v1/models, else the pool registry's max context) + 64",
      judges="400 with error.code context_length_exceeded")
def errors_context_length(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "400, error.code context_length_exceeded"

    def judge() -> Outcome:
        limit, source = probe.max_context()
        if limit is None:
            return _outcome(SKIP, expected, "the model's context is unknown (no max_model_len "
                            "and no registry entry)")
        words = limit + 64
        request = {"model": probe.model, "max_tokens": 16,
                   "messages": [{"role": "user", "content": "word " * words}]}
        answer = probe.post("/v1/chat/completions", request)
        body = _json(answer)
        shown = {**request, "messages": [{"role": "user",
                                          "content": f"word × {words} ({source}: {limit})"}]}
        code = ((body or {}).get("error") or {}).get("code") if isinstance(body, dict) else None
        if answer.status_code != 400 or code != "context_length_exceeded":
            return _outcome(FAIL, expected, f"HTTP {answer.status_code}, code {code!r}",
                            request=shown, answer=answer, max_context=limit,
                            max_context_source=source)
        return _outcome(PASS, expected, f"400 context_length_exceeded for {words} words "
                        f"({source}: {limit})", request=shown, answer=answer,
                        max_context=limit, max_context_source=source)

    return _call(judge, expected)


def _retry_after_ok(value: str) -> bool:
    try:
        return float(value) >= 0
    except ValueError:
        pass
    try:
        parsedate_to_datetime(value)
        return True
    except (TypeError, ValueError):
        return False


async def _flood(probe: Probe) -> tuple[OutboundResponse | None, int, int]:
    """Waves of concurrent streams until one answers 429: (that answer, sent, errors)."""
    request = {"model": probe.model, "messages": MESSAGES, "max_tokens": 32,
               "temperature": 0}
    sent = errors = 0
    async with AsyncClient(base_url=probe.base_url, timeout_s=probe.timeout_s,
                           max_connections=SATURATION_REQUESTS) as client:
        for _ in range(SATURATION_WAVES):
            wave = [asyncio.ensure_future(client.post("/v1/chat/completions", json=request))
                    for _ in range(SATURATION_REQUESTS)]
            sent += len(wave)
            try:
                for next_done in asyncio.as_completed(wave):
                    try:
                        result = await next_done
                    except OutboundError:
                        errors += 1
                        continue
                    if result.status_code == 429:
                        return result, sent, errors
            finally:  # the first 429 is the answer: the rest of the wave is not needed
                for task in wave:
                    task.cancel()
                await asyncio.gather(*wave, return_exceptions=True)
    return None, sent, errors


@case("errors.rate_limit", "Saturation answers 429 with Retry-After",
      short="429 with Retry-After", required=False,
      opt_in=True,
      sends=f"up to {SATURATION_WAVES} waves of {SATURATION_REQUESTS} concurrent chat "
            f"requests (floods the pool: only when the run asks for it)",
      judges="some request answers 429 with a Retry-After header (seconds or an HTTP date) "
             "and an error object")
def errors_rate_limit(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "a 429 with Retry-After under saturation"

    def judge() -> Outcome:
        answer, sent, errors = asyncio.run(_flood(probe))
        request = f"{sent} concurrent chat requests"
        if answer is None:
            return _outcome(FAIL, expected, f"no 429 after {sent} concurrent requests "
                            f"({errors} without an answer)", brief="no 429 under saturation",
                            request=request, sent=sent)
        retry = {k.lower(): v for k, v in answer.headers.items()}.get("retry-after")
        problems = []
        if retry is None:
            problems.append("429 without Retry-After")
        elif not _retry_after_ok(retry):
            problems.append(f"Retry-After {retry!r} is neither seconds nor a date")
        if problem := _error_object_problem(_json(answer)):
            problems.append(problem)
        if problems:
            return _outcome(FAIL, expected, "; ".join(problems), request=request,
                            answer=answer, sent=sent)
        return _outcome(PASS, expected, f"429 with Retry-After {retry} after {sent} requests",
                        request=request, answer=answer, sent=sent, retry_after=retry)

    return _call(judge, expected)


@case("parity.prompt_tokens", "Prompt-token parity with the reference",
      short="prompt-token parity", required=True,
      parity=True,
      sends=f"{len(PARITY_MESSAGES)} message sets (one turn, system + user, multi-turn) to "
            f"both pools, max_tokens 1",
      judges="usage.prompt_tokens is the same on both for every set (same tokenizer and "
             "chat template)")
def parity_prompt_tokens(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "the same usage.prompt_tokens as the reference"
    if ref is None:
        return _outcome(SKIP, expected, "no reference pool (name a plan or --primary)")

    def judge() -> Outcome:
        mine, theirs, diffs, problems = [], [], [], []
        for index in range(len(PARITY_MESSAGES)):
            a, why_a = probe.prompt_tokens(index)
            b, why_b = ref.prompt_tokens(index)
            mine.append(a)
            theirs.append(b)
            if a is None:
                problems.append(f"set {index + 1}: {why_a}")
            elif b is None:
                problems.append(f"set {index + 1} on {ref.pool_name}: {why_b}")
            elif a != b:
                diffs.append(a - b)
        numbers: dict[str, Any] = {"pool": mine, "reference": theirs,
                                   "reference_pool": ref.pool_name}
        request = {"messages": PARITY_MESSAGES, "max_tokens": 1}
        response = f"{probe.pool_name}: {mine}; {ref.pool_name}: {theirs}"
        if problems:
            out = _outcome(ERROR, expected, "; ".join(problems), request=request, **numbers)
        elif diffs:
            worst = max(diffs, key=abs)
            out = _outcome(FAIL, expected, f"prompt tokens {mine} vs {theirs} on "
                           f"{ref.pool_name}", brief=f"{worst:+d} tokens vs {ref.pool_name}",
                           request=request, **numbers)
        else:
            out = _outcome(PASS, expected, f"{mine} on both", request=request, **numbers)
        out.response = response
        return out

    return _call(judge, expected)


@case("parity.max_context", "Max-context parity with the reference",
      short="max-context parity", required=False,
      parity=True,
      sends="GET /v1/models on both pools",
      judges="the same context window: max_model_len from /v1/models where reported, else "
             "the pool registry's max context for the model (the row says which)")
def parity_max_context(probe: Probe, ref: Probe | None) -> Outcome:
    expected = "the same max context as the reference"
    if ref is None:
        return _outcome(SKIP, expected, "no reference pool (name a plan or --primary)")

    def judge() -> Outcome:
        a, source_a = probe.max_context()
        b, source_b = ref.max_context()
        numbers: dict[str, Any] = {"pool": a, "pool_source": source_a, "reference": b,
                   "reference_source": source_b, "reference_pool": ref.pool_name}
        if a is None or b is None:
            return _outcome(SKIP, expected, "a context window is unknown", **numbers)
        if a != b:
            return _outcome(FAIL, expected, f"{a} ({source_a}) vs {b} on {ref.pool_name} "
                            f"({source_b})", brief=f"{a} vs {b} tokens on {ref.pool_name}",
                            **numbers)
        return _outcome(PASS, expected, f"{a} on both ({source_a})", **numbers)

    return _call(judge, expected)


REQUIRED_BY_DEFAULT = frozenset(c.key for c in CASES if c.required)
