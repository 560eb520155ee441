"""Request traces: the fleetctl format, the Mooncake and Azure importers, the synthetic
generator and the summary. Plain functions, no database: traces.py has no Django in it."""

from __future__ import annotations

import io
import itertools
import json
import math
import statistics
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.bench.traces import (
    MAX_LINE_BYTES,
    Arrival,
    Dist,
    TraceError,
    TraceHeader,
    TraceRequest,
    TraceSummariser,
    detect_format,
    generate,
    parse_azure_csv,
    parse_jsonl,
    parse_mooncake,
    parse_trace,
    summarise,
    write_jsonl,
)
from tests.core.hostile import REVIEWED_DEPTHS, with_nested

SAMPLES = Path(__file__).parent / "samples"


def lines_of(*objects: object) -> list[bytes]:
    return [(o if isinstance(o, str) else json.dumps(o)).encode() + b"\n" for o in objects]


def req(arrival_s: float = 0.0, **fields: object) -> dict[str, object]:
    return {"arrival_s": arrival_s, "prompt_tokens": 100, "completion_tokens": 20, **fields}


def errors_of(lines: list[bytes], **kwargs: int) -> list[tuple[int, str]]:
    with pytest.raises(TraceError) as caught:
        list(parse_jsonl(lines, **kwargs))
    return caught.value.errors


def only_error(lines: list[bytes]) -> str:
    """The one error as the user reads it: `line N: message`."""
    with pytest.raises(TraceError) as caught:
        list(parse_jsonl(lines))
    assert len(caught.value.errors) == 1, caught.value.errors
    return str(caught.value)


