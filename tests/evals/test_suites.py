"""The eval suite format: every bad input the issue names is refused with "line N: <field>:
<what to do>" and nothing returned; the header's defaults; and the canonical bytes a suite is
pinned by — parsing them gives the same suite back (a hypothesis property), and two uploads
that mean the same thing have the same digest. Plain functions, no database."""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.core.jsonl import MAX_LINE_BYTES
from fleetctl.evals.suites import (
    DEFAULT_DECODING,
    NO_ITEMS,
    FieldProblem,
    ParsedSuite,
    SuiteError,
    SuiteItem,
    canonical_jsonl,
    decoding_checked,
    digest,
    parse_suite,
)

HEADER = {"fleetctl_eval_suite": 1, "description": "arithmetic, a few",
          "decoding": {"temperature": 0, "seed": 1234, "max_tokens": 256}}
CHAT = [{"role": "user", "content": "What is 6 x 7?"}]


def item(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": "q1", "messages": CHAT, "references": ["42"],
                           "scorer": "numeric"}
    out.update(fields)
    return {k: v for k, v in out.items() if v is not DROP}


DROP = object()  # item(prompt="x", messages=DROP) leaves messages out


def lines_of(*objects: object) -> list[bytes]:
    return [(o if isinstance(o, str) else json.dumps(o, ensure_ascii=False)).encode() + b"\n"
            for o in objects]


def errors_of(lines: Any, **kwargs: Any) -> list[str]:
    """The messages as a person reads them."""
    with pytest.raises(SuiteError) as caught:
        parse_suite(lines, **kwargs)
    return caught.value.messages()


def only_error(*objects: object) -> str:
    [message] = errors_of(lines_of(*objects))
    return message


# --- what a good suite gives ---------------------------------------------------------------


def test_a_suite_with_a_header_parses_to_validated_items() -> None:
    suite = parse_suite(lines_of(
        HEADER,
        item(tags=["arithmetic", "op:multiply"], request={"max_tokens": 64},
             params={"abs_tol": 0}),
        "",
        {"id": "q2", "prompt": "Q: capital of France?\nA:", "reference": "Paris",
         "scorer": "normalised"},
        {"id": "q3", "messages": CHAT, "references": [42, 42.5], "scorer": "numeric"},
        {"id": "q4", "prompt": "Reply in JSON", "scorer": "json_schema",
         "params": {"schema": {"type": "object", "required": ["a"]}}},
    ))
    assert suite.description == "arithmetic, a few"
    assert suite.decoding == {"max_tokens": 256, "seed": 1234, "temperature": 0.0}
    q1, q2, q3, q4 = suite.items
    assert q1 == SuiteItem(item_id="q1", messages=CHAT, prompt="", references=["42"],
                           scorer="numeric",
                           params={"abs_tol": 0.0, "rel_tol": 0.0, "pick": "last",
                                   "percent_as_fraction": False},
                           tags=["arithmetic", "op:multiply"], request={"max_tokens": 64})
    assert (q2.messages, q2.prompt, q2.references) == (None, "Q: capital of France?\nA:",
                                                       ["Paris"])
    assert q2.params["case"] is True and q2.tags == [] and q2.request == {}
    assert q3.references == ["42", "42.5"]  # numbers are written as JSON
    assert q4.references == [] and q4.params["fences"] is True
    assert suite.tag_counts() == {"arithmetic": 1, "op:multiply": 1}
    assert suite.scorer_counts() == {"json_schema": 1, "normalised": 1, "numeric": 2}


def test_without_a_header_the_decoding_defaults_apply() -> None:
    suite = parse_suite(lines_of(item()))
    assert suite.description == ""
    assert suite.decoding == {"temperature": 0, "seed": 0, "max_tokens": 256} \
        == DEFAULT_DECODING
    assert [i.item_id for i in suite.items] == ["q1"]


def test_the_header_fills_missing_decoding_keys_and_keeps_top_p() -> None:
    suite = parse_suite(lines_of({"fleetctl_eval_suite": 1, "decoding": {"top_p": 0.9}},
                                 item()))
    assert suite.decoding == {"max_tokens": 256, "seed": 0, "temperature": 0.0, "top_p": 0.9}


def test_blank_lines_a_bom_and_crlf_are_fine_and_keep_line_numbers() -> None:
    data = (b"\xef\xbb\xbf" + json.dumps(HEADER).encode() + b"\r\n\r\n"
            + json.dumps(item()).encode() + b"\r\n   \n" + json.dumps(item()).encode())
    assert errors_of(io.BytesIO(data)) == [
        'line 5: id: "q1" is already the id of the item on line 3; give each item its own id']


