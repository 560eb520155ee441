"""Task answers: the simulator solves the bundled eval suites' items, right at a profile's
accuracy and plausibly wrong otherwise.

An eval run against the simulated fleet needs a known truth: a pool of accuracy 0.92 must
score about 0.92, and a candidate made 3 points worse must be caught. So the simulator
recognises the task families of fleetctl's bundled suites (arithmetic word problems,
extraction into JSON, format instructions, multiple choice) in the LAST user message (or a
completions prompt) by parsing their fixed phrasing, computes the right answer, and answers:

- right iff ``u < accuracy``, where ``u = stable_unit("task", key)`` and the key is (model,
  rendered prompt, seed) — the same key as the free text's. u is SHARED by every profile,
  so a profile of accuracy 0.89 is wrong on a superset of the items a 0.92 profile gets
  wrong (nested), as one checkpoint is a little worse on another stack;
- except on the share ``divergence_rate`` of keys picked by a hash that includes the
  profile name: there u is drawn again with the profile name in the hash, so two profiles
  disagree both ways on a few items, as numerics differ across vendors;
- wrong answers are plausible: a number off by a little, another letter, one JSON field
  wrong, one word too many.

Everything is deterministic per (model, prompt, seed, profile). This module imports
nothing from fleetctl outside fleetctl/sim: it parses text (the phrasing of
fleetctl/evals/bundled.py) and does not import the generator. Change a template there and
its regex here together; tests/sim/test_tasks.py checks every bundled item is solved.

`task_text(model, messages_or_prompt, seed, profile)` answers in-process (the power
benchmark calls it); the server (server.py) sends the same text through a ScriptedStream.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .profiles import Profile
from .textgen import TextKey, render_chat, stable_hash, stable_unit

# Prompts longer than this are never tasks (a cheap guard in front of the regexes).
MAX_TASK_CHARS = 4000


@dataclass(frozen=True)
class Task:
    """A recognised item: its family, its template or rule, and what the answer needs."""

    family: str  # arithmetic | extraction | format | choice
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


# -- recognising ------------------------------------------------------------------------

def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.DOTALL)


ARITH: tuple[tuple[str, re.Pattern[str], Callable[[dict[str, int]], int | float]], ...] = (
    ("add-subtract", _rx(
        r"(?P<n>\w+) has (?P<a>\d+) (?P<t>.{1,80}?)\. (?P=n) buys (?P<b>\d+) more (?P=t) and then "
        r"gives (?P<c>\d+) to a friend\. How many (?P=t) does (?P=n) have now\?"),
     lambda v: v["a"] + v["b"] - v["c"]),
    ("multiply", _rx(
        r"A box holds (?P<a>\d+) (?P<p>.{1,80}?)\. A shop in .{1,80}? orders (?P<b>\d+) "
        r"boxes\. How many (?P=p) does the shop order in total\?"),
     lambda v: v["a"] * v["b"]),
    ("divide", _rx(
        r"(?P<n>\w+) shares (?P<a>\d+) (?P<t>.{1,80}?) equally among (?P<k>\d+) friends\. How many "
        r"(?P=t) does each friend get\?"),
     lambda v: v["a"] / v["k"]),
    ("subtract-add", _rx(
        r"A train leaves .{1,80}? with (?P<a>\d+) passengers\. At the first stop (?P<b>\d+) "
        r"passengers get off and (?P<c>\d+) get on\. How many passengers are on the train "
        r"now\?"),
     lambda v: v["a"] - v["b"] + v["c"]),
    ("multiply-subtract", _rx(
        r"(?P<n>\w+) buys (?P<k>\d+) (?P<p>.{1,80}?) at (?P<x>\d+) dollars each and pays with an? "
        r"(?P<note>\d+) dollar note\. How many dollars of change does (?P=n) get\?"),
     lambda v: v["note"] - v["k"] * v["x"]),
    ("subtract-multiply", _rx(
        r"A warehouse in .{1,80}? stores (?P<a>\d+) crates of (?P<p>.{1,80}?), (?P<b>\d+) in each "
        r"crate\. It ships (?P<c>\d+) crates\. How many (?P=p) are left in the warehouse\?"),
     lambda v: (v["a"] - v["c"]) * v["b"]),
    ("multiply-add", _rx(
        r"(?P<n>\w+) reads (?P<a>\d+) pages a day for (?P<d>\d+) days and then (?P<b>\d+) more "
        r"pages\. How many pages has (?P=n) read in all\?"),
     lambda v: v["a"] * v["d"] + v["b"]),
    ("divide-add", _rx(
        r"(?P<n>\w+) splits (?P<a>\d+) dollars equally into (?P<k>\d+) envelopes and then adds "
        r"(?P<b>\d+) dollars to one of them\. How many dollars are in that envelope now\?"),
     lambda v: v["a"] / v["k"] + v["b"]),
    ("multiply-subtract-subtract", _rx(
        r"A bakery in .{1,80}? bakes (?P<a>\d+) trays of (?P<b>\d+) rolls each\. It sells "
        r"(?P<c>\d+) rolls in the morning and (?P<d>\d+) in the afternoon\. How many rolls "
        r"are left\?"),
     lambda v: v["a"] * v["b"] - v["c"] - v["d"]),
)

_W = r"[A-Za-z][\w' -]{0,60}?"
EXTRACT: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("person", _rx(
        r"(?P<first>[A-Z][\w'-]*) (?P<last>[A-Z][\w'-]*) is (?P<age>\d+) years old and lives "
        rf"in (?P<city>{_W}), where (?P=first) works as an? (?P<job>{_W})\.")),
    ("person", _rx(
        rf"Meet (?P<first>[A-Z][\w'-]*) (?P<last>[A-Z][\w'-]*): an? (?P<job>{_W}) from "
        rf"(?P<city>{_W}), aged (?P<age>\d+)\.")),
    ("order", _rx(
        rf"Order (?P<order_id>ORD-\d+) was placed by (?P<customer>{_W}) for (?P<quantity>\d+) "
        rf"(?P<product>{_W}) at (?P<unit_price>\d+) dollars each\.")),
    ("order", _rx(
        rf"(?P<customer>[A-Z][\w'-]* [A-Z][\w'-]*) ordered (?P<quantity>\d+) (?P<product>{_W}) "
        r"\(order (?P<order_id>ORD-\d+)\), paying (?P<unit_price>\d+) dollars per unit\.")),
    ("shipment", _rx(
        rf"Shipment (?P<tracking_id>SHP-\d+) left (?P<origin>{_W}) carrying (?P<weight_kg>\d+) "
        rf"kg of (?P<goods>{_W}) and is bound for (?P<destination>{_W})\.")),
    ("shipment", _rx(
        rf"Bound for (?P<destination>{_W}), shipment (?P<tracking_id>SHP-\d+) of "
        rf"(?P<goods>{_W}) \((?P<weight_kg>\d+) kg\) departed from (?P<origin>{_W})\.")),
)
_EXTRACT_KEYS = re.compile(
    r"\s*Reply only with a JSON object with keys (?P<keys>(?:\"\w+\"(?:, | and )?){1,16})\. "
    r"Numbers are JSON numbers")
_JSON_KEYS = _rx(
    r"Reply only with a JSON object with keys (?P<keys>(?:\"\w+\"(?:, | and )?){1,16}), where "
    r"(?P<where>.+)\.\s*$")
_JSON_PAIR = re.compile(r'"(\w+)" is ("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|true|false|null)')
_QUOTED_KEY = re.compile(r'"(\w+)"')

FORMAT: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("words", _rx(r"Describe (?P<topic>.{1,120}?) in exactly (?P<n>\d+) words\.")),
    ("max_words", _rx(r"Describe (?P<topic>.{1,120}?) in at most (?P<n>\d+) words\.")),
    ("case", _rx(r"Write one sentence about (?P<topic>.{1,120}?) using only "
                 r"(?P<case>lower|upper)case letters\.")),
    ("starts_with", _rx(r"Write one sentence about (?P<topic>.{1,120}?) that begins with the word "
                        r"\"(?P<word>[^\"]+)\"\.")),
    ("ends_with", _rx(r"Write one sentence about (?P<topic>.{1,120}?) and end your reply "
                      r"with the exact text \"(?P<end>[^\"]+)\"")),
    ("lines", _rx(r"Write exactly (?P<n>\d+) lines about (?P<topic>.{1,120}?), one short "
                  r"phrase per line")),
    ("forbid", _rx(r"Write one sentence about (?P<topic>.{1,120}?) without using the word "
                   r"\"(?P<word>[^\"]+)\"\.")),
)

_OPTION = re.compile(r"^\s*([A-H])[.)] (.+?)\s*$", re.MULTILINE)
_EQUATION = re.compile(r"^(-?\d+) ([+x*×-]) (-?\d+) = (-?\d+)$")
CHOICE: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("largest", re.compile(r"Which number is the largest\?")),
    ("smallest", re.compile(r"Which number is the smallest\?")),
    ("equation", re.compile(r"Which of these (?:sums|products|equations) is correct\?")),
    ("alphabetical", re.compile(r"Which word comes first in alphabetical order\?")),
    ("not-multiple", re.compile(r"Three of these numbers are multiples of (?P<k>\d+)\. "
                                r"Which one is not\?")),
)


def solve(user_text: str) -> Task | None:
    """The task in `user_text` (the last user message, or a completions prompt) with what
    its right answer needs, or None when it is not one of the bundled families."""
    text = user_text.strip()
    if not text or len(text) > MAX_TASK_CHARS:
        return None
    for solver in (_solve_arithmetic, _solve_extraction, _solve_format, _solve_choice):
        task = solver(text)
        if task is not None:
            return task
    return None


def _solve_arithmetic(text: str) -> Task | None:
    for kind, pattern, compute in ARITH:
        m = pattern.match(text)
        if m is None:
            continue
        values = {k: int(v) for k, v in m.groupdict().items() if v is not None and v.isdigit()}
        try:
            result = compute(values)
        except ZeroDivisionError:
            return None
        return Task("arithmetic", kind, {"answer": _number(result)})
    return None


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(float(value), 4)


def _solve_extraction(text: str) -> Task | None:
    for kind, pattern in EXTRACT:
        m = pattern.match(text)
        if m is None:
            continue
        keys_m = _EXTRACT_KEYS.match(text, m.end())
        if keys_m is None:
            return None
        found = m.groupdict()
        if "first" in found:
            found["name"] = f"{found.pop('first')} {found.pop('last')}"
        keys = _QUOTED_KEY.findall(keys_m["keys"])
        if not keys or any(k not in found for k in keys):
            return None
        values = {k: int(found[k]) if found[k].isdigit() else found[k] for k in keys}
        return Task("extraction", kind, {"values": values})
    return None


def _solve_format(text: str) -> Task | None:
    m = _JSON_KEYS.match(text)
    if m is not None:
        keys = _QUOTED_KEY.findall(m["keys"])
        pairs = {k: json.loads(v) for k, v in _JSON_PAIR.findall(m["where"])}
        if keys and list(pairs) == keys:
            return Task("format", "json", {"values": pairs})
        return None
    for kind, pattern in FORMAT:
        m = pattern.match(text)
        if m is None:
            continue
        data: dict[str, Any] = {k: v for k, v in m.groupdict().items() if v is not None}
        if "n" in data:
            data["n"] = int(data["n"])
            if not 1 <= data["n"] <= 200:
                return None
        return Task("format", kind, data)
    return None


def _solve_choice(text: str) -> Task | None:
    for kind, pattern in CHOICE:
        m = pattern.match(text)
        if m is None:
            continue
        options = _OPTION.findall(text, m.end())
        letters = [letter for letter, _ in options]
        if len(options) < 2 or letters != [chr(ord("A") + i) for i in range(len(options))]:
            return None
        right = _choice_right(kind, [o for _, o in options], m)
        if right is None:
            return None
        return Task("choice", kind, {"letters": "".join(letters), "right": letters[right]})
    return None


def _choice_right(kind: str, options: list[str], m: re.Match[str]) -> int | None:
    """The index of the one right option, or None when there is not exactly one."""
    right: list[int]
    if kind in ("largest", "smallest"):
        if not all(re.fullmatch(r"-?\d+", o) for o in options):
            return None
        nums = [int(o) for o in options]
        best = max(nums) if kind == "largest" else min(nums)
        right = [i for i, n in enumerate(nums) if n == best]
    elif kind == "equation":
        right = []
        for i, option in enumerate(options):
            eq = _EQUATION.match(option)
            if eq is None:
                return None
            a, op, b, shown = int(eq[1]), eq[2], int(eq[3]), int(eq[4])
            true = a + b if op == "+" else a - b if op == "-" else a * b
            if true == shown:
                right.append(i)
    elif kind == "alphabetical":
        first = min(options, key=str.casefold)
        right = [i for i, o in enumerate(options) if o.casefold() == first.casefold()]
    else:  # not-multiple
        k = int(m["k"])
        if k == 0 or not all(o.isdigit() for o in options):
            return None
        right = [i for i, o in enumerate(options) if int(o) % k]
    return right[0] if len(right) == 1 else None


# -- answering --------------------------------------------------------------------------


def _draw(key: tuple[object, ...], profile_name: str,
          divergence_rate: float) -> tuple[float, random.Random]:
    """u (shared by every profile, or the profile's own on its divergence share of keys) and
    the generator that picks which wrong answer."""
    if divergence_rate > 0 and stable_unit("task-diverge", profile_name, *key) < divergence_rate:
        return (stable_unit("task-redraw", profile_name, *key),
                random.Random(stable_hash("task-wrong", profile_name, *key)))
    return stable_unit("task", *key), random.Random(stable_hash("task-wrong", *key))


def answer(task: Task, *, key_hash_parts: Sequence[object], profile_name: str,
           accuracy: float, divergence_rate: float) -> str:
    """The answer text: right iff u < accuracy (u shared by every profile, drawn again with
    the profile's name on its divergence share of keys), else plausibly wrong."""
    key = tuple(key_hash_parts)
    u, wrong_rng = _draw(key, profile_name, divergence_rate)
    # The right answer's wording (which filler words) is the same in every profile.
    text_rng = random.Random(stable_hash("task-text", *key))
    if u < accuracy:
        return right_text(task, text_rng)
    return wrong_text(task, text_rng, wrong_rng)


def is_right(*, key_hash_parts: Sequence[object], profile_name: str, accuracy: float,
             divergence_rate: float) -> bool:
    """Whether `answer` gives the right answer for this key (for tests and benchmarks)."""
    u, _ = _draw(tuple(key_hash_parts), profile_name, divergence_rate)
    return u < accuracy


def right_text(task: Task, rng: random.Random) -> str:
    return _RENDER[task.family](task, rng, None)


def wrong_text(task: Task, rng: random.Random, wrong: random.Random) -> str:
    return _RENDER[task.family](task, rng, wrong)


def _render_arithmetic(task: Task, rng: random.Random, wrong: random.Random | None) -> str:
    value = task.data["answer"]
    if wrong is not None:
        delta = wrong.choice((1, 1, 2, 2, 3, 5, 10)) * wrong.choice((-1, 1))
        value = value + delta if value + delta >= 0 else value - delta
        value = _number(value)
    return f"The answer is {value}."


def _wrong_field(values: dict[str, Any], wrong: random.Random) -> dict[str, Any]:
    """The object with one field plausibly wrong: a number off by a little, two places
    swapped, a name cut to its first word, a word's case changed."""
    out = dict(values)
    key = wrong.choice(list(out))
    value = out[key]
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        out[key] = None
    elif not isinstance(value, str):
        out[key] = value + wrong.choice((-3, -2, -1, 1, 2, 3))
    elif {"origin", "destination"} <= set(out) and key in ("origin", "destination"):
        out["origin"], out["destination"] = out["destination"], out["origin"]
    elif " " in value:
        out[key] = value.split(" ")[0]
    else:
        out[key] = value.lower() if value != value.lower() else value.capitalize()
    if out == values:  # the swap of two equal places, say: add a field instead
        out["note"] = "none"
    return out


def _render_json(task: Task, rng: random.Random, wrong: random.Random | None) -> str:
    values = task.data["values"]
    if wrong is not None:
        values = _wrong_field(values, wrong)
    return json.dumps(values, ensure_ascii=False, separators=(", ", ": "))


# The words a format answer is made of, read in a run from a random start: lowercase,
# plain, none contains a word the bundled format items forbid.
FILLER = ("quiet", "bright", "morning", "gentle", "wind", "moves", "across", "the", "open",
          "fields", "and", "soft", "rain", "falls", "on", "roofs", "people", "walk", "slowly",
          "under", "grey", "clouds", "while", "birds", "sing", "near", "tall", "trees",
          "every", "small", "sound", "feels", "calm", "warm", "steady", "glow", "fills",
          "streets", "boats", "drift", "past", "stone", "walls", "voices", "rise", "fade")


def _words(task: Task, rng: random.Random, n: int) -> list[str]:
    """n lowercase words about the task's topic, avoiding a forbidden word."""
    banned = str(task.data.get("word", "")).casefold() if task.kind == "forbid" else ""
    topic = [w for w in re.findall(r"[a-z]+", str(task.data.get("topic", "")).lower())
             if not (banned and banned in w)]
    pool = [w for w in FILLER if not (banned and banned in w)]
    out = topic[:n]
    start = rng.randrange(len(pool))  # consecutive filler reads like a phrase
    while len(out) < n:
        out.append(pool[(start + len(out)) % len(pool)])
    return out


def _sentence(words: list[str]) -> str:
    return " ".join(words) + "."


def _render_format(task: Task, rng: random.Random, wrong: random.Random | None) -> str:
    kind, data = task.kind, task.data
    if kind == "json":
        return _render_json(task, rng, wrong)
    bad = wrong is not None
    if kind == "words":
        n = data["n"] + ((1 if wrong.random() < 0.6 else -1) if wrong is not None else 0)
        return _sentence(_words(task, rng, max(n, 0) or data["n"] + 1))
    if kind == "max_words":
        n = data["n"]
        count = n + (wrong.randint(1, 4) if wrong is not None else -min(2, n - 1))
        return _sentence(_words(task, rng, count))
    if kind == "case":
        text = _sentence(_words(task, rng, 6 + rng.randrange(6)))
        if data["case"] == "upper":
            text = text.upper()
            return text[0] + text[1:].lower() if bad else text  # a sentence-case slip
        return text[0].upper() + text[1:] if bad else text
    if kind == "starts_with":
        words = _words(task, rng, 5 + rng.randrange(6))
        if not bad:
            return f"{data['word']} {_sentence(words)}"
        first = words[0].capitalize() if words[0].capitalize() != data["word"] else "Well"
        return f"{first} {_sentence(words[1:])}"
    if kind == "ends_with":
        text = _sentence(_words(task, rng, 5 + rng.randrange(6)))
        text = text[0].upper() + text[1:]
        return text if bad else f"{text} {data['end']}"
    if kind == "lines":
        n = data["n"] + (1 if bad else 0)
        return "\n".join(" ".join(_words(task, rng, 2 + rng.randrange(3))) for _ in range(n))
    if kind == "forbid":
        words = _words(task, rng, 6 + rng.randrange(5))
        if bad:
            words.insert(1 + rng.randrange(len(words) - 1), data["word"])
        text = _sentence(words)
        return text[0].upper() + text[1:]
    raise ValueError(f"unknown format rule {kind!r}")


def _render_choice(task: Task, rng: random.Random, wrong: random.Random | None) -> str:
    letter = task.data["right"]
    if wrong is not None:
        letter = wrong.choice([x for x in task.data["letters"] if x != letter])
    return f"The answer is {letter}."


_RENDER: dict[str, Callable[[Task, random.Random, random.Random | None], str]] = {
    "arithmetic": _render_arithmetic,
    "extraction": _render_json,
    "format": _render_format,
    "choice": _render_choice,
}


# -- the request side -------------------------------------------------------------------


def last_user_text(messages: Sequence[tuple[str, str]]) -> str | None:
    for role, text in reversed(messages):
        if role == "user":
            return text
    return None


def _parsed(messages: Sequence[Any]) -> list[tuple[str, str]]:
    """OpenAI messages (dicts with string or text-part content) or (role, text) pairs, as
    the server parses them."""
    out = []
    for message in messages:
        if isinstance(message, tuple):
            out.append((str(message[0]), str(message[1])))
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append((str(message.get("role", "")), content or ""))
    return out


def task_for(model: str, messages: Sequence[tuple[str, str]] | None, prompt_text: str,
             seed: int | None, profile: Profile) -> str | None:
    """The server's entry: `messages` as the request parsed them (None for completions),
    `prompt_text` the rendered prompt (the text key's)."""
    user = prompt_text if messages is None else last_user_text(messages)
    if user is None:
        return None
    task = solve(user)
    if task is None:
        return None
    key = TextKey.of(model, prompt_text, seed)
    return answer(task, key_hash_parts=(key,), profile_name=profile.name,
                  accuracy=profile.task_accuracy, divergence_rate=profile.divergence_rate)


def task_text(model: str, messages_or_prompt: str | Sequence[Any], seed: int | None,
              profile: Profile) -> str | None:
    """What a pool of `profile` answers to this chat (a list of messages) or completions
    prompt (a string) when it is a bundled eval task — the same text the server sends — or
    None when it is not a task (the pool then answers with its usual text)."""
    if isinstance(messages_or_prompt, str):
        return task_for(model, None, messages_or_prompt, seed, profile)
    parsed = _parsed(messages_or_prompt)
    return task_for(model, parsed, render_chat(parsed), seed, profile)