def feature_rich_trace(n: int = 300) -> list[TraceRequest]:
    base = list(generate(n=n, seed=3, prompt_tokens=Dist.lognormal(700, 1.0, lo=8, hi=30_000),
                         completion_tokens=Dist.uniform(1, 900), arrival=Arrival.poisson(40),
                         shared_prefix_groups=3, shared_prefix_tokens=256,
                         latency_class="standard"))
    chat = [{"role": "system", "content": "Be brief. Ünïcode ✓"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    return [*base,
            TraceRequest(prompt_tokens=9, completion_tokens=5, arrival_s=base[-1].arrival_s,
                         prompt="Say hello in French."),
            TraceRequest(prompt_tokens=30, completion_tokens=7, arrival_s=base[-1].arrival_s + 1,
                         messages=chat, latency_class="batch")]


# --- the fleetctl format: round trip and sample -------------------------------------------------


@pytest.mark.parametrize("mode", ["binary", "text"])
def test_a_written_trace_reads_back_identically(tmp_path: Path, mode: str) -> None:
    original = feature_rich_trace()
    path = tmp_path / "trace.jsonl"
    header = TraceHeader(name="round-trip", description="every field")
    with open(path, "wb" if mode == "binary" else "w") as fp:
        assert write_jsonl(original, fp, header=header) == len(original)

    with open(path, "rb" if mode == "binary" else "r") as fp:
        stream = parse_jsonl(fp)
        read = list(stream)

    assert read == original
    assert stream.header == header
    assert stream.format == "fleetctl"


def test_integer_arrivals_are_read_as_floats() -> None:
    [request] = parse_jsonl(lines_of(req(arrival_s=3)))
    assert request.arrival_s == 3.0 and type(request.arrival_s) is float


def test_the_fleetctl_sample_reads_with_its_header() -> None:
    with open(SAMPLES / "fleetctl_sample.jsonl", "rb") as fp:
        stream = parse_jsonl(fp)
        requests = list(stream)

    assert len(requests) == 29
    assert stream.header == TraceHeader(
        name="support-assistant-sample",
        description="A support chat assistant: one shared system prompt, a RAG prefix, "
                    "mixed latency classes.")
    assert requests[0] == TraceRequest(prompt_tokens=1450, completion_tokens=212, arrival_s=0.0,
                                       prefix_group="support-system-v3", prefix_tokens=1200,
                                       latency_class="interactive")
    assert requests[2].messages is not None and requests[2].messages[1]["role"] == "user"
    assert requests[-1] == TraceRequest(prompt_tokens=6144, completion_tokens=900,
                                        arrival_s=10.9, latency_class="batch")


def test_blank_lines_and_crlf_endings_are_fine_and_keep_line_numbers() -> None:
    lines = [b"\n", json.dumps(req(0.5)).encode() + b"\r\n", b"   \r\n",
             json.dumps(req(0.25)).encode() + b"\r\n"]
    errors = errors_of(lines)
    assert errors == [(4, "arrival_s 0.25 is earlier than 0.5 on line 2; arrival offsets "
                          "must not decrease (sort the trace by arrival)")]


def test_a_byte_order_mark_on_the_first_line_is_tolerated() -> None:
    lines = [b"\xef\xbb\xbf" + json.dumps(req()).encode() + b"\n"]
    assert [r.prompt_tokens for r in parse_jsonl(lines)] == [100]


def test_text_lines_work_too() -> None:
    text = io.StringIO(json.dumps(req()) + "\n" + json.dumps(req(1.0)) + "\n")
    assert len(list(parse_jsonl(text))) == 2


# --- the fleetctl format: bad input, each with its line number ---------------------------------


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("completion_tokens", -3, "line 2: completion_tokens must be a positive integer, got -3"),
    ("prompt_tokens", 0, "line 2: prompt_tokens must be a positive integer, got 0"),
    ("prompt_tokens", 12.5, "line 2: prompt_tokens must be a positive integer, got 12.5"),
    ("prompt_tokens", "100", 'line 2: prompt_tokens must be a positive integer, got "100"'),
    ("prompt_tokens", True, "line 2: prompt_tokens must be a positive integer, got true"),
    ("completion_tokens", 20_000_000,
     "line 2: completion_tokens must be at most 10,000,000, got 20,000,000"),
    ("arrival_s", -0.5, "line 2: arrival_s must be a finite number of seconds ≥ 0, got -0.5"),
    ("arrival_s", "soon", 'line 2: arrival_s must be a finite number of seconds ≥ 0, got "soon"'),
    ("latency_class", "urgent", "line 2: latency_class must be one of interactive, standard, "
                                'batch, got "urgent"'),
    ("prefix_tokens", 500, "line 2: prefix_tokens (500) cannot exceed prompt_tokens (100)"),
    ("prefix_tokens", 50, "line 2: prefix_tokens needs a prefix_group naming the requests "
                          "that share it"),
    ("prefix_tokens", -1, "line 2: prefix_tokens must be an integer ≥ 0, got -1"),
    ("prefix_group", "", 'line 2: prefix_group must be a non-empty string of at most 200 '
                         'characters, got ""'),
    ("prompt", "", 'line 2: prompt must be a non-empty string, got ""'),
])
def test_a_bad_field_is_named_with_its_line(field: str, value: object, expected: str) -> None:
    line = {**req(1.0), field: value}
    assert only_error(lines_of(req(), line)) == expected


def test_a_missing_key_is_named() -> None:
    line = {"arrival_s": 0, "prompt_tokens": 5}
    assert only_error(lines_of(req(), line)) == \
        "line 2: missing required key completion_tokens"


def test_an_unknown_key_is_named_even_next_to_a_missing_one() -> None:
    line = {"arrival_s": 0, "promt_tokens": 5, "completion_tokens": 5}
    message = only_error(lines_of(line))
    assert message.startswith("line 1: missing required key prompt_tokens; unknown key "
                              "promt_tokens (allowed: arrival_s, completion_tokens, ")


def test_an_extra_unknown_key_is_an_error_not_silently_dropped() -> None:
    assert only_error(lines_of(req(model="llama"))).startswith("line 1: unknown key model ")


def test_bad_json_says_where() -> None:
    lines = lines_of(req(), '{"arrival_s": 1, "prompt_tokens": 5,, }')
    assert only_error(lines) == \
        "line 2: is not valid JSON (Expecting property name enclosed in double quotes at " \
        "column 37)"


DEPTH_REFUSED = ("is nested deeper than 64 levels (arrays and objects inside each other), the "
                 "depth limit")