def test_text_lines_and_binary_files_read_the_same() -> None:
    text = "\n".join(json.dumps(o, ensure_ascii=False)
                     for o in (HEADER, item(messages=[{"role": "user", "content": "ünï"}])))
    assert parse_suite(text.splitlines()) == parse_suite(io.BytesIO(text.encode())) \
        == parse_suite(io.StringIO(text))


def test_an_item_may_be_sent_with_tools_stop_and_a_response_format() -> None:
    request = {"stop": ["\n\n", "Q:"], "temperature": 1, "top_p": 1, "seed": 7,
               "response_format": {"type": "json_object"},
               "tools": [{"type": "function",
                          "function": {"name": "get_weather", "parameters": {}}}],
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    [got] = parse_suite(lines_of(item(request=request, scorer="tool_call", references=[
        {"name": "get_weather", "arguments": {"city": "Oslo"}}]))).items
    assert got.request == {**request, "temperature": 1.0, "top_p": 1.0}
    assert list(got.request) == sorted(request)
    assert got.references == ['{"name": "get_weather", "arguments": {"city": "Oslo"}}']


def test_chat_messages_may_carry_tool_turns() -> None:
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "developer", "content": "answer in one word"}]
    [got] = parse_suite(lines_of(item(messages=chat, references=["sunny"],
                                      scorer="contains"))).items
    assert got.messages == chat


# --- bad input: one message per line, naming the line and field --------------------------


def test_malformed_lines_say_where() -> None:
    assert errors_of(lines_of(item(), '{"id": "q2", "prompt": "x",, }', "[1, 2]", "42")) == [
        "line 2: is not valid JSON (Expecting property name enclosed in double quotes at "
        "column 28)",
        'line 3: item: must be a JSON object such as {"id": "q1", "prompt": "...", '
        '"references": ["..."], "scorer": "exact"}, got [1, 2]',
        'line 4: item: must be a JSON object such as {"id": "q1", "prompt": "...", '
        '"references": ["..."], "scorer": "exact"}, got 42',
    ]


def test_nan_and_huge_numbers_are_not_json() -> None:
    assert errors_of([b'{"id": "a", "prompt": "x", "scorer": "numeric", "references": [NaN]}\n',
                      b'{"id": "b", "prompt": "x", "scorer": "json", "params": {"fences": '
                      b'true}, "request": {"seed": 1e999}}\n']) == [
        "line 1: is not valid JSON (NaN is not a JSON number; write a finite number, or a "
        "string)",
        "line 2: holds a number too large for JSON (it reads as infinity); write a smaller "
        "number, or a string",
    ]


def test_an_unknown_scorer_lists_the_known_ones() -> None:
    message = only_error(item(scorer="bleu"))
    assert message.startswith('line 1: scorer: unknown scorer "bleu"; give one of: exact, ')
    assert "instruction" in message and "json_schema" in message
    assert only_error(item(scorer=DROP)).startswith("line 1: scorer: missing; give one of: ")
    assert only_error(item(scorer=["exact"])).startswith(
        'line 1: scorer: unknown scorer ["exact"]; give one of:')


def test_an_invalid_json_schema_is_refused_naming_where() -> None:
    bad = item(scorer="json_schema", references=[],
               params={"schema": {"type": "object", "properties": {"a": {"minimum": "x"}}}})
    assert only_error(bad) == ("line 1: params.schema: schema is not a valid JSON Schema at "
                               "properties/a/minimum: 'x' is not of type 'number'")
    assert only_error(item(scorer="json_schema", params={})) .startswith(
        "line 1: params.schema: schema is required")


def test_a_regex_that_does_not_compile_is_refused() -> None:
    assert only_error(item(scorer="regex", params={"pattern": "answer: (\\d+"})) == (
        "line 1: params.pattern: pattern 'answer: (\\\\d+' does not compile: missing ) at "
        "position 12; give a regular expression with one capturing group")
    assert only_error(item(scorer="regex", params={"pattern": "\\d+"})).startswith(
        "line 1: params.pattern: pattern '\\\\d+' has 0 capturing groups; give exactly one")


