"""Batch input validation (fleetctl/batch/inputs.py): every refusal names its line, nothing is
left on disk after a refusal, duplicates are found with bounded memory and never falsely (a
hash collision is checked against the real ids), and a stored file reads back by chunk."""

from __future__ import annotations

import hashlib
import io
import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.batch import inputs
from fleetctl.batch.inputs import InputError, chunk_ranges, read_input, read_lines

from .factory import request_line, write_input


def _line(row: Any) -> bytes:
    return json.dumps(row).encode() + b"\n"


def _read(content: bytes, dest: Path, **kwargs: Any) -> inputs.InputSummary:
    return read_input(io.BytesIO(content), dest_dir=dest, **kwargs)


def _refused(content: bytes, dest: Path, **kwargs: Any) -> list[str]:
    before = sorted(dest.iterdir())
    with pytest.raises(InputError) as refused:
        _read(content, dest, **kwargs)
    assert sorted(dest.iterdir()) == before, \
        "a refused upload leaves nothing (not even its temp file)"
    return refused.value.messages()


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir()
    return folder


def test_a_good_file_is_stored_whole_with_its_hash_models_and_urls(dest):
    rows = [request_line(0), request_line(1, url="/v1/completions"),
            request_line(2, model="qwen2.5-7b-instruct"), request_line(3)]
    content = b"\xef\xbb\xbf" + _line(rows[0]) + b"\n  \n" + b"".join(
        _line(r).replace(b"\n", b"\r\n") for r in rows[1:])
    summary = _read(content, dest)
    assert summary.requests == 4
    assert summary.url_lines == {"/v1/chat/completions": 1, "/v1/completions": 4}
    assert summary.model_lines == {"llama-3.1-8b-instruct": 1, "qwen2.5-7b-instruct": 5}
    assert summary.path.parent == dest and summary.path.read_bytes() == content
    assert summary.sha256 == hashlib.sha256(content).hexdigest()
    assert summary.size_bytes == len(content)
    assert [p.name for p in dest.iterdir()] == [summary.path.name]  # no temp file left


@pytest.mark.parametrize(("line", "expected"), [
    (b"[1, 2]", 'must be a JSON object with custom_id, method, url and body; got [1, 2]'),
    (b'{"custom_id": "a", "method": "POST"', "is not valid JSON"),
    ({**request_line(1), "extra": 1}, 'unknown key "extra"'),
    ({k: v for k, v in request_line(1).items() if k != "custom_id"}, "has no custom_id"),
    ({**request_line(1), "custom_id": 7}, "custom_id must be a non-empty string, got 7"),
    ({**request_line(1), "custom_id": ""}, "custom_id must be a non-empty string"),
    ({**request_line(1), "custom_id": "x" * 201}, "custom_id is 201 characters; at most 200"),
    ({**request_line(1), "method": "GET"}, 'method must be "POST", got "GET"'),
    ({**request_line(1), "url": "/v1/audio/speech"}, 'url "/v1/audio/speech" is not supported'),
    ({**request_line(1, url="/v1/embeddings"), "body": {"model": "m", "input": ""}},
     "body.input must be a non-empty string or list"),
    ({**request_line(1), "body": "hi"}, 'body must be a JSON object (the request), got "hi"'),
    ({**request_line(1), "body": {"messages": []}}, "body.model must name the model"),
    ({**request_line(1), "body": {"model": "m", "messages": [{"role": "bot", "content": "x"}]}},
     "body.messages[0].role: must be one of system"),
    ({**request_line(1), "body": {"model": "m"}}, "body.messages: must be a non-empty list"),
    ({**request_line(1), "body": {**request_line(1)["body"], "stream": True}},
     "body.stream is true; batch requests are answered whole"),
    ({**request_line(1, url="/v1/completions"), "body": {"model": "m"}},
     "body.prompt must be a non-empty string or list"),
    (b'{"custom_id": "a", "n": NaN}', "NaN is not a JSON number"),
    (b"\xff\xfe{}", "is not valid UTF-8"),
])
def test_each_refusal_names_its_line(dest, line, expected):
    bad = line if isinstance(line, bytes) else json.dumps(line).encode()
    content = _line(request_line(0)) + b"\n" + bad + b"\n" + _line(request_line(3))
    messages = _refused(content, dest)
    assert len(messages) == 1 and messages[0].startswith("line 3: "), messages
    assert expected in messages[0], messages


def test_a_body_over_the_cap_is_refused_with_its_size(dest):
    big = request_line(1)
    big["body"]["messages"][0]["content"] = "x" * 600
    small = request_line(2)
    small["custom_id"] = "y" * 190  # a long line whose body is small: measured, accepted
    content = _line(request_line(0)) + _line(big) + _line(small)
    messages = _refused(content, dest, max_body_bytes=500)
    assert len(messages) == 1 and messages[0].startswith("line 2: body is 7")
    assert "at most 500 (BATCH_MAX_BODY_BYTES)" in messages[0]


def test_the_body_cap_comes_from_settings(dest, settings):
    settings.BATCH_MAX_BODY_BYTES = 100
    assert "BATCH_MAX_BODY_BYTES" in _refused(_line(request_line(0, max_tokens=10**60)), dest)[0]


