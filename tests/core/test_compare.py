"""The comparison module: answers built from OpenAI bodies and streams, every field of a
comparison both ways on hand-built answers, and real simulator pools compared as a shadow
run compares them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from fleetctl.inference.compare import (
    NEAR_TIE_NATS,
    Answer,
    ToolCall,
    Usage,
    compare,
    is_refusal,
    tokenize,
)

# -- building answers -------------------------------------------------------------------


def entry(token: str, logprob: float, top: list[tuple[str, float]] | None = None) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}
                             for t, lp in (top if top is not None else [(token, logprob)])]}


def chat_body(tokens: list[str], *, finish: str = "stop", logprobs: list[dict] | None = None,
              tool_calls: list[dict] | None = None, refusal: str | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(tokens),
                               "refusal": refusal}
    if tool_calls is not None:
        message["content"] = None
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish,
                     "logprobs": None if logprobs is None else {"content": logprobs}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": len(tokens),
                  "total_tokens": 7 + len(tokens)},
    }


def chat_chunks(tokens: list[str], *, finish: str = "stop",
                logprobs: list[dict] | None = None) -> list[dict]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m"}
    out = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}], "usage": None}]
    for i, token in enumerate(tokens):
        lp = None if logprobs is None else {"content": [logprobs[i]]}
        out.append({**head, "choices": [{"index": 0, "delta": {"content": token},
                                         "logprobs": lp, "finish_reason": None}],
                    "usage": None})
    out.append({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                     "finish_reason": finish}], "usage": None})
    out.append({**head, "choices": [], "usage": {"prompt_tokens": 7,
                                                 "completion_tokens": len(tokens),
                                                 "total_tokens": 7 + len(tokens)}})
    return out


def answer(text: str, **kwargs: Any) -> Answer:
    return Answer.from_text(text, **kwargs)


def with_logprobs(tokens: list[str], tops: dict[int, list[tuple[str, float]]] | None = None,
                  chosen: dict[int, float] | None = None) -> Answer:
    tops, chosen = tops or {}, chosen or {}
    entries = [entry(t, chosen.get(i, -0.01), tops.get(i)) for i, t in enumerate(tokens)]
    return Answer.from_body(chat_body(tokens, logprobs=entries))


TOKENS = ["Hello", ",", " world", ".", " How", " are", " you", "?"]


def test_a_chat_body_with_logprobs_gives_the_servers_tokens_and_alternatives() -> None:
    entries = [entry(t, -0.5, [(t, -0.5), ("x", -2.0)]) for t in TOKENS]
    a = Answer.from_body(chat_body(TOKENS, logprobs=entries), ttft_s=0.12, tpot_s=0.01)
    assert a.text == "Hello, world. How are you?"
    assert a.tokens == tuple(TOKENS) and a.tokens_from_logprobs
    assert a.logprobs == (-0.5,) * len(TOKENS)
    assert a.top_logprobs is not None and a.top_logprobs[2] == {" world": -0.5, "x": -2.0}
    assert a.finish_reason == "stop" and a.status == 200 and not a.failed
    assert a.usage == Usage(7, 8, 15)
    assert (a.ttft_s, a.tpot_s) == (0.12, 0.01)
    assert a.tool_calls == () and a.refusal is None


def test_without_logprobs_the_text_is_split_into_words_and_punctuation() -> None:
    a = Answer.from_body(chat_body(TOKENS))
    assert not a.tokens_from_logprobs and a.logprobs is None and a.top_logprobs is None
    assert a.tokens == ("Hello", ",", "world", ".", "How", "are", "you", "?")
    assert tokenize("  a_b  12.5\n{\"k\": 1}") == ("a_b", "12", ".", "5", "{", '"', "k", '"',
                                                   ":", "1", "}")


def test_a_completions_body_and_its_logprobs_shape() -> None:
    body = {"object": "text_completion", "choices": [{
        "index": 0, "text": " one two", "finish_reason": "length",
        "logprobs": {"tokens": [" one", " two"], "token_logprobs": [-0.1, -0.2],
                     "top_logprobs": [{" one": -0.1}, {" two": -0.2, " three": -0.25}],
                     "text_offset": [0, 4]}}]}
    a = Answer.from_body(body)
    assert a.text == " one two" and a.tokens == (" one", " two") and a.tokens_from_logprobs
    assert a.logprobs == (-0.1, -0.2)
    assert a.top_logprobs == ({" one": -0.1}, {" two": -0.2, " three": -0.25})
    assert a.finish_reason == "length" and a.usage is None


def test_a_stream_and_a_body_of_the_same_answer_build_equal_answers() -> None:
    entries = [entry(t, -0.3, [(t, -0.3), ("y", -1.5)]) for t in TOKENS]
    body = Answer.from_body(chat_body(TOKENS, logprobs=entries), ttft_s=0.2)
    streamed = Answer.from_chunks(chat_chunks(TOKENS, logprobs=entries), ttft_s=0.2)
    assert streamed == body
    assert Answer.from_chunks(chat_chunks(TOKENS)) == Answer.from_body(chat_body(TOKENS))
    # Without usage in the stream, the answer says so instead of guessing.
    assert Answer.from_chunks(chat_chunks(TOKENS)[:-1]).usage is None


def test_a_streamed_tool_call_is_assembled_by_index() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    body = Answer.from_body(chat_body([], finish="tool_calls", tool_calls=[call]))
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": ""}}]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '{"city": '}}]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '"Paris"}'}}]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 0,
                                  "total_tokens": 7}},
    ]
    streamed = Answer.from_chunks(chunks)
    assert streamed == body
    assert streamed.tool_calls == (ToolCall("get_weather", '{"city": "Paris"}'),)
    assert streamed.text == "" and streamed.finish_reason == "tool_calls"


def test_errors_from_a_status_an_error_body_and_an_error_chunk() -> None:
    limited = Answer.from_body(
        {"error": {"message": "Rate limit reached", "type": "rate_limit", "code": "rate_limited"}},
        status=429)
    assert limited.failed and limited.status == 429
    assert (limited.error_code, limited.error_message) == ("rate_limited", "Rate limit reached")
    typed = Answer.from_body({"error": {"message": "boom", "type": "server_error"}})
    assert typed.failed and typed.status == 500 and typed.error_code == "server_error"
    mid_stream = Answer.from_chunks([*chat_chunks(["a"])[:2], {"error": {"message": "gone"}}])
    assert mid_stream.failed and mid_stream.error_message == "gone" and mid_stream.text == ""
    timeout = Answer.from_error(0, code="timeout", message="no answer in 30 s")
    assert timeout.failed and timeout.status == 0
    assert Answer.from_error(0).failed  # no response at all
    assert not answer("fine").failed


# -- comparing --------------------------------------------------------------------------


def test_equal_answers_match_exactly_and_do_not_diverge() -> None:
    c = compare(answer("The cat sat."), answer("The cat sat."), greedy=True)
    assert c.text_compared and c.exact_match is True and not c.diverged
    assert c.first_divergence is None and c.token_a is None and c.token_b is None
    assert c.edit_distance == 0.0 and c.token_edit_distance == 0.0
    assert c.length_ratio == 1.0 and not c.finish_mismatch and not c.error_mismatch
    assert c.near_tie is None and c.hard_flip is None


def test_different_answers_give_the_first_divergent_token_and_distances() -> None:
    c = compare(answer("The cat sat on the mat."), answer("The cat lay on the mat."),
                greedy=True)
    assert c.exact_match is False and c.diverged
    assert (c.first_divergence, c.token_a, c.token_b) == (2, "sat", "lay")
    assert c.edit_distance == pytest.approx(2 / 23)  # s->l, t->y
    assert c.token_edit_distance == pytest.approx(1 / 7)
    assert c.length_ratio == 1.0


def test_one_answer_a_prefix_of_the_other_diverges_where_the_shorter_ends() -> None:
    short, long = answer("one two"), answer("one two three four")
    c = compare(short, long, greedy=True)
    assert (c.first_divergence, c.token_a, c.token_b) == (2, None, "three")
    assert (c.tokens_a, c.tokens_b, c.length_ratio) == (2, 4, 2.0)
    c = compare(long, short, greedy=True)
    assert (c.first_divergence, c.token_a, c.token_b) == (2, "three", None)
    assert c.length_ratio == 0.5
    assert compare(answer(""), answer(""), greedy=True).length_ratio == 1.0
    assert compare(answer(""), answer("x"), greedy=True).length_ratio is None


def test_server_tokens_are_compared_only_when_both_sides_have_them() -> None:
    a = with_logprobs(["Hi", " there", "!"])
    b = with_logprobs(["Hi", " there", "?"])
    c = compare(a, b, greedy=True)
    assert (c.first_divergence, c.token_a, c.token_b) == (2, "!", "?")
    # One side without logprobs: both are split the same way, by the text.
    c = compare(a, answer("Hi there?"), greedy=True)
    assert (c.first_divergence, c.token_a, c.token_b, c.tokens_a) == (2, "!", "?", 3)


def test_finish_reason_mismatch_both_ways() -> None:
    same = compare(answer("a b", finish_reason="length"), answer("a b", finish_reason="length"),
                   greedy=True)
    assert not same.finish_mismatch and not same.diverged
    c = compare(answer("a b", finish_reason="stop"), answer("a b", finish_reason="length"),
                greedy=True)
    assert c.finish_mismatch and c.diverged and c.exact_match is True
    assert (c.finish_a, c.finish_b) == ("stop", "length")


def test_error_mismatch_one_side_or_different_errors() -> None:
    ok = answer("fine")
    limited = Answer.from_error(429, code="rate_limited")
    c = compare(ok, limited, greedy=True)
    assert c.error_mismatch and c.diverged and (c.errored_a, c.errored_b) == (False, True)
    # Text is not compared when a side failed: there is no text to compare.
    assert not c.text_compared and c.exact_match is None and c.edit_distance is None
    assert compare(limited, ok, greedy=True).error_mismatch
    same = compare(limited, Answer.from_error(429, code="rate_limited"), greedy=True)
    assert not same.error_mismatch and not same.diverged
    assert compare(limited, Answer.from_error(429, code="quota"), greedy=True).error_mismatch
    assert compare(limited, Answer.from_error(503, code="rate_limited"),
                   greedy=True).error_mismatch
    assert not compare(ok, answer("fine"), greedy=True).error_mismatch


def test_json_validity_and_equality_ignoring_key_order() -> None:
    a, b = answer('{"a": 1, "b": [1, 2]}'), answer('{"b": [1, 2],  "a": 1}')
    c = compare(a, b, greedy=True, expect_json=True)
    assert c.json_checked and c.json_valid_a and c.json_valid_b and c.json_equal is True
    assert c.exact_match is False  # the text differs, the JSON does not
    c = compare(a, answer('{"a": 2, "b": [1, 2]}'), greedy=True, expect_json=True)
    assert c.json_equal is False
    c = compare(a, answer('{"a": 1, "b": [1, 2]'), greedy=True, expect_json=True)
    assert c.json_valid_a is True and c.json_valid_b is False and c.json_equal is False
    assert c.validity_mismatch
    unchecked = compare(a, b, greedy=True)
    assert not unchecked.json_checked and unchecked.json_valid_a is None
    assert unchecked.json_equal is None


SCHEMA = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}}}


def test_json_schema_conformance_on_each_side() -> None:
    good, bad = answer('{"name": "Ada", "age": 36}'), answer('{"name": "Ada", "age": -1}')
    c = compare(good, bad, greedy=True, schema=SCHEMA)
    assert c.json_checked and c.json_valid_a is True and c.json_valid_b is False
    assert c.diverged
    c = compare(bad, good, greedy=True, schema=SCHEMA)
    assert (c.json_valid_a, c.json_valid_b) == (False, True)
    c = compare(good, answer('{"age": 36, "name": "Ada"}'), greedy=True, schema=SCHEMA)
    assert c.json_valid_a and c.json_valid_b and c.json_equal is True
    assert not compare(good, answer("not json"), greedy=True, schema=SCHEMA).json_valid_b


def test_a_broken_schema_is_the_callers_error() -> None:
    with pytest.raises(jsonschema.SchemaError):
        compare(answer("{}"), answer("{}"), greedy=True, schema={"type": 5})


TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string"}}}}}]


def called(name: str, arguments: str) -> Answer:
    return Answer.from_text("", finish_reason="tool_calls",
                            tool_calls=[ToolCall(name, arguments)])


def test_tool_calls_validity_names_and_arguments() -> None:
    a = called("get_weather", '{"city": "Paris"}')
    c = compare(a, called("get_weather", '{ "city":"Paris" }'), greedy=True, tools=TOOLS)
    assert c.tool_calls_valid_a and c.tool_calls_valid_b
    assert c.tool_names_equal and c.tool_args_equal
    assert c.exact_match is False and c.diverged  # the strings differ, the call does not
    c = compare(a, called("get_weather", '{"city": "Rome"}'), greedy=True, tools=TOOLS)
    assert c.tool_names_equal and c.tool_args_equal is False
    c = compare(a, called("get_time", '{"city": "Paris"}'), greedy=True, tools=TOOLS)
    assert c.tool_names_equal is False and c.tool_calls_valid_b is False  # not in tools
    c = compare(a, called("get_weather", '{"town": "Paris"}'), greedy=True, tools=TOOLS)
    assert c.tool_calls_valid_b is False and c.validity_mismatch
    c = compare(a, called("get_weather", '{"city": '), greedy=True)
    assert c.tool_calls_valid_b is False and c.tool_args_equal is False
    # Without the request's tools, only the JSON of the arguments is checked.
    assert compare(a, called("anything", "{}"), greedy=True).tool_calls_valid_b is True
    same = compare(a, called("get_weather", '{"city": "Paris"}'), greedy=True, tools=TOOLS)
    assert same.exact_match and not same.diverged
    text_only = compare(answer("hi"), answer("hi"), greedy=True, tools=TOOLS)
    assert text_only.tool_calls_valid_a is None and text_only.tool_names_equal is None
    c = compare(answer("hi"), a, greedy=True, tools=TOOLS)
    assert c.tool_names_equal is False and c.tool_calls_valid_a is None and c.diverged


def test_a_near_tie_and_a_hard_flip_at_the_first_divergence() -> None:
    reference = ["The", " sky", " is", " blue"]
    tie = with_logprobs(["The", " sky", " looks", " blue"],
                        tops={2: [(" looks", -0.69), (" is", -0.70)]}, chosen={2: -0.69})
    flip = with_logprobs(["The", " sky", " looks", " blue"],
                         tops={2: [(" is", -0.2), (" looks", -2.5)]}, chosen={2: -2.5})
    primary = with_logprobs(reference, tops={2: [(" is", -0.1), (" seems", -3.0)]})
    c = compare(primary, tie, greedy=True)
    assert (c.first_divergence, c.near_tie, c.hard_flip) == (2, True, False)
    c = compare(primary, flip, greedy=True)
    assert (c.first_divergence, c.near_tie, c.hard_flip) == (2, False, True)
    # The threshold is a parameter; the primary's view counts as well as the candidate's.
    assert compare(primary, flip, greedy=True, near_tie_nats=3.0).near_tie is True
    wide = with_logprobs(reference, tops={2: [(" is", -0.6), (" looks", -0.65)]},
                         chosen={2: -0.6})
    assert compare(wide, flip, greedy=True).near_tie is True
    assert NEAR_TIE_NATS == 0.1
    # Without logprobs on both sides, neither is claimed.
    c = compare(answer("The sky is blue"), tie, greedy=True)
    assert c.first_divergence == 2 and c.near_tie is None and c.hard_flip is None


def test_refusals_are_recognised_on_each_side() -> None:
    refused = answer("I\u2019m sorry, but I can\u2019t help with that request.")
    assert is_refusal(refused) and not is_refusal(answer("Sure, here it is."))
    c = compare(answer("Sure, here it is."), refused, greedy=True)
    assert (c.refusal_a, c.refusal_b) == (False, True)
    assert compare(refused, answer("Sure."), greedy=False).diverged
    by_field = Answer.from_body(chat_body(["x"], refusal="I can't do that."))
    assert is_refusal(by_field)
    # Far into a reply, the phrase is quoted, not a refusal.
    assert not is_refusal(answer("x " * 200 + "I am unable to"))


def test_ttft_and_tpot_are_carried_through() -> None:
    c = compare(answer("a", ttft_s=0.1, tpot_s=0.02), answer("a", ttft_s=0.3), greedy=True)
    assert (c.ttft_a, c.ttft_b, c.tpot_a, c.tpot_b) == (0.1, 0.3, 0.02, None)


def test_sampled_mode_compares_the_distribution_and_leaves_text_fields_empty() -> None:
    a = with_logprobs(["The", " sky", " is", " blue", "."])
    b = with_logprobs(["A", " blue", " sky", "."], tops={0: [("A", -0.69), ("The", -0.7)]})
    c = compare(a, b, greedy=False, expect_json=False)
    assert not c.text_compared and not c.greedy
    for name in ("exact_match", "first_divergence", "token_a", "token_b", "edit_distance",
                 "token_edit_distance", "json_equal", "tool_names_equal", "tool_args_equal",
                 "near_tie", "hard_flip"):
        assert getattr(c, name) is None, name
    assert not c.diverged  # different words, same kind of answer
    assert c.length_ratio == pytest.approx(4 / 5)
    assert compare(answer("a", finish_reason="stop"), answer("a", finish_reason="length"),
                   greedy=False).diverged
    js = compare(answer('{"name": "Ada", "age": 1}'), answer('{"name": "Bo", "age": 2}'),
                 greedy=False, schema=SCHEMA)
    assert js.json_valid_a and js.json_valid_b and js.json_equal is None and not js.diverged
    assert compare(answer("{}"), answer("{"), greedy=False, expect_json=True).diverged
    assert compare(answer("a"), Answer.from_error(500), greedy=False).diverged
    bad_call = compare(called("get_weather", '{"city": "Paris"}'), called("get_weather", "{"),
                       greedy=False, tools=TOOLS)
    assert bad_call.diverged and bad_call.tool_args_equal is None


def test_metrics_are_flags_for_what_was_measured() -> None:
    c = compare(answer("a b c"), answer("a x c", finish_reason="length"), greedy=True)
    m = c.metrics()
    assert m == {"diverged": 1, "finish_mismatch": 1, "error_mismatch": 0, "errored_a": 0,
                 "errored_b": 0, "refusal_a": 0, "refusal_b": 0, "refusal_mismatch": 0,
                 "exact_match": 0}
    assert set(m.values()) <= {0, 1}
    m = compare(answer("{}"), answer("{}"), greedy=False, expect_json=True).metrics()
    assert "exact_match" not in m and m["json_valid_a"] == 1 and m["validity_mismatch"] == 0
    m = compare(with_logprobs(["a", "b"]),
                with_logprobs(["a", "c"], tops={1: [("c", -0.5), ("b", -0.55)]},
                              chosen={1: -0.5}),
                greedy=True).metrics()
    assert (m["near_tie"], m["hard_flip"]) == (1, 0)


def test_comparing_is_deterministic() -> None:
    a, b = answer("one two three"), answer("one too three")
    assert compare(a, b, greedy=True) == compare(a, b, greedy=True)


# -- real simulator pools ---------------------------------------------------------------

@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.sim.simproc import sim_with_profiles
    from tests.support.profiles import TEST_PROFILES

    sim = sim_with_profiles(tmp_path_factory.mktemp("compare-sim"), TEST_PROFILES,
                            {"primary": "quick", "diverging": "diverging", "tie": "tie",
                             "flip": "flip"})
    yield sim
    assert sim.stop() == 0, sim.log()


def request(prompt: str, **extra: Any) -> dict[str, Any]:
    from tests.sim.simproc import MODEL

    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 48, "temperature": 0, "logprobs": True, "top_logprobs": 3, **extra}


def ask(url: str, body: dict[str, Any]) -> Answer:
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    return Answer.from_body(reply.json(), status=reply.status_code)


def ask_streamed(url: str, body: dict[str, Any]) -> Answer:
    chunks = []
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=stream_body,
                      timeout=30) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return Answer.from_chunks(chunks)


@pytest.mark.slow
def test_a_pool_answering_the_same_request_twice_matches_exactly(pools: Any) -> None:
    url = pools.url("primary")
    first, second = ask(url, request("noise floor")), ask(url, request("noise floor"))
    assert first.tokens_from_logprobs and len(first.tokens) > 0
    c = compare(first, second, greedy=True)
    assert c.exact_match is True and not c.diverged and c.first_divergence is None
    assert c.metrics()["diverged"] == 0


@pytest.mark.slow
def test_a_stream_and_a_body_from_a_pool_build_equal_answers(pools: Any) -> None:
    url = pools.url("primary")
    assert ask_streamed(url, request("streamed")) == ask(url, request("streamed"))
    tool_request = request("weather in Paris", tools=TOOLS, tool_choice="required")
    body, streamed = ask(url, tool_request), ask_streamed(url, tool_request)
    assert streamed == body and body.tool_calls and body.tool_calls[0].name == "get_weather"
    assert compare(body, streamed, greedy=True, tools=TOOLS).tool_calls_valid_b is True


@pytest.mark.slow
def test_a_diverging_pool_shows_where_and_how_it_diverged(pools: Any) -> None:
    found = []
    for i in range(32):
        body = request(f"shadow probe {i}")
        c = compare(ask(pools.url("primary"), body), ask(pools.url("diverging"), body),
                    greedy=True)
        if c.diverged:
            found.append(c)
            assert c.first_divergence is not None and c.token_a != c.token_b
            assert c.near_tie is not None and c.hard_flip is (not c.near_tie)
    assert found, "no divergence in 32 requests at a rate of a quarter"

    body = request("tie or flip")
    primary = ask(pools.url("primary"), body)
    tie = compare(primary, ask(pools.url("tie"), body), greedy=True)
    flip = compare(primary, ask(pools.url("flip"), body), greedy=True)
    assert tie.first_divergence is not None and tie.near_tie is True
    assert flip.first_divergence is not None and flip.hard_flip is True
    # At temperature > 0 the same pair is compared by kind only.
    sampled = compare(primary, ask(pools.url("tie"), body), greedy=False)
    assert sampled.first_divergence is None and not sampled.text_compared