def test_bad_scorer_params_and_references_name_them() -> None:
    assert only_error(item(params={"tolerance": 0})) == (
        "line 1: params.tolerance: unknown parameter 'tolerance'; known: abs_tol, rel_tol, "
        "pick, percent_as_fraction")
    assert only_error(item(references=["42", "n/a"])) == (
        "line 1: references[1]: reference 2 ('n/a') has no number; give the expected number, "
        'e.g. "42"')
    assert only_error(item(scorer="choice", references=["E"], params={"choices": "ABCD"})) \
        .startswith("line 1: references[0]: reference 1 ('E') is not one of the choices ABCD")
    assert only_error(item(references=[])) == \
        "line 1: references: give at least one reference"
    assert only_error(item(references=DROP)) == \
        "line 1: references: give at least one reference"
    assert only_error(item(params=[1])) == "line 1: params: must be an object"
    assert only_error(item(scorer="instruction", references=[])) == \
        "line 1: params: give at least one rule: words, min_words, max_words, lines, case, " \
        "starts_with, ends_with, forbid"


def test_reference_and_references() -> None:
    assert parse_suite(lines_of(item(references=DROP, reference="42"))).items[0].references \
        == ["42"]
    assert only_error(item(reference="42")) == \
        "line 1: references: give references (a list) or reference (one string), not both"
    assert only_error(item(references=DROP, reference=42)).startswith(
        "line 1: reference: must be one string (for several, or a number or an object, give "
        "references: [...]), got 42")
    assert only_error(item(references="42")) == \
        'line 1: references: must be a list such as ["42"] (or [] for none), got "42"'
    assert only_error(item(references=[None])) == \
        "line 1: references[0]: reference 1 is null; give a string"


def test_duplicate_ids_name_both_lines() -> None:
    assert errors_of(lines_of(item(id="a"), item(id="b"), item(id="a"), item(id="a"))) == [
        'line 3: id: "a" is already the id of the item on line 1; give each item its own id',
        'line 4: id: "a" is already the id of the item on line 1; give each item its own id',
    ]


@pytest.mark.parametrize(("item_id", "expected"), [
    (DROP, 'line 1: id: missing; give each item a unique id such as "arith-0001"'),
    ("", 'line 1: id: must be a string of 1 to 200 characters (not only spaces), got ""'),
    ("   ", 'line 1: id: must be a string of 1 to 200 characters (not only spaces), got "   "'),
    (17, "line 1: id: must be a string of 1 to 200 characters (not only spaces), got 17"),
    ("x" * 201, "line 1: id: must be a string of 1 to 200 characters (not only spaces), got "
                '"' + "x" * 56 + "..."),
])
def test_bad_ids(item_id: object, expected: str) -> None:
    assert only_error(item(id=item_id)) == expected


def test_ids_may_be_any_text_up_to_200_characters() -> None:
    ids = ["x" * 200, "数学 #1", "a/b:c d"]
    suite = parse_suite(lines_of(*(item(id=i) for i in ids)))
    assert [i.item_id for i in suite.items] == ids


@pytest.mark.parametrize(("tags", "expected"), [
    ("arithmetic", 'tags: must be a list of strings such as ["arithmetic"], got "arithmetic"'),
    (["ok", "has space"], "tags[1]: must be 1 to 64 characters of letters, digits and "
                          '_ . : / -, got "has space"'),
    ([""], 'tags[0]: must be 1 to 64 characters of letters, digits and _ . : / -, got ""'),
    (["x" * 65], "tags[0]: must be 1 to 64 characters of letters, digits and _ . : / -, got "
                 '"' + "x" * 56 + "..."),
    (["ünï"], "tags[0]: must be 1 to 64 characters of letters, digits and _ . : / -, "
              'got "ünï"'),
    ([3], "tags[0]: must be 1 to 64 characters of letters, digits and _ . : / -, got 3"),
    (["a", "b", "a"], 'tags[2]: "a" is given twice; give each tag once'),
    ([f"t{i}" for i in range(17)], "tags: has 17 tags; give at most 16"),
])
def test_bad_tags(tags: object, expected: str) -> None:
    assert only_error(item(tags=tags)) == f"line 1: {expected}"


def test_good_tags() -> None:
    tags = ["arithmetic", "op:multiply", "steps:2", "a.b/c-d_e", "x" * 64,
            *(f"t{i}" for i in range(11))]
    assert parse_suite(lines_of(item(tags=tags))).items[0].tags == tags


def test_unknown_keys_are_named() -> None:
    assert only_error(item(answer="42")) == (
        "line 1: answer: unknown key; allowed: id, messages, prompt, references, reference, "
        "scorer, params, tags, request")
    assert only_error(item(request={"max_tokens": 5, "model": "llama"})) == (
        "line 1: request.model: is not a request key an item may set; allowed: max_tokens, "
        "temperature, top_p, seed, stop, response_format, tools, tool_choice")
    assert only_error(item(request={"stream": True})).startswith("line 1: request.stream: ")