@pytest.mark.parametrize("depth", [65, *REVIEWED_DEPTHS])
def test_a_line_nested_deeper_than_the_limit_is_refused_naming_it(depth: int) -> None:
    # Messages are where a fleetctl trace line nests: {"messages": [{"content": [part]}]}.
    part = {"type": "text", "text": "hi", "extra": "@NESTED@"}
    deep = with_nested(req(1.0, messages=[{"role": "user", "content": [part]}]), depth - 5)
    assert only_error(lines_of(req(), deep)) == f"line 2: {DEPTH_REFUSED}"
    mooncake = with_nested({"timestamp": 1, "input_length": 10, "output_length": 5,
                            "hash_ids": [1], "note": "@NESTED@"}, depth - 1)
    with pytest.raises(TraceError) as caught:
        list(parse_mooncake(lines_of(mooncake)))
    assert caught.value.errors == [(1, DEPTH_REFUSED)]


def test_a_first_line_too_deep_to_decode_is_no_trace_format_not_a_crash() -> None:
    with pytest.raises(TraceError, match="is not a trace format"):
        detect_format(with_nested({"prompt_tokens": "@NESTED@"}, 5000))


def test_a_line_nested_to_the_limit_is_read() -> None:
    part = {"type": "text", "text": "hi", "extra": "@NESTED@"}
    fits = with_nested(req(1.0, messages=[{"role": "user", "content": [part]}]), 59)  # 64
    assert len(list(parse_jsonl(lines_of(fits)))) == 1


def test_a_line_that_is_not_an_object_is_refused() -> None:
    assert only_error(lines_of("[1, 2]")) == "line 1: must be a JSON object, got [1, 2]"


def test_nan_is_not_a_number_of_seconds() -> None:
    line = '{"arrival_s": NaN, "prompt_tokens": 5, "completion_tokens": 5}'
    assert only_error(lines_of(line)) == \
        "line 1: arrival_s must be a finite number of seconds ≥ 0, got NaN"


def test_arrival_going_backwards_names_both_offsets() -> None:
    lines = lines_of(req(0.0), req(4.5), req(3.2))
    assert only_error(lines) == ("line 3: arrival_s 3.2 is earlier than 4.5 on line 2; arrival "
                                 "offsets must not decrease (sort the trace by arrival)")


@pytest.mark.parametrize("lines", [
    [], [b"\n", b"  \n"],
    lines_of({"fleetctl_trace": 1, "name": "just a header"}),
])
def test_an_empty_trace_is_an_error(lines: list[bytes]) -> None:
    assert errors_of(lines) == [(0, "the trace has no requests")]


def test_non_utf8_bytes_are_a_line_error() -> None:
    bad = b'{"arrival_s": 0, "prompt_tokens": 5, "completion_tokens": 5, "prompt": "caf\xe9"}\n'
    assert only_error([*lines_of(req()), bad]) == \
        "line 2: is not valid UTF-8 (byte 0xe9 at column 76); save the trace as UTF-8"


def overlong_line() -> bytes:
    padding = "x" * (MAX_LINE_BYTES + 10)
    return json.dumps(req(1.0, prompt=padding)).encode() + b"\n"


def test_an_overlong_line_in_a_file_is_skipped_not_loaded() -> None:
    data = b"".join([*lines_of(req()), overlong_line(), *lines_of(req(2.0), req(1.5))])
    with pytest.raises(TraceError) as caught:
        list(parse_jsonl(io.BytesIO(data)))
    assert caught.value.errors == [
        (2, "is longer than 1,048,576 bytes (1 MiB), the line limit"),
        (4, "arrival_s 1.5 is earlier than 2 on line 3; arrival offsets must not decrease "
            "(sort the trace by arrival)"),
    ]


def test_an_overlong_line_from_an_iterable_is_an_error_too() -> None:
    assert only_error([*lines_of(req()), overlong_line()]) == \
        "line 2: is longer than 1,048,576 bytes (1 MiB), the line limit"


def test_a_line_of_exactly_the_limit_is_accepted() -> None:
    head = json.dumps(req(prompt="")).encode()[:-2]  # ..."prompt": "
    prompt_len = MAX_LINE_BYTES - len(head) - 2
    line = head + b"y" * prompt_len + b'"}'
    assert len(line) == MAX_LINE_BYTES
    [request] = parse_jsonl(io.BytesIO(line + b"\r\n"))
    assert request.prompt is not None and len(request.prompt) == prompt_len


