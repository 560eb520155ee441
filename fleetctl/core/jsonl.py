"""Reading an uploaded JSONL file: streamed, line-numbered and all-or-nothing.

One reader for every JSONL upload fleetctl takes — request traces (bench/traces/), eval
suites (evals/suites.py) and batch inputs — so that each refuses a bad file the same way:

- Streamed: one line at a time. A file object is read with readline(limit), so a line longer
  than MAX_LINE_BYTES is skipped in pieces instead of being pulled into memory whole.
- Line-numbered: every problem is `(line number, message)`; line 0 means the file as a whole
  ("the suite has no items"). Blank lines are skipped but still counted, so the numbers are
  the ones an editor shows. A UTF-8 byte-order mark is accepted on line 1 only.
- All-or-nothing: the caller stops using what it read at the first problem, keeps scanning
  only to report up to `max_errors` problems (LineErrors raises at the cap), and raises
  JsonlError at the end. A caller that stores rows while reading must discard them on error.
- Shallow: a line whose arrays and objects nest deeper than MAX_DEPTH is refused ("line 7:
  is nested deeper than 64 levels ..."), counted without recursion (`too_deep`), so nothing
  after the reader (our own walks, Django's JSON encoding, jsonschema) can run out of stack.

JSON decoding is most of the cost of reading a large file. pydantic-core's decoder (jiter) is
about three times faster than the standard library's, so it is used when installed; any line
it refuses is decoded again by the standard library (`retry`), which decides and words the
error, so the messages never depend on which decoder is installed.

Pure Python, no Django.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

MAX_LINE_BYTES = 1024 * 1024
# How deep arrays and objects may nest in an uploaded line (and in a JSON Schema, which
# inference.schema.schema_validator holds to the same limit). Real requests, suite items and schemas
# nest a dozen levels at most (OpenAI's structured outputs allow 10 for a schema), so 64 is
# generous; and 64 levels keep every recursive walk over a value (Python's json, jsonschema's
# check_schema at about five frames a level, Django's JSONField encoding, our own) far inside
# Python's 1,000-frame stack, which a line 450 levels deep exhausted (a 500).
MAX_DEPTH = 64
DEPTH_MESSAGE = (f"is nested deeper than {MAX_DEPTH} levels (arrays and objects inside each "
                 f"other), the depth limit")


def stdlib_loads(line: Any) -> Any:
    """The standard library's decode of one line (the fallback, and the reference)."""
    return json.loads(decoded(line))


try:
    from pydantic_core import from_json as _from_json

    def fast_loads(line: Any) -> Any:
        # Refuses NaN and Infinity (the slow path decides about them), a byte-order mark and
        # blank lines (the slow path skips those), and the stand-in for an overlong line
        # (TypeError, reported by `decoded`).
        return _from_json(line, allow_inf_nan=False, cache_strings="all")

    JSON_DECODER = "pydantic-core"
except ImportError:  # pragma: no cover - depends on the installation
    fast_loads = stdlib_loads
    JSON_DECODER = "json (standard library)"


class JsonlError(ValueError):
    """A file that cannot be used. `errors` holds (line number, message) pairs; line 0 means
    the file as a whole. `truncated` says reading stopped at the error cap."""

    def __init__(self, errors: list[tuple[int, str]], *, truncated: bool = False) -> None:
        self.errors = errors
        self.truncated = truncated
        super().__init__("\n".join(self.messages()))

    def messages(self) -> list[str]:
        """The errors as a person reads them: "line 3: ..." (line 0: the message alone),
        then "(stopped after N errors)" when reading stopped at the cap."""
        out = [f"line {n}: {msg}" if n else msg for n, msg in self.errors]
        if self.truncated:
            out.append(f"(stopped after {len(self.errors)} errors)")
        return out


class LineErrors:
    """Collects line errors up to `max_errors`, raising `error` (JsonlError or a subclass)
    with them when the cap is reached; otherwise raising is the caller's call (`finish`).
    `what` names the file in messages ("save the suite as UTF-8")."""

    def __init__(self, max_errors: int = 20, *, what: str = "file",
                 error: type[JsonlError] = JsonlError) -> None:
        if type(max_errors) is not int or max_errors < 1:
            raise ValueError(f"max_errors must be a positive integer, got {max_errors!r}")
        self.items: list[tuple[int, str]] = []
        self.max_errors = max_errors
        self.what = what
        self.error = error

    def add(self, lineno: int, message: str) -> None:
        self.items.append((lineno, message))
        if len(self.items) >= self.max_errors:
            raise self.error(self.items, truncated=True)

    def __bool__(self) -> bool:
        return bool(self.items)

    def stop(self, lineno: int, message: str) -> NoReturn:
        """Record a problem after which reading on makes no sense (too many rows), and raise."""
        self.items.append((lineno, message))
        raise self.error(self.items)

    def finish(self, count: int, *, empty: str) -> None:
        """The end of the file: raise with the errors if there were any, or with `empty` (as
        a line-0 error) if `count` — the rows read — is 0."""
        if self.items:
            raise self.error(self.items)
        if count == 0:
            raise self.error([(0, empty)])