@pytest.mark.parametrize(("request_", "expected"), [
    ([1], 'request: must be an object such as {"max_tokens": 64}, got [1]'),
    ({"max_tokens": 0}, "request.max_tokens: must be an integer from 1 to 1,000,000, got 0"),
    ({"max_tokens": 2.0}, "request.max_tokens: must be an integer from 1 to 1,000,000, got 2.0"),
    ({"temperature": 3}, "request.temperature: must be a number from 0 to 2, got 3"),
    ({"temperature": True}, "request.temperature: must be a number from 0 to 2, got true"),
    ({"top_p": 0}, "request.top_p: must be a number above 0 and at most 1, got 0"),
    ({"seed": -1}, "request.seed: must be an integer from 0 to 9223372036854775807, got -1"),
    ({"stop": ""}, "request.stop: must be a non-empty string or a list of 1 to 4 non-empty "
                   'strings, got ""'),
    ({"stop": ["a", "b", "c", "d", "e"]}, "request.stop: must be a non-empty string or a list "
                                          "of 1 to 4 non-empty strings, got "
                                          '["a", "b", "c", "d", "e"]'),
    ({"response_format": {"type": "yaml"}}, "request.response_format: must be an object whose "
                                            "type is one of text, json_object, json_schema, "
                                            'e.g. {"type": "json_object"}, got {"type": "yaml"}'),
    ({"response_format": {"type": "json_schema"}},
     'request.response_format.json_schema: must be an object such as {"name": "answer", '
     '"schema": {...}}'),
    ({"tools": []}, "request.tools: must be a list of 1 to 128 tools, got []"),
    ({"tools": [{"type": "function", "function": {}}]},
     'request.tools[0]: must be {"type": "function", "function": {"name": "...", '
     '"parameters": {...}}}, got {"type": "function", "function": {}}'),
    ({"tool_choice": "always"}, 'request.tool_choice: must be one of none, auto, required or '
                                '{"type": "function", "function": {"name": "..."}}, '
                                'got "always"'),
])
def test_bad_request_values(request_: object, expected: str) -> None:
    assert only_error(item(request=request_)) == f"line 1: {expected}"


def test_messages_or_prompt_exactly_one() -> None:
    assert only_error(item(prompt="6 x 7 =")) == (
        "line 1: messages: give either messages (a chat) or prompt (a completion text), "
        "not both")
    assert only_error(item(messages=DROP)) == (
        'line 1: messages: missing; give messages (a chat, e.g. [{"role": "user", '
        '"content": "..."}]) or prompt (a completion text)')
    assert only_error(item(messages=DROP, prompt="")) == \
        'line 1: prompt: must be a non-empty string, got ""'
    assert only_error(item(messages=DROP, prompt=["a"])) == \
        'line 1: prompt: must be a non-empty string, got ["a"]'


@pytest.mark.parametrize(("messages", "expected"), [
    ([], "messages: must be a non-empty list of chat messages, got []"),
    ([{"role": "bot", "content": "hi"}],
     'messages[0].role: must be one of system, user, assistant, tool, developer; got "bot"'),
    ([{"role": "user"}], "messages[0]: has no content"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
     'messages[0].content: must be a string, got [{"type": "text", "text": "hi"}]'),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": None}],
     "messages[1].content: is null; only an assistant message with tool_calls may omit it"),
])
def test_bad_messages_name_the_message(messages: object, expected: str) -> None:
    assert only_error(item(messages=messages)) == f"line 1: {expected}"


@pytest.mark.parametrize("lines", [
    [], [b"\n", b"   \r\n"], lines_of(HEADER), lines_of(HEADER, ""),
])
def test_an_empty_suite_is_refused(lines: list[bytes]) -> None:
    assert errors_of(lines) == [NO_ITEMS]
    assert NO_ITEMS.startswith("the suite has no items; add at least one item line")


def test_too_many_items_stops_reading_at_the_limit() -> None:
    consumed = 0

    def lines() -> Any:
        nonlocal consumed
        for i in range(100):
            consumed += 1
            yield json.dumps(item(id=f"q{i}")).encode()

    assert errors_of(lines(), max_items=3) == [
        "line 4: the suite has more than 3 items, the limit; split it into smaller suites"]
    assert consumed == 4
    assert len(parse_suite(lines_of(*(item(id=f"q{i}") for i in range(3))),
                           max_items=3).items) == 3


def test_the_item_limit_comes_from_settings(settings: Any) -> None:
    settings.EVAL_MAX_SUITE_ITEMS = 2
    assert errors_of(lines_of(*(item(id=f"q{i}") for i in range(3))))[0].startswith(
        "line 3: the suite has more than 2 items")