@pytest.mark.parametrize(("messages", "expected"), [
    ([], "messages must be a non-empty list of chat messages, got []"),
    ("hello", 'messages must be a non-empty list of chat messages, got "hello"'),
    (["hello"], 'messages[0] must be an object with role and content, got "hello"'),
    ([{"role": "bot", "content": "hi"}],
     'messages[0].role must be one of system, user, assistant, tool, developer; got "bot"'),
    ([{"role": "user"}], "messages[0] has no content"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": None}],
     "messages[1].content is null; only an assistant message with tool_calls may omit it"),
    ([{"role": "user", "content": 5}],
     "messages[0].content must be a string or a non-empty list of parts, got 5"),
    ([{"role": "user", "content": [{"text": "no type"}]}],
     'messages[0].content[0] must be an object with a string type, got {"text": "no type"}'),
])
def test_bad_messages_say_which_message_and_what(messages: object, expected: str) -> None:
    assert only_error(lines_of(req(messages=messages))) == f"line 1: {expected}"


def test_prompt_and_messages_exclude_each_other() -> None:
    line = req(prompt="hi", messages=[{"role": "user", "content": "hi"}])
    assert only_error(lines_of(line)) == "line 1: give either prompt or messages, not both"


def test_the_header_is_checked_and_only_allowed_first() -> None:
    assert errors_of(lines_of({"fleetctl_trace": 2}, req())) == \
        [(1, "fleetctl_trace must be 1 (the format version this fleetctl reads), got 2")]
    assert errors_of(lines_of({"fleetctl_trace": 1, "author": "me"}, req()))[0][1] \
        .startswith("unknown header key author")
    assert errors_of(lines_of(req(), {"fleetctl_trace": 1})) == \
        [(2, "a header line is only allowed as the first line")]


def test_errors_are_collected_up_to_the_cap_then_reading_stops() -> None:
    consumed = 0

    def lines() -> Iterator[bytes]:
        nonlocal consumed
        for i in range(1000):
            consumed += 1
            yield json.dumps(req(float(i), completion_tokens=-1)).encode()

    with pytest.raises(TraceError) as caught:
        list(parse_jsonl(lines(), max_errors=20))

    assert caught.value.truncated
    assert [n for n, _ in caught.value.errors] == list(range(1, 21))
    assert consumed == 20
    assert str(caught.value).splitlines()[0] == \
        "line 1: completion_tokens must be a positive integer, got -1"
    assert str(caught.value).splitlines()[-1] == "(stopped after 20 errors)"


def test_after_a_bad_line_nothing_more_is_yielded_but_all_errors_are_reported() -> None:
    lines = lines_of(req(0.0), req(1.0, prompt_tokens=-5), req(2.0), req(3.0, prompt_tokens=0))
    stream = parse_jsonl(lines)
    assert next(stream).arrival_s == 0.0
    with pytest.raises(TraceError) as caught:
        next(stream)
    assert [n for n, _ in caught.value.errors] == [2, 4]
    assert not caught.value.truncated


def test_more_requests_than_the_limit_stops_at_once() -> None:
    assert errors_of(lines_of(req(0.0), req(1.0), req(2.0), req(3.0)), max_requests=2) == \
        [(3, "the trace has more than 2 requests, the limit; split it into smaller traces")]


def test_reader_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_errors must be a positive integer"):
        parse_jsonl([], max_errors=0)


def test_requests_built_directly_are_validated_the_same_way() -> None:
    with pytest.raises(ValueError, match="completion_tokens must be a positive integer, got 0"):
        TraceRequest(prompt_tokens=5, completion_tokens=0, arrival_s=0.0)
    with pytest.raises(ValueError, match="latency_class must be one of"):
        TraceRequest(prompt_tokens=5, completion_tokens=5, arrival_s=0.0, latency_class="x")


# --- streaming --------------------------------------------------------------------------------