# --- lines ----------------------------------------------------------------------------------


class Overlong:
    """Stands in for a line that was longer than MAX_LINE_BYTES (its bytes were skipped)."""

    def __repr__(self) -> str:
        return "<overlong line>"


OVERLONG = Overlong()
OVERLONG_MESSAGE = f"is longer than {MAX_LINE_BYTES:,} bytes (1 MiB), the line limit"

Finish = Callable[[Any], Any]


class Replay:
    """Lines already peeked at (to detect a format, say) handed on together with the rest of
    the same reader, so line_reader() continues where it stopped."""

    def __init__(self, lines: Iterator[Any], finish: Finish) -> None:
        self.lines = lines
        self.finish = finish

    def __iter__(self) -> Iterator[Any]:
        return self.lines


def line_reader(source: Iterable[bytes | str]) -> tuple[Iterator[Any], Finish]:
    """Lines, plus what to call on a line longer than MAX_LINE_BYTES (rare, so the caller
    checks `len(line) > MAX_LINE_BYTES` itself): it returns the line, or OVERLONG if it is
    too long.

    A file object is read with readline(limit), so one enormous line is skipped in pieces
    instead of being pulled into memory whole; iter(callable, sentinel) keeps that loop in C.
    Any other iterable is taken line by line as it comes.
    """
    if isinstance(source, Replay):
        return source.lines, source.finish
    readline: Callable[[int], bytes | str] | None = getattr(source, "readline", None)
    if readline is None:
        return iter(source), _whole_line
    limit = MAX_LINE_BYTES + 2  # room for "\r\n"
    first = readline(limit)
    chunks = itertools.chain((first,), iter(functools.partial(readline, limit), first[:0])) \
        if first else iter(())

    def finish(line: bytes | str) -> Any:
        if len(line) < limit or line[-1:] in (b"\n", "\n"):  # the whole line was read
            return _whole_line(line)
        for rest in chunks:
            if rest[-1:] in (b"\n", "\n"):
                break
        return OVERLONG

    return chunks, finish


def _whole_line(line: bytes | str) -> Any:
    return OVERLONG if _too_long(line) else line


def _too_long(line: bytes | str) -> bool:
    ending = b"\r\n" if isinstance(line, bytes) else "\r\n"
    return len(line.rstrip(ending)) > MAX_LINE_BYTES  # type: ignore[arg-type]


def decoded(raw: bytes | str | Overlong, what: str = "file") -> str:
    """The line as text; ValueError with a readable message if it cannot be read. Text lines
    are measured in characters: close enough to bytes for a safety limit."""
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = raw[exc.start]
            raise ValueError(f"is not valid UTF-8 (byte 0x{bad:02x} at column {exc.start + 1}); "
                             f"save the {what} as UTF-8") from None
    if isinstance(raw, str):
        return raw
    raise ValueError(OVERLONG_MESSAGE)


# --- JSON -----------------------------------------------------------------------------------


class Skip:
    """What `retry` returns for a line that holds nothing (blank)."""


SKIP = Skip()


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotFinite(name)


def retry(lineno: int, raw: bytes | str | Overlong, errors: LineErrors, *,
          allow_nan: bool = True) -> Any:
    """The slow path of a line the fast decoder refused: a blank line (SKIP), a first line
    that starts with a byte-order mark (decoded without it), something only the standard
    library accepts (decoded by it), or an error (recorded in `errors`; SKIP). The messages
    always come from the standard library, so they do not depend on the decoder installed.
    Without `allow_nan`, NaN and Infinity (which RFC 8259 JSON has not) are errors too; so is
    a value nested deeper than MAX_DEPTH."""
    try:
        text = decoded(raw, errors.what)
    except ValueError as error:
        errors.add(lineno, str(error))
        return SKIP
    if not text.strip():
        return SKIP
    if lineno == 1 and text.startswith("\ufeff"):
        text = text[1:]
    text = text.rstrip("\r\n")  # so an error at the end of the line gets its column
    try:
        value = json.loads(text) if allow_nan else json.loads(
            text, parse_constant=_refuse_constant)
        if not too_deep(value):  # the fast decoder refuses lines over 200 levels: checked here
            return value
        errors.add(lineno, DEPTH_MESSAGE)
    except _NotFinite as error:
        errors.add(lineno, f"is not valid JSON ({error} is not a JSON number; write a finite "
                           f"number, or a string)")
    except json.JSONDecodeError as error:
        errors.add(lineno, f"is not valid JSON ({error.msg} at column {error.colno})")
    except RecursionError:  # deeper than the decoder can follow: far past MAX_DEPTH
        errors.add(lineno, DEPTH_MESSAGE)
    return SKIP


