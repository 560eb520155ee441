"""The rest of the OpenAI contract — tools, tool_choice, response_format, error shapes, the
model card — driven by the official `openai` client against a real simulator process, and
the profile switches that each break exactly one part of it."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)
from pydantic import BaseModel

from fleetctl.sim.textgen import (
    OTHER_TOKEN_RE,
    TOKEN_RE,
    render_chat,
    render_chat_other,
)

from .simproc import MODEL, SimProcess, client

pytestmark = pytest.mark.slow

WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2, "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "hourly": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                         "maxItems": 3},
                "where": {"type": "object", "properties": {
                    "lat": {"type": "number", "minimum": -90, "maximum": 90},
                    "lon": {"type": "number", "exclusiveMinimum": -180, "maximum": 180},
                }, "required": ["lat", "lon"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK: ChatCompletionToolParam = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}},
}
TOOLS = [WEATHER, CLOCK]
ASKS_WEATHER: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Please call get_weather for Lisbon."}
]
ASKS_NOTHING: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me a story about rivers."}
]
ITEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "genre": {"enum": ["fiction", "poetry", "history"]},
        "authors": {"type": "array", "items": {"$ref": "#/$defs/person"}, "minItems": 1},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "price": {"type": ["number", "null"], "minimum": 0},
    },
    "required": ["title", "rating", "genre", "authors", "note", "price"],
    "additionalProperties": False,
    "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string"}},
                         "required": ["name"], "additionalProperties": False}},
}


def first_call(reply: ChatCompletion) -> ChatCompletionMessageFunctionToolCall:
    calls = reply.choices[0].message.tool_calls or []
    assert len(calls) == 1, calls
    assert isinstance(calls[0], ChatCompletionMessageFunctionToolCall)
    return calls[0]


def params(tool: ChatCompletionToolParam) -> dict[str, Any]:
    return dict(tool["function"].get("parameters") or {})


def post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/{path}", json=body, timeout=30)


# ---- tools and tool_choice --------------------------------------------------------------


@pytest.mark.parametrize("choice", ["required", "auto", "named"])
def test_a_tool_call_has_the_openai_shape_and_schema_valid_arguments(
    fleet: SimProcess, choice: str
) -> None:
    tool_choice: Any = choice if choice != "named" else {
        "type": "function", "function": {"name": "get_weather"}}
    reply = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=ASKS_WEATHER, tools=TOOLS, tool_choice=tool_choice,
    )
    choice_ = reply.choices[0]
    assert choice_.finish_reason == "tool_calls"
    assert choice_.message.content is None
    call = first_call(reply)
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments, str)
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, params(WEATHER))
    assert reply.usage is not None
    assert reply.usage.completion_tokens == len(TOKEN_RE.findall(call.function.arguments))


def test_a_named_tool_choice_calls_that_function_whatever_the_message_says(
    fleet: SimProcess,
) -> None:
    reply = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=ASKS_WEATHER, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    call = first_call(reply)
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), params(CLOCK))


def test_required_calls_the_first_tool_when_the_message_names_none(fleet: SimProcess) -> None:
    reply = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=ASKS_NOTHING, tools=TOOLS, tool_choice="required",
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert first_call(reply).function.name == "get_weather"


@pytest.mark.parametrize(("messages", "choice"), [
    (ASKS_NOTHING, "auto"),      # auto: the last user message names no tool
    (ASKS_WEATHER, "none"),      # none: never a tool call
])
def test_auto_without_a_named_tool_and_none_answer_text(
    fleet: SimProcess, messages: list[ChatCompletionMessageParam], choice: Any
) -> None:
    reply = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice=choice, max_tokens=10,
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"


def test_tool_choice_none_without_tools_is_accepted_as_vllm_does(fleet: SimProcess) -> None:
    response = post(fleet.url("ref"), "chat/completions", chat(tool_choice="none", max_tokens=2))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


def test_a_tool_result_turn_is_accepted_and_answered_with_text(fleet: SimProcess) -> None:
    api = client(fleet.url("ref"))
    first = api.chat.completions.create(model=MODEL, messages=ASKS_WEATHER, tools=TOOLS)
    call = first_call(first)
    history: list[ChatCompletionMessageParam] = [
        *ASKS_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call.id, "type": "function",
            "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    reply = api.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                        max_tokens=8)
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


def test_a_streamed_tool_call_comes_in_deltas_the_sdk_reassembles(fleet: SimProcess) -> None:
    api = client(fleet.url("ref"))
    full = api.chat.completions.create(model=MODEL, messages=ASKS_WEATHER, tools=TOOLS,
                                       tool_choice="required")
    expected = first_call(full).function.arguments
    chunks = list(api.chat.completions.create(
        model=MODEL, messages=ASKS_WEATHER, tools=TOOLS, tool_choice="required", stream=True,
        stream_options={"include_usage": True},
    ))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    head = (deltas[0].tool_calls or [])[0]
    assert deltas[0].role == "assistant"
    assert head.index == 0 and head.id and head.id.startswith("call_")
    assert head.type == "function" and head.function and head.function.name == "get_weather"
    pieces = [d.tool_calls[0].function.arguments for d in deltas[1:]
              if d.tool_calls and d.tool_calls[0].function]
    assert all((d.tool_calls or [])[0].index == 0 for d in deltas if d.tool_calls)
    assert len(pieces) > 5  # split across chunks, one token each
    assert "".join(p or "" for p in pieces) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(TOKEN_RE.findall(expected))

    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    final = state.get_final_completion()
    call = first_call(final)
    assert (call.function.name, call.function.arguments) == ("get_weather", expected)
    assert final.choices[0].finish_reason == "tool_calls"


def test_the_sdk_stream_helper_parses_a_strict_tool_call(fleet: SimProcess) -> None:
    class Lookup(BaseModel):
        city: str
        unit: Literal["celsius", "fahrenheit"]
        days: int

    with client(fleet.url("ref")).chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": "use Lookup please"}],
        tools=[openai.pydantic_function_tool(Lookup)], tool_choice="required",
    ) as stream:
        final = stream.get_final_completion()
    call = (final.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "Lookup"
    assert isinstance(call.function.parsed_arguments, Lookup)


def test_max_tokens_cuts_a_tool_call_short_with_length(fleet: SimProcess) -> None:
    reply = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=ASKS_WEATHER, tools=TOOLS, tool_choice="required", max_tokens=4,
    )
    assert reply.choices[0].finish_reason == "length"
    arguments = first_call(reply).function.arguments
    assert len(TOKEN_RE.findall(arguments)) == 4
    with pytest.raises(ValueError):
        json.loads(arguments)


# ---- response_format --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_json_object_answers_a_json_object(fleet: SimProcess, stream: bool) -> None:
    text = answer(fleet.url("ref"), ASKS_NOTHING, stream=stream,
                  response_format={"type": "json_object"})
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_answers_validate_against_the_schema(fleet: SimProcess, stream: bool) -> None:
    fmt = {"type": "json_schema",
           "json_schema": {"name": "book", "schema": ITEM_SCHEMA, "strict": True}}
    for i in range(5):
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": f"Describe book {i}."}]
        value = json.loads(answer(fleet.url("ref"), messages, stream=stream,
                                  response_format=fmt))
        jsonschema.validate(value, ITEM_SCHEMA)


def test_the_sdk_parses_a_pydantic_structured_output(fleet: SimProcess) -> None:
    class Person(BaseModel):
        name: str
        age: int

    class Team(BaseModel):
        title: str
        members: list[Person]
        level: Literal["junior", "senior"]

    completion = client(fleet.url("ref")).chat.completions.parse(
        model=MODEL, messages=ASKS_NOTHING, response_format=Team,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Team) and parsed.members


def test_max_tokens_cuts_json_short_with_length(fleet: SimProcess) -> None:
    reply = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=ASKS_NOTHING, response_format={"type": "json_object"},
        max_tokens=3,
    )
    assert reply.choices[0].finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(reply.choices[0].message.content or "")


def answer(url: str, messages: list[ChatCompletionMessageParam], *, stream: bool = False,
           **kwargs: Any) -> str:
    api = client(url)
    if not stream:
        reply = api.chat.completions.create(model=MODEL, messages=messages, **kwargs)
        assert reply.choices[0].finish_reason in ("stop", "length")
        return reply.choices[0].message.content or ""
    chunks = list(api.chat.completions.create(model=MODEL, messages=messages, stream=True,
                                              **kwargs))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# ---- bad requests -----------------------------------------------------------------------

def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": ASKS_WEATHER, **fields}


BAD = [
    ("tools-not-a-list", chat(tools={"type": "function"}), "tools"),
    ("tools-empty", chat(tools=[]), "tools"),
    ("tool-not-an-object", chat(tools=["get_weather"]), "tools[0]"),
    ("tool-wrong-type", chat(tools=[{"type": "retrieval"}]), "tools[0].type"),
    ("tool-without-function", chat(tools=[{"type": "function"}]), "tools[0].function"),
    ("tool-bad-name", chat(tools=[{"type": "function", "function": {"name": "get weather"}}]),
     "tools[0].function.name"),
    ("tool-parameters-not-object",
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
     "tools[0].function.parameters"),
    ("tool-parameters-array-schema",
     chat(tools=[{"type": "function", "function": {"name": "f",
                                                    "parameters": {"type": "array"}}}]),
     "tools[0].function.parameters"),
    ("tool-names-twice", chat(tools=[WEATHER, WEATHER]), "tools"),
    ("tool-choice-unknown-function",
     chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice"),
    ("tool-choice-bad-string", chat(tools=TOOLS, tool_choice="always"), "tool_choice"),
    ("tool-choice-bad-object", chat(tools=TOOLS, tool_choice={"type": "function"}),
     "tool_choice"),
    ("tool-choice-without-tools", chat(tool_choice="required"), "tool_choice"),
    ("named-tool-choice-without-tools",
     chat(tool_choice={"type": "function", "function": {"name": "get_weather"}}),
     "tool_choice"),
    ("response-format-unknown", chat(response_format={"type": "xml"}), "response_format"),
    ("response-format-string", chat(response_format="json"), "response_format"),
    ("json-schema-missing", chat(response_format={"type": "json_schema"}),
     "response_format.json_schema"),
    ("json-schema-no-name",
     chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
     "response_format.json_schema.name"),
    ("json-schema-not-object",
     chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}),
     "response_format.json_schema.schema"),
    ("messages-tool-calls-not-list",
     chat(messages=[{"role": "assistant", "content": None, "tool_calls": "x"}]),
     "messages[0].tool_calls"),
]


@pytest.mark.parametrize(("body", "param"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_tools_and_formats_are_400_error_objects_naming_the_field(
    fleet: SimProcess, body: dict[str, Any], param: str
) -> None:
    response = post(fleet.url("ref"), "chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param.split("[")[0].split(".")[0] in error["message"]


@pytest.mark.parametrize(("fields", "param"), [
    ('"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": '
     '"object", "properties": {"n": {"type": "integer", "minimum": Infinity}}}}}], '
     '"tool_choice": "required"', "tools[0].function.parameters"),
    ('"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": '
     '{"type": "integer", "maximum": -Infinity}}}', "response_format.json_schema.schema"),
])
def test_a_schema_no_value_can_satisfy_is_a_400_not_a_crash(
    fleet: SimProcess, fields: str, param: str
) -> None:
    raw = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "x"}}], {fields}}}'
    response = httpx.post(f"{fleet.url('ref')}/v1/chat/completions", content=raw.encode(),
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert "no value can be produced for this schema" in error["message"]


def test_a_malformed_body_is_a_400_the_sdk_reads(fleet: SimProcess) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(fleet.url("ref")).chat.completions.create(
            model=MODEL, messages=ASKS_WEATHER, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert caught.value.status_code == 400
    assert "no function named 'nope'" in caught.value.message


def test_a_full_queue_answers_429_with_retry_after(fleet: SimProcess) -> None:
    url = fleet.url("small")  # 1 running, 1 waiting at most

    async def one(api: httpx.AsyncClient, i: int) -> httpx.Response:
        return await api.post(f"{url}/v1/completions", json={
            "model": MODEL, "prompt": f"retry after {i}", "max_tokens": 50,
            "ignore_eos": True})

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as api:
            return list(await asyncio.gather(*(one(api, i) for i in range(6))))

    refused = [r for r in asyncio.run(burst()) if r.status_code == 429]
    assert len(refused) >= 3
    for response in refused:
        # 50 tokens of 20 ms for the one running answer: about a second
        assert 1 <= int(response.headers["Retry-After"]) <= 2
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")


def test_models_carry_the_max_context_as_max_model_len(fleet: SimProcess) -> None:
    body = httpx.get(f"{fleet.url('ref')}/v1/models").json()
    assert body["object"] == "list"
    for card in body["data"]:
        assert card["object"] == "model" and card["owned_by"]
        assert card["max_model_len"] == 4096  # the test profile's max_context
    card = httpx.get(f"{fleet.url('ref')}/v1/models/{MODEL}").json()
    assert (card["id"], card["max_model_len"]) == (MODEL, 4096)


# ---- determinism and logprobs -----------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_the_same_request_at_temperature_0_repeats_text_and_tokens(
    fleet: SimProcess, endpoint: str
) -> None:
    def ask(url: str) -> tuple[str, list[str], list[float]]:
        if endpoint == "chat":
            reply = client(url).chat.completions.create(
                model=MODEL, messages=ASKS_NOTHING, max_tokens=30, temperature=0, seed=11,
                logprobs=True, top_logprobs=2)
            content = reply.choices[0].logprobs.content or []  # type: ignore[union-attr]
            return (reply.choices[0].message.content or "", [e.token for e in content],
                    [e.logprob for e in content])
        done = client(url).completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=30, temperature=0, seed=11,
            logprobs=2)
        lp = done.choices[0].logprobs
        assert lp is not None
        return done.choices[0].text, list(lp.tokens or []), list(lp.token_logprobs or [])

    first = ask(fleet.url("ref"))
    assert ask(fleet.url("ref")) == first
    assert ask(fleet.url("twin")) == first  # another pool (and profile) that does not diverge
    assert "".join(first[1]) == first[0] and len(first[1]) == 30


def test_streamed_completions_logprobs_come_one_token_per_chunk(fleet: SimProcess) -> None:
    api = client(fleet.url("ref"))
    full = api.completions.create(model=MODEL, prompt="stream my logprobs", max_tokens=6,
                                  logprobs=3)
    chunks = list(api.completions.create(model=MODEL, prompt="stream my logprobs",
                                         max_tokens=6, logprobs=3, stream=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
    assert [len(lp.tokens or []) for lp in streamed] == [1] * 6
    assert [t for lp in streamed for t in lp.tokens or []] == full.choices[0].logprobs.tokens  # type: ignore[union-attr]
    assert all(len((lp.top_logprobs or [{}])[0]) == 3 for lp in streamed)


# ---- switches: each breaks exactly its part ---------------------------------------------

CHECKS = ("tools", "json", "stream_usage", "logprobs", "tokenizer")


def contract_failures(url: str, ref_url: str) -> set[str]:
    """A small conformance run: which parts of the contract this pool does not honour."""
    api = client(url)
    failed = set()
    reply = api.chat.completions.create(model=MODEL, messages=ASKS_WEATHER, tools=TOOLS,
                                        tool_choice="required", max_tokens=200)
    calls = reply.choices[0].message.tool_calls
    if reply.choices[0].finish_reason != "tool_calls" or not calls:
        failed.add("tools")
    try:
        if not isinstance(json.loads(answer(url, ASKS_NOTHING, max_tokens=200,
                                            response_format={"type": "json_object"})), dict):
            failed.add("json")
    except ValueError:
        failed.add("json")
    chunks = list(api.chat.completions.create(
        model=MODEL, messages=ASKS_NOTHING, max_tokens=5, stream=True,
        stream_options={"include_usage": True}))
    if chunks[-1].usage is None or chunks[-1].usage.completion_tokens != 5:
        failed.add("stream_usage")
    lp = api.chat.completions.create(model=MODEL, messages=ASKS_NOTHING, max_tokens=3,
                                     logprobs=True, top_logprobs=2).choices[0].logprobs
    done = api.completions.create(model=MODEL, prompt="lp", max_tokens=3, logprobs=2)
    if lp is None or not lp.content or done.choices[0].logprobs is None:
        failed.add("logprobs")
    usage = [client(u).chat.completions.create(model=MODEL, messages=ASKS_NOTHING,
                                               max_tokens=1).usage for u in (url, ref_url)]
    if usage[0] is None or usage[1] is None or usage[0].prompt_tokens != usage[1].prompt_tokens:
        failed.add("tokenizer")
    return failed


@pytest.mark.parametrize(("pool", "broken"), [
    ("ref", set()),
    ("notools", {"tools"}),
    ("nojson", {"json"}),
    ("nousage", {"stream_usage"}),
    ("nologprobs", {"logprobs"}),
    ("othertok", {"tokenizer"}),
])
def test_each_switch_breaks_exactly_its_part_of_the_contract(
    fleet: SimProcess, pool: str, broken: set[str]
) -> None:
    assert contract_failures(fleet.url(pool), fleet.url("ref")) == broken


def test_without_tool_parsing_tools_are_ignored_even_a_named_choice(fleet: SimProcess) -> None:
    url = fleet.url("notools")
    plain = answer(fleet.url("ref"), ASKS_WEATHER, max_tokens=12)
    choices: list[Any] = ["required", "auto",
                          {"type": "function", "function": {"name": "not_in_tools"}}]
    for choice in choices:
        reply = client(url).chat.completions.create(
            model=MODEL, messages=ASKS_WEATHER, tools=TOOLS, tool_choice=choice, max_tokens=12)
        assert reply.choices[0].message.tool_calls is None
        assert reply.choices[0].finish_reason == "length"
        assert reply.choices[0].message.content == plain
    bad = post(url, "chat/completions", chat(tools="whatever"))
    assert bad.status_code == 200  # not parsed at all


def test_without_json_mode_response_format_is_ignored(fleet: SimProcess) -> None:
    plain = answer(fleet.url("ref"), ASKS_NOTHING, max_tokens=15)
    fmt = {"type": "json_schema", "json_schema": {"name": "book", "schema": ITEM_SCHEMA}}
    assert answer(fleet.url("nojson"), ASKS_NOTHING, max_tokens=15,
                  response_format={"type": "json_object"}) == plain
    assert answer(fleet.url("nojson"), ASKS_NOTHING, max_tokens=15,
                  response_format=fmt) == plain


def test_without_stream_usage_no_usage_chunk_is_sent(fleet: SimProcess) -> None:
    api = client(fleet.url("nousage"))
    chunks = list(api.chat.completions.create(
        model=MODEL, messages=ASKS_NOTHING, max_tokens=5, stream=True,
        stream_options={"include_usage": True}))
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks)
    reply = api.chat.completions.create(model=MODEL, messages=ASKS_NOTHING, max_tokens=5)
    assert reply.usage is not None and reply.usage.completion_tokens == 5  # still there


def test_without_logprobs_answers_carry_none(fleet: SimProcess) -> None:
    api = client(fleet.url("nologprobs"))
    reply = api.chat.completions.create(model=MODEL, messages=ASKS_NOTHING, max_tokens=4,
                                        logprobs=True, top_logprobs=3)
    assert reply.choices[0].logprobs is None
    chunks = list(api.chat.completions.create(model=MODEL, messages=ASKS_NOTHING,
                                              max_tokens=4, logprobs=True, stream=True))
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)
    done = api.completions.create(model=MODEL, prompt="x", max_tokens=4, logprobs=2)
    assert done.choices[0].logprobs is None


def test_another_tokenizer_counts_the_prompt_differently_but_answers_the_same(
    fleet: SimProcess,
) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Answer carefully."},
        {"role": "user", "content": "Summarise the harbour regulations, please."},
    ]
    pairs = [(str(m["role"]), str(m["content"])) for m in messages]
    replies = {pool: client(fleet.url(pool)).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=20) for pool in ("ref", "othertok")}
    ref, other = replies["ref"].usage, replies["othertok"].usage
    assert ref is not None and other is not None
    assert ref.prompt_tokens == len(TOKEN_RE.findall(render_chat(pairs))) + 1
    assert other.prompt_tokens == len(OTHER_TOKEN_RE.findall(render_chat_other(pairs))) + 1
    assert other.prompt_tokens != ref.prompt_tokens
    text = replies["othertok"].choices[0].message.content or ""
    assert text == replies["ref"].choices[0].message.content
    assert other.completion_tokens == len(TOKEN_RE.findall(text)) == 20
    done = {pool: client(fleet.url(pool)).completions.create(
        model=MODEL, prompt="Internationalisation everywhere", max_tokens=2)
        for pool in ("ref", "othertok")}
    assert done["ref"].usage.prompt_tokens == 3  # type: ignore[union-attr]
    assert done["othertok"].usage.prompt_tokens == 1 + 5 + 3  # type: ignore[union-attr]


def test_a100_legacy_and_command_line_switches_serve_as_documented(start_sim: Any) -> None:
    sim = start_sim("--pool", "legacy=a100-legacy@0", "--pool", "plain=a100@0",
                    "--pool", "cut=a100:stream_usage=false,logprobs=false@0", pools=3)
    banners = "\n".join(sim.banners)
    assert "sim pool legacy (simulated A100-class on an older serving stack: no tool parsing, " \
           "another tokenizer) on http://" in banners
    assert "(simulated A100-class [stream_usage=false, logprobs=false]) on http://" in banners
    profile = httpx.get(f"{sim.url('cut')}/admin/state").json()["profile"]
    assert (profile["stream_usage"], profile["logprobs"], profile["tool_calls"]) == (
        False, False, True)
    legacy = contract_failures(sim.url("legacy"), sim.url("plain"))
    assert legacy == {"tools", "tokenizer"}
    assert contract_failures(sim.url("cut"), sim.url("plain")) == {"stream_usage", "logprobs"}
    assert sim.stop() == 0


def test_ground_truth_records_what_the_client_was_told(start_sim: Any) -> None:
    sim = start_sim("--pool", "h200@0", "--record-ground-truth")
    url = sim.url("h200")
    call = client(url).chat.completions.create(model=MODEL, messages=ASKS_WEATHER, tools=TOOLS)
    text = client(url).chat.completions.create(model=MODEL, messages=ASKS_WEATHER, tools=TOOLS,
                                               tool_choice="none", max_tokens=3)
    records = httpx.get(f"{url}/admin/ground-truth", params={"kind": "requests"}).json()
    by_id = {r["response_id"]: r for r in records["requests"]}
    assert by_id[call.id]["finish_reason"] == "tool_calls"
    assert by_id[call.id]["completion_tokens"] == call.usage.completion_tokens  # type: ignore[union-attr]
    assert by_id[text.id]["finish_reason"] == "length"
    # the vLLM-style metric counts the tool call as a natural stop, as vLLM's engine does
    metrics = httpx.get(f"{url}/metrics").text
    assert 'finished_reason="stop"' in metrics
    assert sim.stop() == 0