def test_the_reader_pulls_only_the_lines_it_needs() -> None:
    def lines() -> Iterator[bytes]:
        for i in range(10):
            yield json.dumps(req(float(i))).encode()
        raise RuntimeError("read past what the caller asked for")

    first_five = list(itertools.islice(parse_jsonl(lines()), 5))
    assert [r.arrival_s for r in first_five] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_200k_line_file_is_read_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fp:
        write_jsonl(generate(n=200_000, seed=11, prompt_tokens=Dist.uniform(10, 4000),
                             completion_tokens=Dist.uniform(1, 500), arrival=Arrival.poisson(100),
                             shared_prefix_groups=5, shared_prefix_tokens=64), fp)
    assert path.stat().st_size > 15_000_000

    tracemalloc.start()
    try:
        with open(path, "rb") as fp:
            summary = summarise(parse_jsonl(fp))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert summary.request_count == 200_000
    assert peak < 3_000_000, f"peak {peak:,} bytes while streaming a {path.stat().st_size:,} B file"


# --- importers --------------------------------------------------------------------------------


def test_the_mooncake_sample_imports_with_arrivals_and_prefix_groups() -> None:
    with open(SAMPLES / "mooncake_sample.jsonl", "rb") as fp:
        stream = parse_mooncake(fp)
        requests = list(stream)

    assert stream.format == "mooncake"
    assert len(requests) == 40
    assert requests[0] == TraceRequest(prompt_tokens=1138, completion_tokens=135, arrival_s=0.0)
    assert requests[-1] == TraceRequest(prompt_tokens=9802, completion_tokens=34,
                                        arrival_s=38.986)
    # Line 4 shares hash ids 17-20 with line 3, the first request of group 17: 4 blocks.
    assert requests[3] == TraceRequest(prompt_tokens=6697, completion_tokens=80, arrival_s=5.636,
                                       prefix_group="mooncake-17", prefix_tokens=2048)
    # Line 15 shares 3 blocks (1536 tokens) but is only 1346 tokens long: capped.
    assert (requests[14].prefix_group, requests[14].prefix_tokens) == ("mooncake-0", 1346)
    assert requests[2].prefix_group is None  # the group's first request shares nothing yet
    assert sum(r.prefix_group is not None for r in requests) == 21


def test_mooncake_errors_carry_line_numbers() -> None:
    lines = lines_of(
        {"timestamp": 1000, "input_length": 10, "output_length": 5, "hash_ids": [1]},
        {"timestamp": 900, "input_length": 10, "output_length": 5, "hash_ids": [2]},
        {"timestamp": 1100, "input_length": 0, "output_length": 5},
        {"timestamp": 1200, "input_length": 10},
        {"timestamp": 1300, "input_length": 10, "output_length": 5, "hash_ids": "x"},
    )
    with pytest.raises(TraceError) as caught:
        list(parse_mooncake(lines))
    assert caught.value.errors == [
        (2, "timestamp 900 is earlier than 1000 on line 1; arrival offsets must not decrease "
            "(sort the trace by arrival)"),
        (3, "input_length must be a positive integer, got 0"),
        (4, "missing required key output_length"),
        (5, 'hash_ids must be a list of integers, got "x"'),
    ]


def test_the_azure_sample_imports_with_100ns_arrivals() -> None:
    with open(SAMPLES / "azure_code_sample.csv", "rb") as fp:
        stream = parse_azure_csv(fp)
        requests = list(stream)

    assert stream.format == "azure-csv"
    assert len(requests) == 45
    assert requests[0] == TraceRequest(prompt_tokens=3855, completion_tokens=50, arrival_s=0.0)
    assert requests[1].arrival_s == 0.2014397  # 18:15:46.8820297 − 18:15:46.6805900
    assert requests[-1] == TraceRequest(prompt_tokens=920, completion_tokens=9,
                                        arrival_s=18.8518761)  # 18:16:05.5324661


def test_azure_rows_with_crlf_a_bom_and_a_2024_style_timestamp_are_read() -> None:
    data = ("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\r\n"
            "2024-05-10 23:59:59.990000+00:00,100,10\r\n"
            "2024-05-11 00:00:00.5+00:00,200,20\r\n").encode()
    requests = list(parse_azure_csv(io.BytesIO(data)))
    assert [(r.arrival_s, r.prompt_tokens) for r in requests] == [(0.0, 100), (0.51, 200)]