def test_bad_utf8_names_the_byte() -> None:
    bad = b'{"id": "q2", "prompt": "caf\xe9", "scorer": "json"}\n'
    assert errors_of([*lines_of(item()), bad]) == [
        "line 2: is not valid UTF-8 (byte 0xe9 at column 28); save the suite as UTF-8"]


def test_an_overlong_line_is_refused_without_being_held() -> None:
    long = json.dumps(item(id="q2", messages=[{"role": "user",
                                               "content": "x" * MAX_LINE_BYTES}])).encode()
    data = b"".join([*lines_of(item()), long + b"\n", *lines_of(item(id="q3"))])
    assert errors_of(io.BytesIO(data)) == [
        "line 2: is longer than 1,048,576 bytes (1 MiB), the line limit"]


def test_errors_are_collected_up_to_the_cap() -> None:
    lines = lines_of(*(item(id=f"q{i}", scorer="bleu") for i in range(50)))
    with pytest.raises(SuiteError) as caught:
        parse_suite(lines, max_errors=20)
    assert caught.value.truncated and len(caught.value.errors) == 20
    assert caught.value.messages()[-1] == "(stopped after 20 errors)"
    assert [n for n, _ in caught.value.errors] == list(range(1, 21))


def test_one_bad_line_refuses_the_whole_suite() -> None:
    lines = lines_of(HEADER, *(item(id=f"q{i}") for i in range(10)), item(id="q10", scorer="x"))
    with pytest.raises(SuiteError) as caught:
        parse_suite(lines)
    assert caught.value.errors == [(12, caught.value.errors[0][1])]


def test_text_that_cannot_be_stored_is_refused_naming_the_field() -> None:
    assert errors_of([
        b'{"id": "a", "prompt": "nul \\u0000 here", "scorer": "json"}\n',
        b'{"id": "b", "prompt": "x", "scorer": "exact", "references": ["\\ud800"]}\n',
        b'{"id": "c", "prompt": "x", "scorer": "json", "request": {"stop": {"\\u0000": 1}}}\n',
        b'{"id": "d\\udfff", "prompt": "x", "scorer": "json"}\n',
        b'{"fleetctl_eval_suite": 1}\n',
    ]) == [
        "line 1: prompt: contains a NUL character (\\u0000), which cannot be stored; remove it",
        "line 2: references: contains a lone surrogate (\\ud800), which is not text; write the "
        "character itself, or both halves of its pair",
        "line 3: request: contains a NUL character (\\u0000), which cannot be stored; remove it",
        "line 4: id: contains a lone surrogate (\\udfff), which is not text; write the "
        "character itself, or both halves of its pair",
        "line 5: fleetctl_eval_suite: a header is only allowed as the first line; move it to "
        "the top or remove it",
    ]
    assert errors_of([b'{"fleetctl_eval_suite": 1, "description": "\\u0000"}\n']) == [
        "line 1: description: contains a NUL character (\\u0000), which cannot be stored; "
        "remove it"]
    # A pair of surrogate escapes is one character, and fine.
    [ok] = parse_suite([b'{"id": "e", "prompt": "\\ud83d\\ude00", "scorer": "json"}']).items
    assert ok.prompt == "\U0001F600"


def test_numbers_are_spelled_as_postgresql_gives_them_back() -> None:
    suite = parse_suite(lines_of(
        {"fleetctl_eval_suite": 1, "decoding": {"temperature": -0.0}},
        item(params={"abs_tol": 1e20, "rel_tol": -0.0},
             messages=[{"role": "user", "content": "x", "weight": 2.5e16, "w": [1e-7]}],
             request={"temperature": -0.0, "top_p": 0.5})))
    [got] = suite.items
    assert suite.decoding["temperature"] == 0.0 and str(suite.decoding["temperature"]) == "0.0"
    assert got.params["abs_tol"] == 10**20 and type(got.params["abs_tol"]) is int
    assert str(got.params["rel_tol"]) == "0.0"
    assert got.messages == [{"role": "user", "content": "x", "weight": 25 * 10**15,
                             "w": [1e-7]}]
    assert str(got.request["temperature"]) == "0.0"
    assert parse_suite(io.BytesIO(canonical(suite))) == suite


# --- the header ------------------------------------------------------------------------------