def objects(lines: Iterable[bytes | str], errors: LineErrors, *,
            allow_nan: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON value) for every non-blank line that decodes; a line that
    does not (bad UTF-8, bad JSON, too long, nested too deep) is added to `errors` and not
    yielded. Line
    numbers count every line, blank ones included. `lines` is any iterable of lines — a file
    opened in binary mode is best (see line_reader). NaN and Infinity are refused unless
    `allow_nan`.

    The caller validates each value, adds its own problems to `errors`, and calls
    `errors.finish(count, empty=...)` at the end.
    """
    for lineno, raw, value in decoded_lines(lines, errors, allow_nan=allow_nan):
        if line_too_deep(raw, value):
            errors.add(lineno, DEPTH_MESSAGE)
            continue
        if not allow_nan and not finite(value):
            # The fallback decoder reads NaN (retry words that), and both read 1e400 as
            # infinity, which no JSON can hold.
            if retry(lineno, raw, errors, allow_nan=False) is not SKIP:
                errors.add(lineno, "holds a number too large for JSON (it reads as infinity); "
                                   "write a smaller number, or a string")
            continue
        yield lineno, value


def decoded_lines(lines: Iterable[bytes | str], errors: LineErrors, *,
                  loads: Callable[[Any], Any] | None = None,
                  allow_nan: bool = True) -> Iterator[tuple[int, bytes | str | Overlong, Any]]:
    """(line number, raw line, decoded value) for every non-blank line that `loads` (default:
    fast_loads) or, failing it, `retry` decodes; a line neither does is in `errors`. The
    streamed reading under objects() and the trace parsers, which check the values."""
    loads = loads or fast_loads
    reader, finish = line_reader(lines)
    for lineno, raw in enumerate(reader, 1):
        if len(raw) > MAX_LINE_BYTES:
            raw = finish(raw)
        try:
            value = loads(raw)
        except (ValueError, TypeError, RecursionError):
            value = retry(lineno, raw, errors, allow_nan=allow_nan)
            if value is SKIP:
                continue
        yield lineno, raw, value


def line_too_deep(raw: bytes | str | Overlong, value: Any) -> bool:
    """The decoded line nests deeper than MAX_DEPTH. A line holding at most MAX_DEPTH
    brackets cannot (they are counted in C, strings included, so the count only ever
    overstates): only the rare line with more is walked."""
    if isinstance(raw, bytes):
        if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
            return False
    elif isinstance(raw, str) and raw.count("[") + raw.count("{") <= MAX_DEPTH:
        return False
    return too_deep(value)


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Arrays and objects in `value` nest more than `limit` levels ([] and {} are one level,
    [[]] two). Walked a level at a time, without recursion, so any depth is safe to ask
    about; it stops at the first level past the limit."""
    level, depth = [value], 0
    while level:
        inner: list[Any] = []
        nested = False
        for item in level:
            kind = type(item)
            if kind is dict:
                nested = True
                inner.extend(item.values())
            elif kind is list:
                nested = True
                inner.extend(item)
        if not nested:
            return False
        depth += 1
        if depth > limit:
            return True
        level = inner
    return False


def finite(value: Any) -> bool:
    """No float anywhere in the JSON value is infinite or NaN (json.dumps would write them
    as Infinity and NaN, which are not JSON)."""
    if type(value) is float:
        return value - value == 0.0
    if type(value) is dict:
        return all(finite(v) for v in value.values())
    if type(value) is list:
        return all(finite(v) for v in value)
    return True


# --- values ---------------------------------------------------------------------------------


def show(value: object, limit: int = 60) -> str:
    """A value quoted in a message: as JSON when it is JSON, cut to `limit` characters."""
    text = json.dumps(value, ensure_ascii=False) if _jsonable(value) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _jsonable(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


MESSAGE_ROLES = ("system", "user", "assistant", "tool", "developer")


def message_problem(messages: object, *, parts: bool = True) -> tuple[str, str] | None:
    """What is wrong with a list of chat messages, as (field, problem) — for example
    ("messages[1].role", 'must be one of system, ...; got "bot"') — or None. The field is
    written the way the request names it, so the caller can say "line 4: messages[1].role:
    ...". `parts` allows content as a list of typed parts (OpenAI's multimodal form);
    without it content must be a string. Content may be null only on an assistant message
    that calls tools."""
    if type(messages) is not list or not messages:
        return "messages", f"must be a non-empty list of chat messages, got {show(messages)}"
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if type(message) is not dict:
            return where, f"must be an object with role and content, got {show(message)}"
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            return f"{where}.role", f"must be one of {', '.join(MESSAGE_ROLES)}; got {show(role)}"
        if "content" not in message:
            return where, "has no content"
        problem = _content_problem(where, role, message, parts)
        if problem:
            return problem
    return None


def _content_problem(where: str, role: str, message: dict[str, Any],
                     parts: bool) -> tuple[str, str] | None:
    content = message["content"]
    if type(content) is str:
        return None
    field = f"{where}.content"
    if content is None:
        # OpenAI allows an assistant turn that only calls tools.
        if role == "assistant" and message.get("tool_calls"):
            return None
        return field, "is null; only an assistant message with tool_calls may omit it"
    if not parts:
        return field, f"must be a string, got {show(content)}"
    if type(content) is list and content:
        for j, part in enumerate(content):
            if type(part) is not dict or type(part.get("type")) is not str:
                return f"{field}[{j}]", f"must be an object with a string type, got {show(part)}"
        return None
    return field, f"must be a string or a non-empty list of parts, got {show(content)}"