def test_azure_errors_carry_line_numbers() -> None:
    data = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.6805900,100,10\n"
            "2023-11-16 18:15:45.0000000,100,10\n"
            "2023-11-16 18:15:47,100,0\n"
            "yesterday,100,10\n"
            "2023-11-16 18:15:48.1,100\n"
            "2023-02-30 18:15:48.1,100,10\n"
            "2023-11-16 18:15:49.1,many,10\n"
            "2023-11-16 18:15:61.5,100,10\n")
    with pytest.raises(TraceError) as caught:
        list(parse_azure_csv(io.StringIO(data)))
    assert caught.value.errors == [
        (3, "TIMESTAMP -1.68059 is earlier than 0 on line 2; arrival offsets must not "
            "decrease (sort the trace by arrival)"),
        (4, "GeneratedTokens must be a positive integer, got 0"),
        (5, 'TIMESTAMP must look like 2023-11-16 18:15:46.6805900, got "yesterday"'),
        (6, "must have 3 comma-separated fields (TIMESTAMP,ContextTokens,GeneratedTokens), "
            "got 2"),
        (7, "TIMESTAMP has an impossible date: 2023-02-30"),
        (8, 'ContextTokens must be a positive integer, got "many"'),
        (9, 'TIMESTAMP has an impossible time of day: "2023-11-16 18:15:61.5"'),
    ]


def test_an_azure_file_with_the_wrong_header_is_refused_at_once() -> None:
    data = "timestamp,contexttokens,generatedtokens\n2023-11-16 18:15:46.68,1,1\n"
    with pytest.raises(TraceError) as caught:
        list(parse_azure_csv(io.StringIO(data)))
    assert caught.value.errors == [
        (1, "the first line must be the header TIMESTAMP,ContextTokens,GeneratedTokens, got "
            '"timestamp,contexttokens,generatedtokens"')]


@pytest.mark.parametrize(("name", "trace_format", "count"), [
    ("fleetctl_sample.jsonl", "fleetctl", 29),
    ("mooncake_sample.jsonl", "mooncake", 40),
    ("azure_code_sample.csv", "azure-csv", 45),
])
def test_formats_are_detected_from_the_first_line(name: str, trace_format: str,
                                                  count: int) -> None:
    with open(SAMPLES / name, "rb") as fp:
        assert detect_format(fp.readline()) == trace_format
    with open(SAMPLES / name, "rb") as fp:
        stream = parse_trace(fp)
        assert stream.format == trace_format
        assert len(list(stream)) == count


def test_an_unknown_format_is_refused_on_its_first_non_blank_line() -> None:
    with pytest.raises(TraceError) as caught:
        parse_trace(io.BytesIO(b"\n\nprompt,tokens\n"))
    assert caught.value.errors[0][0] == 3
    assert "is not a trace format fleetctl reads" in caught.value.errors[0][1]
    with pytest.raises(TraceError, match="the trace has no requests"):
        parse_trace(io.BytesIO(b"\n \n"))


def test_parse_trace_keeps_file_line_numbers() -> None:
    data = b"\n" + b"".join(lines_of(req(), req(1.0, prompt_tokens=-1)))
    with pytest.raises(TraceError) as caught:
        list(parse_trace(io.BytesIO(data)))
    assert caught.value.errors == [(3, "prompt_tokens must be a positive integer, got -1")]


# --- the generator ----------------------------------------------------------------------------


def poisson_trace(n: int, seed: int, rate: float = 10.0) -> list[TraceRequest]:
    return list(generate(n=n, seed=seed, prompt_tokens=Dist.lognormal(500, 0.8),
                         completion_tokens=Dist.constant(64), arrival=Arrival.poisson(rate)))


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    assert poisson_trace(500, seed=1) == poisson_trace(500, seed=1)
    assert poisson_trace(500, seed=1) != poisson_trace(500, seed=2)


def test_poisson_arrivals_have_the_configured_mean_rate() -> None:
    trace = poisson_trace(20_000, seed=5, rate=25.0)
    rate = (len(trace) - 1) / trace[-1].arrival_s
    assert rate == pytest.approx(25.0, rel=0.03)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(trace)]
    # Exponential gaps: the standard deviation equals the mean.
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)


def test_lognormal_lengths_have_the_configured_median() -> None:
    trace = poisson_trace(20_000, seed=9)
    assert statistics.median(r.prompt_tokens for r in trace) == pytest.approx(500, rel=0.03)
    assert {r.completion_tokens for r in trace} == {64}