def test_an_overlong_line_is_refused_and_its_bytes_are_not_kept(dest):
    line = request_line(1)
    line["body"]["messages"][0]["content"] = "z" * (inputs.MAX_LINE_BYTES + 10)
    content = _line(request_line(0)) + _line(line) + _line(request_line(2))
    messages = _refused(content, dest)
    assert messages == ["line 2: is longer than 1,048,576 bytes (1 MiB), the line limit"]


def test_an_empty_or_blank_file_is_refused(dest):
    assert _refused(b"", dest) == ["the file holds no requests (every line is blank)"]
    assert _refused(b"\n  \n\r\n", dest) == ["the file holds no requests (every line is blank)"]


def test_more_requests_than_the_cap_stop_at_the_first_one_over(dest):
    content = b"".join(_line(request_line(i)) for i in range(5))
    assert _refused(content, dest, max_requests=3) == [
        "line 4: the file holds more than 3 requests (BATCH_MAX_REQUESTS); split it into "
        "several jobs"]


def test_reading_stops_after_20_problems(dest):
    content = b"".join(b"{oops\n" for _ in range(30))
    messages = _refused(content, dest)
    assert len(messages) == 21 and messages[-1] == "(stopped after 20 errors)"
    assert messages[19].startswith("line 20: ")


def test_duplicate_custom_ids_name_both_lines(dest):
    rows = [request_line(0), request_line(1), request_line(2, custom_id="req-0"),
            request_line(3), request_line(4, custom_id="req-1"),
            request_line(5, custom_id="req-0")]
    messages = _refused(b"".join(_line(r) for r in rows), dest)
    assert messages == [
        'line 3: custom_id "req-0" is already on line 1; each request needs its own custom_id',
        'line 5: custom_id "req-1" is already on line 2; each request needs its own custom_id',
        'line 6: custom_id "req-0" is already on line 1; each request needs its own custom_id']


def test_a_hash_collision_is_not_a_duplicate(dest, monkeypatch):
    # A deliberately weak hash (the id's length): every id of one length collides. The
    # second pass compares the real ids, so only the true duplicate is reported.
    monkeypatch.setattr(inputs._Hashes, "of", staticmethod(lambda custom_id: len(custom_id)))
    rows = [request_line(i) for i in range(12)]
    assert _read(b"".join(_line(r) for r in rows), dest).requests == 12
    rows.append(request_line(12, custom_id="req-7"))
    assert _refused(b"".join(_line(r) for r in rows), dest) == [
        'line 13: custom_id "req-7" is already on line 8; each request needs its own '
        'custom_id']


def test_the_hash_array_grows_in_blocks(dest, monkeypatch):
    monkeypatch.setattr(inputs, "_HASH_BLOCK", 4)
    path = write_input(dest.parent / "src.jsonl", 50)
    with path.open("rb") as stream:
        assert read_input(stream, dest_dir=dest).requests == 50
    content = path.read_bytes() + _line(request_line(99, custom_id="req-49"))
    assert _refused(content, dest)[0].startswith('line 51: custom_id "req-49" is already on '
                                                 'line 50')


def test_a_failing_stream_leaves_no_temp_file(dest):
    def lines() -> Iterator[bytes]:
        yield _line(request_line(0))
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        read_input(lines(), dest_dir=dest)
    assert list(dest.iterdir()) == []


def test_lines_from_an_iterable_are_read_too(dest):
    summary = read_input(iter([_line(request_line(0)), _line(request_line(1))]), dest_dir=dest)
    assert summary.requests == 2


def test_memory_does_not_grow_with_the_file(dest, tmp_path):
    """The reader keeps no line: tracing allocations while reading a ~9 MB file stays far
    below the file's size (the hashes are 8 bytes a line)."""
    path = write_input(tmp_path / "big.jsonl", 60_000)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        with path.open("rb") as stream:
            summary = read_input(stream, dest_dir=dest)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert summary.requests == 60_000 and size > 8_000_000
    assert peak < size / 3, f"peak {peak:,} bytes reading a {size:,}-byte file"


# --- reading back -------------------------------------------------------------------------------

def test_chunk_ranges_and_read_lines_walk_the_stored_file(dest):
    rows = [request_line(i) for i in range(7)]
    content = (b"\xef\xbb\xbf" + _line(rows[0]) + b"\n" + _line(rows[1]) + _line(rows[2])
               + b"   \n" + b"".join(_line(r) for r in rows[3:]))
    summary = _read(content, dest)
    chunks = list(chunk_ranges(summary.path, 3))
    assert [c[:3] for c in chunks] == [(0, 2, 1), (3, 5, 6), (6, 6, 9)]
    assert chunks[0][3] == 0 and chunks[-1][4] == len(content)
    got = [(line, request["custom_id"])
           for first, last, first_line, start, end in chunks
           for line, request in read_lines(summary.path, start, end, first_line=first_line)]
    assert got == [(1, "req-0"), (3, "req-1"), (4, "req-2"), (6, "req-3"), (7, "req-4"),
                   (8, "req-5"), (9, "req-6")]
    assert list(chunk_ranges(summary.path, 100)) == [(0, 6, 1, 0, len(content))]
    with pytest.raises(ValueError):
        list(chunk_ranges(summary.path, 0))