@pytest.mark.parametrize(("header", "expected"), [
    ({"fleetctl_eval_suite": 2}, "fleetctl_eval_suite: must be 1 (the format version this "
                                 "fleetctl reads), got 2"),
    ({"fleetctl_eval_suite": "1"}, "fleetctl_eval_suite: must be 1 (the format version this "
                                   'fleetctl reads), got "1"'),
    ({"fleetctl_eval_suite": True}, "fleetctl_eval_suite: must be 1 (the format version this "
                                    "fleetctl reads), got true"),
    ({"fleetctl_eval_suite": 1, "name": "x"}, "name: unknown header key; allowed: "
                                              "fleetctl_eval_suite, description, decoding"),
    ({"fleetctl_eval_suite": 1, "description": 5}, "description: must be a string of at most "
                                                   "10,000 characters"),
    ({"fleetctl_eval_suite": 1, "decoding": "greedy"},
     'decoding: must be an object such as {"temperature": 0, "seed": 1234, "max_tokens": 256}, '
     'got "greedy"'),
    ({"fleetctl_eval_suite": 1, "decoding": {"temp": 0}},
     "decoding.temp: unknown decoding key; allowed: temperature, top_p, seed, max_tokens"),
    ({"fleetctl_eval_suite": 1, "decoding": {"seed": "1"}},
     'decoding.seed: must be an integer from 0 to 9223372036854775807, got "1"'),
    ({"fleetctl_eval_suite": 1, "decoding": {"max_tokens": 0}},
     "decoding.max_tokens: must be an integer from 1 to 1,000,000, got 0"),
    ({"fleetctl_eval_suite": 1, "decoding": {"temperature": -0.5}},
     "decoding.temperature: must be a number from 0 to 2, got -0.5"),
])
def test_a_bad_header_names_the_key(header: dict[str, Any], expected: str) -> None:
    assert errors_of(lines_of(header, item())) == [f"line 1: {expected}"]


def test_the_header_is_only_allowed_first() -> None:
    assert errors_of(lines_of(item(), HEADER)) == [
        "line 2: fleetctl_eval_suite: a header is only allowed as the first line; move it to "
        "the top or remove it"]
    assert errors_of(lines_of(HEADER, HEADER, item())) == [
        "line 2: fleetctl_eval_suite: a header is only allowed as the first line; move it to "
        "the top or remove it"]
    # Blank lines before it are fine: it is the first line with something on it.
    assert parse_suite(lines_of("", HEADER, item())).description == HEADER["description"]


def test_a_header_after_an_unreadable_first_line_still_leaves_the_file_refused() -> None:
    assert errors_of(lines_of("{oops", HEADER, item())) == [
        "line 1: is not valid JSON (Expecting property name enclosed in double quotes at "
        "column 2)"]


def test_decoding_checked_is_usable_for_a_runs_overrides() -> None:
    assert decoding_checked({"seed": 5, "temperature": 1}) == \
        {"max_tokens": 256, "seed": 5, "temperature": 1.0}
    with pytest.raises(FieldProblem) as caught:
        decoding_checked({"temperature": 9})
    assert str(caught.value) == "decoding.temperature: must be a number from 0 to 2, got 9"
    assert caught.value.field == "decoding.temperature"
    assert isinstance(caught.value, ValueError)


# --- canonical bytes and the digest ---------------------------------------------------------


def canonical(suite: ParsedSuite) -> bytes:
    return canonical_jsonl(suite.description, suite.decoding, suite.items)


def test_canonical_bytes_sort_keys_drop_spaces_and_fill_defaults() -> None:
    suite = parse_suite(lines_of(HEADER, item(tags=["b", "a"]),
                                 {"scorer": "exact", "prompt": "é", "reference": "x", "id": "p"}))
    assert canonical(suite).decode().splitlines() == [
        '{"decoding":{"max_tokens":256,"seed":1234,"temperature":0.0},'
        '"description":"arithmetic, a few","fleetctl_eval_suite":1}',
        '{"id":"q1","messages":[{"content":"What is 6 x 7?","role":"user"}],'
        '"params":{"abs_tol":0.0,"percent_as_fraction":false,"pick":"last","rel_tol":0.0},'
        '"references":["42"],"scorer":"numeric","tags":["b","a"]}',
        '{"id":"p","params":{"strip":true},"prompt":"é","references":["x"],"scorer":"exact"}',
    ]
    assert canonical(suite).endswith(b"\n") and b"\r" not in canonical(suite)


