"""The eval suite file: its format, the parser every upload goes through, and the canonical
bytes a suite is pinned by.

A suite is JSONL, UTF-8 (docs/eval-suites.md describes it for people). An optional first
line is the header; every other non-blank line is one item:

    {"fleetctl_eval_suite": 1, "description": "...", "decoding": {"temperature": 0, "seed": 1}}
    {"id": "arith-0001", "messages": [{"role": "user", "content": "..."}],
     "references": ["42"], "scorer": "numeric", "tags": ["arithmetic"]}

`parse_suite` reads a file the way traces are read (fleetctl/core/jsonl.py): streamed,
line-numbered and all-or-nothing. Every problem is "line N: <field>: <what to do>"; up to
`max_errors` are reported and, if there is any, it raises SuiteError and the caller stores
nothing. Scorer names, parameters (regexes compiled, JSON Schemas checked) and references are
checked here by fleetctl/evals/scorers/, so a suite that uploads can be scored.

A parsed suite is stored as rows, and written back with `canonical_jsonl`: one header line,
then one line per item, keys sorted, no spaces, defaults filled in. Those bytes are what a
suite's SHA-256 (`digest`) pins and what a download returns; parsing them gives the same
suite back, so two uploads that mean the same thing (key order, spacing, a default written
out or not) are one suite.

Pure Python apart from reading settings.EVAL_MAX_SUITE_ITEMS.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fleetctl.core import jsonl
from fleetctl.core.jsonl import JsonlError, LineErrors, show
from fleetctl.evals import scorers
from fleetctl.inference import schema

FORMAT_VERSION = 1
HEADER_KEY = "fleetctl_eval_suite"
HEADER_KEYS = (HEADER_KEY, "description", "decoding")
DECODING_KEYS = ("temperature", "top_p", "seed", "max_tokens")
# What a run sends when neither the suite nor the item says otherwise.
DEFAULT_DECODING: dict[str, Any] = {"temperature": 0.0, "seed": 0, "max_tokens": 256}
ITEM_KEYS = ("id", "messages", "prompt", "references", "reference", "scorer", "params", "tags",
             "request")
REQUEST_KEYS = ("max_tokens", "temperature", "top_p", "seed", "stop", "response_format",
                "tools", "tool_choice")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TOOL_CHOICES = ("none", "auto", "required")
MAX_ID_CHARS = 200
MAX_TAGS = 16
MAX_TAG_CHARS = 64
TAG_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
MAX_DESCRIPTION_CHARS = 10_000
MAX_OUTPUT_TOKENS = 1_000_000
MAX_SEED = 2**63 - 1
MAX_STOP = 4
MAX_TOOLS = 128
DEFAULT_MAX_ITEMS = 100_000
NO_ITEMS = "the suite has no items; add at least one item line (docs/eval-suites.md)"


class SuiteError(JsonlError):
    """A suite file that cannot be used: `errors` holds (line number, message) pairs, each
    message "<field>: <what to do>"; line 0 means the file as a whole. Nothing is stored."""


@dataclass(frozen=True)
class SuiteItem:
    """One item as validated: `params` with every default filled in (scorers.validate),
    `references` as the strings scorers.score takes, `prompt` "" when `messages` is set."""

    item_id: str
    messages: list[dict[str, Any]] | None
    prompt: str
    references: list[str]
    scorer: str
    params: dict[str, Any]
    tags: list[str]
    request: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The item as its canonical line holds it (empty tags and request left out)."""
        out: dict[str, Any] = {"id": self.item_id, "references": self.references,
                               "scorer": self.scorer, "params": self.params}
        if self.messages is not None:
            out["messages"] = self.messages
        else:
            out["prompt"] = self.prompt
        if self.tags:
            out["tags"] = self.tags
        if self.request:
            out["request"] = self.request
        return out


@dataclass(frozen=True)
class ParsedSuite:
    description: str
    decoding: dict[str, Any]
    items: list[SuiteItem]

    def tag_counts(self) -> dict[str, int]:
        """tag -> number of items carrying it, sorted by tag."""
        return dict(sorted(Counter(t for item in self.items for t in item.tags).items()))

    def scorer_counts(self) -> dict[str, int]:
        """scorer -> number of items scored by it, sorted by name."""
        return dict(sorted(Counter(item.scorer for item in self.items).items()))


