"""The shared JSONL upload reader: line numbers as an editor shows them, blank lines and a
byte-order mark, UTF-8 errors naming the byte, overlong lines skipped without being held,
JSON errors worded by the standard library whichever decoder is installed, the error cap, and
the chat-message check traces and eval suites share. Plain functions, no database."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.core import jsonl
from fleetctl.core.jsonl import (
    DEPTH_MESSAGE,
    MAX_DEPTH,
    MAX_LINE_BYTES,
    JsonlError,
    LineErrors,
    message_problem,
    objects,
    too_deep,
)
from tests.core.hostile import REVIEWED_DEPTHS, with_nested


def read(lines: Any, **kwargs: Any) -> tuple[list[tuple[int, Any]], list[tuple[int, str]]]:
    """What objects() yields and the errors it recorded (without raising at the end)."""
    errors = LineErrors(**kwargs)
    return list(objects(lines, errors)), errors.items


def test_values_come_with_the_line_numbers_an_editor_shows() -> None:
    lines = [b'{"a": 1}\n', b"\n", b"   \r\n", b'[1, 2]\r\n', b'"text"\n', b"null\n"]
    got, errors = read(lines)
    assert got == [(1, {"a": 1}), (4, [1, 2]), (5, "text"), (6, None)]
    assert errors == []


def test_text_lines_and_a_file_object_read_the_same() -> None:
    data = '{"a": "é"}\n\n{"b": [1, 2.5]}\n'
    from_text = read(data.splitlines(keepends=True))
    from_binary = read(io.BytesIO(data.encode()))
    from_text_file = read(io.StringIO(data))
    assert from_text == from_binary == from_text_file == ([(1, {"a": "é"}),
                                                          (3, {"b": [1, 2.5]})], [])


def test_a_last_line_without_newline_is_read() -> None:
    assert read(io.BytesIO(b'{"a": 1}\n{"a": 2}'))[0] == [(1, {"a": 1}), (2, {"a": 2})]


def test_a_byte_order_mark_is_accepted_on_line_one_only() -> None:
    bom = b"\xef\xbb\xbf"
    got, errors = read([bom + b'{"a": 1}\n', bom + b'{"a": 2}\n'])
    assert got == [(1, {"a": 1})]
    assert errors == [(2, "is not valid JSON (Unexpected UTF-8 BOM (decode using utf-8-sig) "
                          "at column 1)")]


def test_bad_utf8_names_the_byte_and_the_file_kind() -> None:
    got, errors = read([b'{"a": "caf\xe9"}\n'], what="suite")
    assert got == []
    assert errors == [(1, "is not valid UTF-8 (byte 0xe9 at column 11); save the suite as UTF-8")]


def test_bad_json_is_worded_by_the_standard_library() -> None:
    _, errors = read([b'{"a": 1,, }\n', b"{oops\n", b"[1, 2\n"])
    assert errors == [
        (1, "is not valid JSON (Expecting property name enclosed in double quotes at column 9)"),
        (2, "is not valid JSON (Expecting property name enclosed in double quotes at column 2)"),
        (3, "is not valid JSON (Expecting ',' delimiter at column 6)"),
    ]


def test_nan_and_infinity_are_refused_unless_allowed() -> None:
    lines = [b'{"x": NaN}\n', b'{"x": -Infinity}\n', b'{"x": [1e400]}\n', b'{"x": 1e308}\n']
    errors = LineErrors()
    got = list(objects(lines, errors))
    assert got == [(4, {"x": 1e308})]
    assert errors.items == [
        (1, "is not valid JSON (NaN is not a JSON number; write a finite number, or a string)"),
        (2, "is not valid JSON (-Infinity is not a JSON number; write a finite number, or a "
            "string)"),
        (3, "holds a number too large for JSON (it reads as infinity); write a smaller number, "
            "or a string"),
    ]
    allowed = list(objects(lines[:1], LineErrors(), allow_nan=True))
    assert allowed[0][0] == 1 and allowed[0][1]["x"] != allowed[0][1]["x"]  # NaN


def test_json_nested_too_deeply_is_a_line_error_not_a_crash() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000 + b"\n"
    got, errors = read([deep, b"1\n"])
    assert got == [(2, 1)]
    assert errors == [(1, DEPTH_MESSAGE)]


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, *REVIEWED_DEPTHS])
@pytest.mark.parametrize("decoder", ["pydantic-core", "standard library"])
def test_a_line_nested_deeper_than_the_limit_is_refused_naming_it(
        depth: int, decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if decoder == "standard library":
        monkeypatch.setattr(jsonl, "fast_loads", jsonl.stdlib_loads)
    lines = [b'{"a": 1}\n', with_nested({"deep": "@NESTED@"}, depth - 1).encode() + b"\n",
             b'{"b": 2}\n']
    got, errors = read(lines)
    assert got == [(1, {"a": 1}), (3, {"b": 2})]
    assert errors == [(2, DEPTH_MESSAGE)]
    assert JsonlError(errors).messages() == [
        "line 2: is nested deeper than 64 levels (arrays and objects inside each other), "
        "the depth limit"]


def test_a_line_nested_to_the_limit_is_read_and_brackets_in_strings_are_not_nesting() -> None:
    at_limit = with_nested({"deep": "@NESTED@"}, MAX_DEPTH - 1)
    brackets = json.dumps({"text": "[{" * 500, "list": [[[]]]})
    got, errors = read([at_limit + "\n", brackets + "\n"])
    assert errors == []
    assert [n for n, _ in got] == [1, 2] and got[1][1]["text"] == "[{" * 500


def test_depth_is_measured_without_recursion() -> None:
    value: Any = 1
    for _ in range(200_000):  # far past the interpreter's stack
        value = [value]
    assert too_deep(value) and too_deep(value, limit=199_999)
    assert not too_deep(value, limit=200_000)
    assert not too_deep([]) and too_deep([], limit=0) and not too_deep("x", limit=0)
    assert too_deep({"a": [{}]}, limit=2) and not too_deep({"a": [{}]}, limit=3)


def overlong() -> bytes:
    return json.dumps({"text": "x" * (MAX_LINE_BYTES + 10)}).encode() + b"\n"


def test_an_overlong_line_in_a_file_is_skipped_in_pieces_and_reading_goes_on() -> None:
    data = b'{"a": 1}\n' + overlong() + b'{"a": 3}\n'
    got, errors = read(io.BytesIO(data))
    assert got == [(1, {"a": 1}), (3, {"a": 3})]
    assert errors == [(2, "is longer than 1,048,576 bytes (1 MiB), the line limit")]


def test_an_overlong_line_from_a_list_is_an_error_too() -> None:
    got, errors = read([b'{"a": 1}\n', overlong()])
    assert got == [(1, {"a": 1})]
    assert errors == [(2, jsonl.OVERLONG_MESSAGE)]


def test_a_line_of_exactly_the_limit_is_read() -> None:
    head = b'{"t": "'
    line = head + b"y" * (MAX_LINE_BYTES - len(head) - 2) + b'"}'
    assert len(line) == MAX_LINE_BYTES
    [(n, value)] = read(io.BytesIO(line + b"\r\n"))[0]
    assert n == 1 and len(value["t"]) == MAX_LINE_BYTES - len(head) - 2


def test_errors_stop_at_the_cap_and_reading_stops_with_them() -> None:
    consumed = 0

    def lines() -> Iterator[bytes]:
        nonlocal consumed
        for _ in range(100):
            consumed += 1
            yield b"{bad\n"

    errors = LineErrors(5)
    with pytest.raises(JsonlError) as caught:
        list(objects(lines(), errors))
    assert consumed == 5
    assert caught.value.truncated and [n for n, _ in caught.value.errors] == [1, 2, 3, 4, 5]
    assert caught.value.messages()[-1] == "(stopped after 5 errors)"
    assert str(caught.value).splitlines() == caught.value.messages()


def test_messages_number_lines_and_leave_line_zero_bare() -> None:
    error = JsonlError([(0, "the file has no rows"), (3, "id: missing")])
    assert error.messages() == ["the file has no rows", "line 3: id: missing"]
    assert str(error) == "the file has no rows\nline 3: id: missing"
    assert isinstance(error, ValueError) and not error.truncated


def test_finish_raises_with_the_errors_or_when_nothing_was_read() -> None:
    class RowsError(JsonlError):
        pass

    errors = LineErrors(error=RowsError)
    errors.finish(3, empty="no rows")  # nothing wrong: returns
    with pytest.raises(RowsError) as caught:
        errors.finish(0, empty="the file has no rows; add one")
    assert caught.value.errors == [(0, "the file has no rows; add one")]
    errors.add(2, "bad")
    assert errors
    with pytest.raises(RowsError) as caught:
        errors.finish(5, empty="no rows")
    assert caught.value.errors == [(2, "bad")] and not caught.value.truncated


def test_stop_records_and_raises_at_once() -> None:
    errors = LineErrors()
    with pytest.raises(JsonlError) as caught:
        errors.stop(7, "more than 5 rows, the limit")
    assert caught.value.errors == [(7, "more than 5 rows, the limit")]


def test_max_errors_must_be_a_positive_integer() -> None:
    for bad in (0, -1, 2.5, "20"):
        with pytest.raises(ValueError, match="max_errors must be a positive integer"):
            LineErrors(bad)  # type: ignore[arg-type]


def test_an_empty_input_yields_nothing() -> None:
    assert read([]) == ([], [])
    assert read(io.BytesIO(b"")) == ([], [])
    assert read(io.BytesIO(b"\n\n  \n")) == ([], [])


def test_results_do_not_depend_on_the_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [b'\xef\xbb\xbf{"a": 1}\n', b"\n", b'{"b": [1, 2.5, "\xc3\xa9", null, true]}\n',
             b"{oops\n", b'{"c": NaN}\n', b'"caf\xe9"\n', overlong(), b"[1e999]\n",
             b'{"d": 12345678901234567890123}\n', b'{"dup": 1, "dup": 2}\n']

    def outcome() -> tuple[list[tuple[int, Any]], list[tuple[int, str]]]:
        return read(lines, max_errors=100)

    fast = outcome()
    monkeypatch.setattr(jsonl, "fast_loads", jsonl.stdlib_loads)
    assert outcome() == fast
    assert [n for n, _ in fast[0]] == [1, 3, 9, 10]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(), lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12), max_size=8),
    blank_every=st.integers(2, 5))
def test_any_json_written_one_per_line_reads_back(values: list[Any], blank_every: int) -> None:
    lines: list[bytes] = []
    expected: list[tuple[int, Any]] = []
    for value in values:
        if len(lines) % blank_every == blank_every - 1:
            lines.append(b"\n")
        lines.append(json.dumps(value, ensure_ascii=False).encode() + b"\n")
        expected.append((len(lines), value))
    for source in (lines, io.BytesIO(b"".join(lines))):
        got, errors = read(source)
        assert errors == [] and got == expected


# --- chat messages ---------------------------------------------------------------------------


@pytest.mark.parametrize(("messages", "expected"), [
    ([], ("messages", "must be a non-empty list of chat messages, got []")),
    ("hi", ("messages", 'must be a non-empty list of chat messages, got "hi"')),
    (["hi"], ("messages[0]", 'must be an object with role and content, got "hi"')),
    ([{"role": "bot", "content": "x"}],
     ("messages[0].role", 'must be one of system, user, assistant, tool, developer; got "bot"')),
    ([{"role": "user"}], ("messages[0]", "has no content")),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": None}],
     ("messages[1].content", "is null; only an assistant message with tool_calls may omit it")),
    ([{"role": "user", "content": 5}],
     ("messages[0].content", "must be a string or a non-empty list of parts, got 5")),
    ([{"role": "user", "content": [{"text": "x"}]}],
     ("messages[0].content[0]", 'must be an object with a string type, got {"text": "x"}')),
])
def test_message_problems_name_the_field(messages: object, expected: tuple[str, str]) -> None:
    assert message_problem(messages) == expected


def test_messages_that_are_fine() -> None:
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": ""},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "1", "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "42", "tool_call_id": "1"},
            {"role": "developer", "content": [{"type": "text", "text": "hi"}]}]
    assert message_problem(chat) is None
    assert message_problem(chat[:4], parts=False) is None


def test_without_parts_content_must_be_a_string() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert message_problem(parts, parts=False) == \
        ("messages[0].content", 'must be a string, got [{"type": "text", "text": "hi"}]')


def test_show_quotes_json_and_cuts_long_values() -> None:
    assert jsonl.show("é") == '"é"'
    assert jsonl.show({"a": [1]}) == '{"a": [1]}'
    assert jsonl.show(b"x") == "b'x'"
    long = jsonl.show("x" * 100)
    assert len(long) == 60 and long.endswith("...")