def test_the_same_suite_written_differently_has_one_digest() -> None:
    a = lines_of({"fleetctl_eval_suite": 1, "decoding": {"seed": 1234}},
                 item(), {"id": "q2", "prompt": "hi", "reference": "hello", "scorer": "exact"})
    b = [json.dumps({"decoding": {"max_tokens": 256, "temperature": 0.0, "seed": 1234},
                     "description": "", "fleetctl_eval_suite": 1}, indent=None,
                    separators=(" , ", " : ")).encode() + b"\r\n",
         b"\n",
         json.dumps({"scorer": "numeric", "references": [42], "id": "q1", "messages": CHAT,
                     "params": {"pick": "last", "abs_tol": 0}, "tags": [],
                     "request": {}}).encode() + b"\n",
         json.dumps({"references": ["hello"], "scorer": "exact", "params": {"strip": True},
                     "prompt": "hi", "id": "q2"}).encode()]
    assert canonical(parse_suite(a)) == canonical(parse_suite(b))
    assert digest(canonical(parse_suite(a))) == digest(canonical(parse_suite(b)))
    changed = [*lines_of({"fleetctl_eval_suite": 1, "decoding": {"seed": 1235}}), *a[1:]]
    assert digest(canonical(parse_suite(changed))) != digest(canonical(parse_suite(a)))


def test_digest_is_the_sha256_of_the_bytes() -> None:
    data = canonical(parse_suite(lines_of(item())))
    assert digest(data) == hashlib.sha256(data).hexdigest()
    assert len(digest(data)) == 64


def test_line_separators_inside_text_stay_inside_their_line() -> None:
    text = "a\u2028b\u2029c\x85d\ne\rf"
    suite = parse_suite(lines_of(item(messages=[{"role": "user", "content": text}])))
    data = canonical(suite)
    assert len(data.decode().splitlines()) == 2  # str.splitlines breaks at all of those
    assert parse_suite(data.decode().splitlines()) == suite


@pytest.mark.django_db
def test_items_stored_in_jsonb_give_back_the_canonical_bytes() -> None:
    """What a download does: the rows' JSON, read back from PostgreSQL, written again."""
    from django.db import connection

    suite = parse_suite(lines_of(
        {"fleetctl_eval_suite": 1, "decoding": {"temperature": 0.7, "top_p": 1e-5}},
        item(params={"abs_tol": 1e20, "rel_tol": 1.5e-9},
             messages=[{"role": "user", "content": "é\u2028\r\n\t\"", "n": -0.0,
                        "big": 12345678901234567890, "f": 0.1}]),
        item(id="q2", scorer="json_schema", references=[], params={"schema": {
            "type": "object", "properties": {"x": {"const": 9.999999999999999e15},
                                             "y": {"const": 1.7976931348623157e308}}}},
             request={"temperature": 1.25, "stop": ["\u0085"]})))
    data = canonical(suite)
    with connection.cursor() as cursor:
        def through(value: Any) -> Any:
            cursor.execute("SELECT %s::jsonb::text", [json.dumps(value)])
            return json.loads(cursor.fetchone()[0])

        stored = [SuiteItem(item_id=i.item_id, messages=through(i.messages), prompt=i.prompt,
                            references=through(i.references), scorer=i.scorer,
                            params=through(i.params), tags=through(i.tags),
                            request=through(i.request)) for i in suite.items]
        decoding = through(suite.decoding)
    assert canonical_jsonl(suite.description, decoding, stored) == data


# --- the round trip, by property --------------------------------------------------------------

CHARS = st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00")
TEXT = st.text(CHARS, max_size=40)
NON_BLANK = TEXT.filter(lambda t: t.strip() != "")
TAG = st.from_regex(r"[A-Za-z0-9_.:/-]{1,64}", fullmatch=True)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(
    ["system", "user", "assistant", "tool", "developer"]), "content": TEXT})
NUMBER = st.integers(-10**6, 10**6) | st.floats(-1e6, 1e6, allow_nan=False)