class FieldProblem(ValueError):
    """What is wrong with one field: str() is "<field>: <what to do>". parse_suite reports a
    line's first one; `decoding_checked` raises it for a run's decoding too."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# --- parsing ----------------------------------------------------------------------------------


def parse_suite(lines: Iterable[bytes | str], *, max_errors: int = 20,
                max_items: int | None = None) -> ParsedSuite:
    """Read and validate a suite. `lines` is any iterable of lines; a file opened in binary
    mode is best (read with readline(limit), so an overlong line is never held whole).
    Raises SuiteError with up to `max_errors` line messages; `max_items` defaults to
    settings.EVAL_MAX_SUITE_ITEMS."""
    limit = _max_items() if max_items is None else max_items
    if type(limit) is not int or limit < 1:
        raise ValueError(f"max_items must be a positive integer, got {limit!r}")
    errors = LineErrors(max_errors, what="suite", error=SuiteError)
    description, decoding = "", dict(DEFAULT_DECODING)
    items: list[SuiteItem] = []
    first_line: dict[str, int] = {}  # id -> the line that used it first
    count, first = 0, True
    for lineno, obj in jsonl.objects(lines, errors):
        is_header = type(obj) is dict and HEADER_KEY in obj
        try:
            if is_header:
                if not first:
                    raise FieldProblem(HEADER_KEY, "a header is only allowed as the first line; "
                                                   "move it to the top or remove it")
                description, decoding = _header(obj)
                continue
            item = _item(obj, lineno, first_line)
        except FieldProblem as problem:
            errors.add(lineno, str(problem))
            continue
        except scorers.ScorerParamsError as exc:
            errors.add(lineno, _scorer_message(exc))
            continue
        finally:
            first = False
        count += 1
        if count > limit:
            errors.stop(lineno, f"the suite has more than {limit:,} items, the limit; split it "
                                "into smaller suites")
        if not errors:
            items.append(item)
    errors.finish(count, empty=NO_ITEMS)
    return ParsedSuite(description=description, decoding=decoding, items=items)


def _max_items() -> int:
    try:
        from django.conf import settings

        return int(getattr(settings, "EVAL_MAX_SUITE_ITEMS", DEFAULT_MAX_ITEMS))
    except Exception:  # settings not configured: a script reading a suite file
        return DEFAULT_MAX_ITEMS


_INDEX_RE = re.compile(r"\.(\d+)$")


def _scorer_message(exc: scorers.ScorerParamsError) -> str:
    """scorers' own field names ("params.pattern", "references.0") as a suite line names
    them ("params.pattern", "references[0]")."""
    for field, messages in exc.fields.items():
        if messages:
            name = _INDEX_RE.sub(r"[\1]", field)
            return f"{name}: {messages[0]}"
    return f"scorer: {exc.message}"


def _header(obj: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    for key in obj:
        if key not in HEADER_KEYS:
            raise FieldProblem(str(key), f"unknown header key; allowed: {', '.join(HEADER_KEYS)}")
    version = obj[HEADER_KEY]
    if type(version) is not int or version != FORMAT_VERSION:
        raise FieldProblem(HEADER_KEY, f"must be {FORMAT_VERSION} (the format version this "
                                       f"fleetctl reads), got {show(version)}")
    description = obj.get("description", "")
    if type(description) is not str or len(description) > MAX_DESCRIPTION_CHARS:
        raise FieldProblem("description", f"must be a string of at most "
                                          f"{MAX_DESCRIPTION_CHARS:,} characters")
    _check_text("description", description)
    return description, decoding_checked(obj.get("decoding", {}))


def decoding_checked(decoding: object, field: str = "decoding") -> dict[str, Any]:
    """A suite's decoding with the defaults filled in (temperature 0, seed 0, max_tokens 256).
    Numbers are normalised (temperature and top_p as floats) so that 0 and 0.0 pin the same
    suite. FieldProblem (a ValueError) names the key otherwise: "decoding.temperature: must
    be a number from 0 to 2, got 5". A run's decoding overrides are checked with it too."""
    if type(decoding) is not dict:
        raise FieldProblem(field, f'must be an object such as {{"temperature": 0, "seed": 1234, '
                                  f'"max_tokens": 256}}, got {show(decoding)}')
    for key in decoding:
        if key not in DECODING_KEYS:
            raise FieldProblem(f"{field}.{key}",
                               f"unknown decoding key; allowed: {', '.join(DECODING_KEYS)}")
    out = dict(DEFAULT_DECODING)
    for key, value in decoding.items():
        out[key] = _sampling(f"{field}.{key}", key, value)
    return dict(sorted(out.items()))