def test_lognormal_lengths_are_clipped() -> None:
    dist = Dist.lognormal(1000, 2.0, lo=100, hi=2000)
    trace = generate(n=5000, seed=1, prompt_tokens=dist, completion_tokens=dist,
                     arrival=Arrival.constant(1.0))
    values = [r.prompt_tokens for r in trace]
    assert min(values) == 100 and max(values) == 2000


def test_bursty_arrivals_keep_the_mean_rate_but_cluster() -> None:
    trace = list(generate(n=20_000, seed=4, prompt_tokens=Dist.constant(10),
                          completion_tokens=Dist.constant(10),
                          arrival=Arrival.bursty(rate=20.0, burstiness=0.25)))
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(trace)]
    assert 1 / statistics.fmean(gaps) == pytest.approx(20.0, rel=0.05)
    # Gamma(shape k): coefficient of variation 1/sqrt(k) = 2 for k = 0.25.
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(2.0, rel=0.1)


def test_on_off_arrivals_run_at_the_burst_rate_then_the_base_rate() -> None:
    trace = list(generate(n=20_000, seed=8, prompt_tokens=Dist.constant(10),
                          completion_tokens=Dist.constant(10),
                          arrival=Arrival.on_off(base_rate=5.0, burst_rate=50.0, on_s=10.0,
                                                 off_s=30.0)))
    in_bursts = sum(1 for r in trace if r.arrival_s % 40.0 < 10.0)
    periods = trace[-1].arrival_s / 40.0
    assert in_bursts / (periods * 10.0) == pytest.approx(50.0, rel=0.05)
    assert (len(trace) - in_bursts) / (periods * 30.0) == pytest.approx(5.0, rel=0.1)


def test_constant_arrivals_are_evenly_spaced() -> None:
    trace = list(generate(n=5, seed=0, prompt_tokens=Dist.empirical([7]),
                          completion_tokens=Dist.uniform(3, 3), arrival=Arrival.constant(4.0)))
    assert [r.arrival_s for r in trace] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert {(r.prompt_tokens, r.completion_tokens) for r in trace} == {(7, 3)}


def test_shared_prefix_groups_put_the_prefix_before_each_drawn_prompt() -> None:
    trace = list(generate(n=4000, seed=2, prompt_tokens=Dist.uniform(1, 100),
                          completion_tokens=Dist.constant(8), arrival=Arrival.poisson(50),
                          shared_prefix_groups=4, shared_prefix_tokens=1000,
                          latency_class="interactive"))
    assert {r.prefix_group for r in trace} == {"group-0", "group-1", "group-2", "group-3"}
    assert {r.prefix_tokens for r in trace} == {1000}
    assert min(r.prompt_tokens for r in trace) == 1001
    assert max(r.prompt_tokens for r in trace) == 1100
    assert {r.latency_class for r in trace} == {"interactive"}
    counts = [sum(r.prefix_group == f"group-{g}" for r in trace) for g in range(4)]
    assert min(counts) > 850  # about 1000 each


def test_empirical_draws_only_given_values() -> None:
    trace = generate(n=2000, seed=3, prompt_tokens=Dist.empirical([10, 10, 10, 500]),
                     completion_tokens=Dist.constant(1), arrival=Arrival.constant(10))
    values = [r.prompt_tokens for r in trace]
    assert set(values) == {10, 500}
    assert values.count(10) / len(values) == pytest.approx(0.75, abs=0.04)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Dist.uniform(10, 5), "uniform needs lo ≤ hi, got lo=10, hi=5"),
    (lambda: Dist.constant(0), "constant value must be a positive integer, got 0"),
    (lambda: Dist.lognormal(0.5, 1.0), "lognormal median must be a number in"),
    (lambda: Dist.lognormal(100, -1), "lognormal sigma must be a number in"),
    (lambda: Dist.empirical([]), "empirical needs at least one value"),
    (lambda: Arrival.poisson(0), "poisson rate must be a positive number of requests per second"),
    (lambda: Arrival.bursty(5, 0), "burstiness must be a number in"),
    (lambda: Arrival.on_off(1, 10, 0, 5), "on_s must be a positive number of seconds"),
])
def test_bad_generator_parameters_are_explained(build: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        build()  # type: ignore[operator]
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"n": 0}, "n must be an integer in [1, 100,000,000], got 0"),
    ({"seed": "x"}, "seed must be an integer"),
    ({"shared_prefix_groups": 3}, "shared_prefix_groups and shared_prefix_tokens go together"),
    ({"latency_class": "fast"}, "latency_class must be one of"),
    ({"arrival": 5.0}, "arrival must be an Arrival"),
])
def test_bad_generate_arguments_are_explained(overrides: dict[str, object], message: str) -> None:
    kwargs: dict[str, object] = {"n": 10, "seed": 1, "prompt_tokens": Dist.constant(5),
                                 "completion_tokens": Dist.constant(5),
                                 "arrival": Arrival.poisson(1.0), **overrides}
    with pytest.raises(ValueError) as caught:
        generate(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value).startswith(message)