# (scorer, params, references): each valid for the scorer.
SCORED = st.one_of(
    st.tuples(st.just("exact"), st.fixed_dictionaries({}, optional={"strip": st.booleans()}),
              st.lists(TEXT, min_size=1, max_size=3)),
    st.tuples(st.just("normalised"),
              st.fixed_dictionaries({}, optional={"articles": st.booleans(),
                                                  "case": st.booleans()}),
              st.lists(TEXT, min_size=1, max_size=3)),
    st.tuples(st.just("contains"), st.fixed_dictionaries(
        {}, optional={"mode": st.sampled_from(["any", "all"])}),
        st.lists(NON_BLANK, min_size=1, max_size=3)),
    st.tuples(st.just("numeric"), st.fixed_dictionaries(
        {}, optional={"abs_tol": st.floats(0, 10), "rel_tol": st.integers(0, 1)}),
        st.lists(NUMBER, min_size=1, max_size=2)),
    st.tuples(st.just("choice"), st.just({"choices": ["A", "B", "C", "D"]}),
              st.lists(st.sampled_from("ABCD"), min_size=1, max_size=2)),
    st.tuples(st.just("regex"), st.fixed_dictionaries(
        {"pattern": st.sampled_from([r"answer: (\w+)", r"(?i)final\s*=\s*(\d+)"])},
        optional={"flags": st.sampled_from(["", "i", "ms", "si"])}),
        st.lists(TEXT, min_size=1, max_size=2)),
    st.tuples(st.just("json"), st.just({}), st.lists(NUMBER | TEXT, max_size=2)),
    st.tuples(st.just("json_schema"), st.builds(
        lambda keys, const: {"schema": {"type": "object", "required": keys,
                                        "additionalProperties": False,
                                        "properties": {k: {"const": const} for k in keys}}},
        st.lists(st.from_regex(r"[a-z]{1,8}", fullmatch=True), max_size=3, unique=True),
        NUMBER | TEXT), st.just([])),
    st.tuples(st.just("tool_call"), st.just({}), st.lists(st.builds(
        lambda name, args: {"name": name, "arguments": args},
        st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
        st.dictionaries(st.from_regex(r"[a-z]{1,5}", fullmatch=True), NUMBER | TEXT,
                        max_size=3)), min_size=1, max_size=2)),
    st.tuples(st.just("instruction"), st.sampled_from([
        {"words": 5}, {"min_words": 2, "max_words": 9, "case": "lower"},
        {"lines": 3, "starts_with": "Dear", "ends_with": "Thanks.", "forbid": ["sorry", "é"]},
    ]), st.just([])),
)
REQUEST = st.fixed_dictionaries({}, optional={
    "max_tokens": st.integers(1, 4096), "temperature": st.floats(0, 2) | st.integers(0, 2),
    "top_p": st.floats(0.01, 1), "seed": st.integers(0, 2**63 - 1),
    "stop": NON_BLANK | st.lists(NON_BLANK, min_size=1, max_size=4),
    "response_format": st.just({"type": "json_object"}),
})


@st.composite
def raw_item(draw: st.DrawFn, item_id: str) -> dict[str, Any]:
    scorer, params, references = draw(SCORED)
    out: dict[str, Any] = {"id": item_id, "scorer": scorer}
    if draw(st.booleans()):
        out["messages"] = draw(st.lists(MESSAGE, min_size=1, max_size=3))
    else:
        out["prompt"] = draw(TEXT.filter(bool))
    if params or draw(st.booleans()):
        out["params"] = params
    if len(references) == 1 and isinstance(references[0], str) and draw(st.booleans()):
        out["reference"] = references[0]
    elif references or draw(st.booleans()):
        out["references"] = references
    tags = draw(st.lists(TAG, max_size=4, unique=True))
    if tags or draw(st.booleans()):
        out["tags"] = tags
    request = draw(REQUEST)
    if request or draw(st.booleans()):
        out["request"] = request
    return out


@st.composite
def suite_files(draw: st.DrawFn) -> list[bytes]:
    ids = draw(st.lists(st.text(CHARS, min_size=1, max_size=12).filter(str.strip), min_size=1,
                        max_size=6, unique=True))
    lines: list[object] = []
    if draw(st.booleans()):
        header: dict[str, Any] = {"fleetctl_eval_suite": 1}
        if draw(st.booleans()):
            header["description"] = draw(TEXT)
        header["decoding"] = draw(st.fixed_dictionaries({}, optional={
            "temperature": st.floats(0, 2), "seed": st.integers(0, 2**31),
            "max_tokens": st.integers(1, 8192), "top_p": st.floats(0.01, 1)}))
        lines.append(header)
    for item_id in ids:
        if draw(st.booleans()):
            lines.append("")
        lines.append(draw(raw_item(item_id)))
    return lines_of(*lines)


@settings(max_examples=150, deadline=None)
@given(file=suite_files())
def test_parsing_the_canonical_bytes_gives_the_suite_back(file: list[bytes]) -> None:
    suite = parse_suite(file)
    data = canonical(suite)
    again = parse_suite(io.BytesIO(data))
    assert again == suite
    assert canonical(again) == data and digest(canonical(again)) == digest(data)
    assert parse_suite(data.splitlines(keepends=True)) == suite
    assert parse_suite(data.decode().splitlines()) == suite
    assert len(data.decode().splitlines()) == len(suite.items) + 1