def _sampling(field: str, key: str, value: object) -> Any:
    """One of temperature, top_p, seed, max_tokens, checked."""
    if key in ("temperature", "top_p"):
        low, high = (0.0, 2.0) if key == "temperature" else (0.0, 1.0)
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or not low <= value <= high \
                or (key == "top_p" and value == 0):
            span = "from 0 to 2" if key == "temperature" else "above 0 and at most 1"
            raise FieldProblem(field, f"must be a number {span}, got {show(value)}")
        return float(value) + 0.0  # -0.0 is 0.0
    if key == "seed":
        if type(value) is not int or not 0 <= value <= MAX_SEED:
            raise FieldProblem(field, f"must be an integer from 0 to {MAX_SEED}, got {show(value)}")
        return value
    if type(value) is not int or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise FieldProblem(field, f"must be an integer from 1 to {MAX_OUTPUT_TOKENS:,}, "
                                  f"got {show(value)}")
    return value


def _item(obj: object, lineno: int, first_line: dict[str, int]) -> SuiteItem:
    if type(obj) is not dict:
        raise FieldProblem("item", 'must be a JSON object such as {"id": "q1", "prompt": "...", '
                                   f'"references": ["..."], "scorer": "exact"}}, got {show(obj)}')
    for key, value in obj.items():
        if key not in ITEM_KEYS:
            raise FieldProblem(str(key), f"unknown key; allowed: {', '.join(ITEM_KEYS)}")
        _check_text(key, value)
    item_id = _item_id(obj, lineno, first_line)
    messages, prompt = _text(obj)
    scorer = obj.get("scorer")
    if scorer is None:
        raise FieldProblem("scorer", f"missing; give one of: {', '.join(scorers.SCORERS)}")
    if type(scorer) is not str or scorer not in scorers.SCORERS:
        raise FieldProblem("scorer", f"unknown scorer {show(scorer)}; give one of: "
                                     f"{', '.join(scorers.SCORERS)}")
    params = scorers.validate(scorer, obj.get("params"))
    references = scorers.validate_references(scorer, _references(obj), params)
    return SuiteItem(item_id=item_id, messages=_stored(messages), prompt=prompt,
                     references=references, scorer=scorer, params=_stored(params),
                     tags=_tags(obj.get("tags", [])),
                     request=_stored(_request(obj.get("request", {}))))


# Text PostgreSQL cannot store (NUL) or UTF-8 cannot encode (a lone surrogate, which the
# standard library's decoder makes of an escape such as "\ud800").
_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")


def _check_text(field: str, value: Any) -> None:
    """FieldProblem naming `field` if any string in the value (keys too) holds a character
    that cannot be stored."""
    if type(value) is str:
        found = _UNSTORABLE_RE.search(value)
        if found is None:
            return
        char = found.group(0)
        if char == "\x00":
            raise FieldProblem(field, "contains a NUL character (\\u0000), which cannot be "
                                      "stored; remove it")
        raise FieldProblem(field, f"contains a lone surrogate (\\u{ord(char):04x}), which is "
                                  "not text; write the character itself, or both halves of "
                                  "its pair")
    if type(value) is dict:
        for key, inner in value.items():
            _check_text(field, key)
            _check_text(field, inner)
    elif type(value) is list:
        for inner in value:
            _check_text(field, inner)