# --- the summary ------------------------------------------------------------------------------


def test_the_summary_of_the_fleetctl_sample() -> None:
    with open(SAMPLES / "fleetctl_sample.jsonl", "rb") as fp:
        summary = summarise(parse_jsonl(fp))

    assert summary.request_count == 29
    assert summary.duration_s == 10.9
    assert summary.mean_request_rate_per_s == pytest.approx(28 / 10.9)
    assert (summary.prompt_tokens_p50, summary.prompt_tokens_p95,
            summary.prompt_tokens_max) == (1512, 7680, 10240)
    assert (summary.completion_tokens_p50, summary.completion_tokens_p95,
            summary.completion_tokens_max) == (164, 1024, 2048)
    assert summary.prefix_group_share == pytest.approx(15 / 29)
    assert summary.with_text_share == pytest.approx(5 / 29)
    assert summary.latency_classes == {"batch": 5, "interactive": 13, "standard": 9}


def test_percentiles_are_nearest_rank() -> None:
    trace = [TraceRequest(prompt_tokens=v, completion_tokens=1, arrival_s=0.0)
             for v in range(1, 101)]
    summary = summarise(trace)
    assert (summary.prompt_tokens_p50, summary.prompt_tokens_p95) == (50, 95)
    assert summary.mean_request_rate_per_s is None  # all at once: no rate
    assert summary.prompt_tokens_total == 5050


def test_the_summariser_works_while_the_trace_streams_past() -> None:
    summariser = TraceSummariser()
    kept = [summariser.add(r) for r in poisson_trace(1000, seed=1)]
    assert summariser.result() == summarise(kept)
    with pytest.raises(TraceError, match="the trace has no requests"):
        TraceSummariser().result()


def test_prefix_shares_count_requests_and_tokens() -> None:
    trace = [TraceRequest(prompt_tokens=100, completion_tokens=1, arrival_s=0.0,
                          prefix_group="g", prefix_tokens=50),
             TraceRequest(prompt_tokens=300, completion_tokens=1, arrival_s=2.0)]
    summary = summarise(trace)
    assert summary.prefix_group_share == 0.5
    assert summary.prefix_token_share == pytest.approx(50 / 400)
    assert summary.mean_request_rate_per_s == 0.5
    assert not math.isnan(summary.duration_s)


def test_the_standard_library_decoder_reads_and_refuses_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """pydantic-core's decoder is optional; without it the results must not change."""
    from fleetctl.bench.traces import reading

    good = [*lines_of({"fleetctl_trace": 1, "name": "x"}), b"\n",
            *(json.dumps(r.to_json()).encode() for r in feature_rich_trace(50))]
    bad = [*lines_of(req(), req(1.0, prompt_tokens=-1), "[1]", "{oops", req(0.5)),
           b'{"arrival_s": 2, "prompt": "\xff"}\n', overlong_line(), b"\xef\xbb\xbf{}\n"]

    def outcome() -> tuple[list[TraceRequest], list[tuple[int, str]]]:
        with pytest.raises(TraceError) as caught:
            list(parse_jsonl(bad))
        return list(parse_jsonl(good)), caught.value.errors

    fast = outcome()
    monkeypatch.setattr(reading, "_fast_loads", reading._stdlib_loads)
    assert outcome() == fast