def _stored(value: Any) -> Any:
    """The value as it comes back from a PostgreSQL jsonb column, so that the canonical
    bytes of the stored rows are the bytes parsed: jsonb keeps numbers as decimals, so -0.0
    comes back 0.0 and a float of 1e16 or more (which Python writes as 1e+16) as an integer.
    The numbers are equal; only their spelling would have changed the digest."""
    kind = type(value)
    if kind is float:
        if value == 0.0:
            return 0.0
        return int(value) if abs(value) >= 1e16 else value
    if kind is dict:
        return {k: _stored(v) for k, v in value.items()}
    if kind is list:
        return [_stored(v) for v in value]
    return value


def _item_id(obj: dict[str, Any], lineno: int, first_line: dict[str, int]) -> str:
    if "id" not in obj:
        raise FieldProblem("id", 'missing; give each item a unique id such as "arith-0001"')
    item_id = obj["id"]
    if type(item_id) is not str or not item_id.strip() or len(item_id) > MAX_ID_CHARS:
        raise FieldProblem("id", f"must be a string of 1 to {MAX_ID_CHARS} characters (not only "
                                 f"spaces), got {show(item_id)}")
    seen = first_line.setdefault(item_id, lineno)
    if seen != lineno:
        raise FieldProblem("id", f"{show(item_id)} is already the id of the item on line {seen}; "
                                 "give each item its own id")
    return item_id


def _text(obj: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
    has_messages, has_prompt = "messages" in obj, "prompt" in obj
    if has_messages and has_prompt:
        raise FieldProblem("messages", "give either messages (a chat) or prompt (a completion "
                                       "text), not both")
    if has_prompt:
        prompt = obj["prompt"]
        if type(prompt) is not str or not prompt:
            raise FieldProblem("prompt", f"must be a non-empty string, got {show(prompt)}")
        return None, prompt
    if not has_messages:
        raise FieldProblem("messages", 'missing; give messages (a chat, e.g. [{"role": "user", '
                                       '"content": "..."}]) or prompt (a completion text)')
    messages = obj["messages"]
    problem = jsonl.message_problem(messages, parts=False)
    if problem:
        raise FieldProblem(*problem)
    return messages, ""


def _references(obj: dict[str, Any]) -> Any:
    if "reference" in obj:
        if "references" in obj:
            raise FieldProblem("references", "give references (a list) or reference (one "
                                             "string), not both")
        reference = obj["reference"]
        if type(reference) is not str:
            raise FieldProblem("reference", "must be one string (for several, or a number or "
                                            "an object, give references: [...]), got "
                                            f"{show(reference)}")
        return [reference]
    references = obj.get("references", [])
    if type(references) is not list:
        raise FieldProblem("references", f'must be a list such as ["42"] (or [] for none), '
                                         f"got {show(references)}")
    return references


def _tags(tags: object) -> list[str]:
    if type(tags) is not list:
        raise FieldProblem("tags", f'must be a list of strings such as ["arithmetic"], '
                                   f"got {show(tags)}")
    if len(tags) > MAX_TAGS:
        raise FieldProblem("tags", f"has {len(tags)} tags; give at most {MAX_TAGS}")
    seen: set[str] = set()
    for i, tag in enumerate(tags):
        if type(tag) is not str or len(tag) > MAX_TAG_CHARS or not TAG_RE.fullmatch(tag):
            raise FieldProblem(f"tags[{i}]", f"must be 1 to {MAX_TAG_CHARS} characters of letters, "
                                             f"digits and _ . : / -, got {show(tag)}")
        if tag in seen:
            raise FieldProblem(f"tags[{i}]", f"{show(tag)} is given twice; give each tag once")
        seen.add(tag)
    return list(tags)


def _request(request: object) -> dict[str, Any]:
    if type(request) is not dict:
        raise FieldProblem("request", f'must be an object such as {{"max_tokens": 64}}, '
                                      f"got {show(request)}")
    out: dict[str, Any] = {}
    for key, value in request.items():
        field = f"request.{key}"
        if key not in REQUEST_KEYS:
            raise FieldProblem(field, f"is not a request key an item may set; allowed: "
                                      f"{', '.join(REQUEST_KEYS)}")
        if key in DECODING_KEYS:
            out[key] = _sampling(field, key, value)
        elif key == "stop":
            out[key] = _stop(field, value)
        elif key == "response_format":
            out[key] = _response_format(field, value)
        elif key == "tools":
            out[key] = _tools(field, value)
        else:
            out[key] = _tool_choice(field, value)
    problem = schema.request_schema_problem(out)  # sent to pools; still never fetched
    if problem is not None:
        raise FieldProblem(f"request.{problem[0]}", problem[1])
    return dict(sorted(out.items()))


def _stop(field: str, value: object) -> Any:
    if type(value) is str and value:
        return value
    if type(value) is list and 1 <= len(value) <= MAX_STOP \
            and all(type(s) is str and s for s in value):
        return value
    raise FieldProblem(field, f"must be a non-empty string or a list of 1 to {MAX_STOP} non-empty "
                              f"strings, got {show(value)}")


def _response_format(field: str, value: object) -> Any:
    if type(value) is not dict or value.get("type") not in RESPONSE_FORMATS:
        raise FieldProblem(field, f'must be an object whose type is one of '
                                  f'{", ".join(RESPONSE_FORMATS)}, e.g. {{"type": "json_object"}}, '
                                  f"got {show(value)}")
    if value["type"] == "json_schema" and type(value.get("json_schema")) is not dict:
        raise FieldProblem(f"{field}.json_schema", 'must be an object such as {"name": "answer", '
                                                   '"schema": {...}}')
    return value


def _tools(field: str, value: object) -> Any:
    if type(value) is not list or not 1 <= len(value) <= MAX_TOOLS:
        raise FieldProblem(field, f"must be a list of 1 to {MAX_TOOLS} tools, got {show(value)}")
    for i, tool in enumerate(value):
        function = tool.get("function") if type(tool) is dict else None
        if type(tool) is not dict or tool.get("type") != "function" \
                or type(function) is not dict or type(function.get("name")) is not str \
                or not function["name"]:
            raise FieldProblem(f"{field}[{i}]", 'must be {"type": "function", "function": '
                                                '{"name": "...", "parameters": {...}}}, '
                                                f"got {show(tool)}")
    return value


def _tool_choice(field: str, value: object) -> Any:
    if value in TOOL_CHOICES:
        return value
    function = value.get("function") if type(value) is dict else None
    if type(value) is dict and value.get("type") == "function" and type(function) is dict \
            and type(function.get("name")) is str and function["name"]:
        return value
    raise FieldProblem(field, f"must be one of {', '.join(TOOL_CHOICES)} or "
                              '{"type": "function", "function": {"name": "..."}}, '
                              f"got {show(value)}")


# --- writing ----------------------------------------------------------------------------------

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True,
                           allow_nan=False).encode


def header_json(description: str, decoding: dict[str, Any]) -> dict[str, Any]:
    """The canonical header object (decoding checked, defaults filled in)."""
    return {HEADER_KEY: FORMAT_VERSION, "description": description,
            "decoding": decoding_checked(decoding)}


# Characters str.splitlines() breaks a line at, besides \r and \n (which JSON always escapes):
# escaped as well, so the canonical bytes stay one item a line however a reader splits them.
# They can only occur inside strings, where the escape means the same character.
_LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_LINE_BREAK_RE = re.compile("[\x85\u2028\u2029]")


def _line(obj: dict[str, Any]) -> str:
    text = _encode(obj)
    if _LINE_BREAK_RE.search(text):
        text = _LINE_BREAK_RE.sub(lambda m: _LINE_BREAKS[m.group(0)], text)
    return text


def canonical_jsonl(description: str, decoding: dict[str, Any],
                    items: Sequence[SuiteItem]) -> bytes:
    """The suite as the bytes it is pinned by: a header line, then one line per item, keys
    sorted, separators "," and ":", UTF-8 (ensure_ascii off, except that U+0085, U+2028 and
    U+2029 are escaped), "\\n" after every line. parse_suite() of these bytes gives the same
    description, decoding and items back."""
    lines = [_line(header_json(description, decoding))]
    lines.extend(_line(item.to_json()) for item in items)
    return ("\n".join(lines) + "\n").encode("utf-8")


def digest(data: bytes) -> str:
    """The SHA-256 (hex) of a suite's canonical bytes: its pin."""
    return hashlib.sha256(data).hexdigest()
