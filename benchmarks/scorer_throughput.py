"""How many answers per second does each scorer in `fleetctl.evals.scorers` score on one core?

For each scorer, a few hundred realistic answers (a chain of reasoning ending in the
answer, 50 to 300 words, as eval runs get them at temperature 0; JSON objects for the JSON
scorers; tool calls for tool_call) are scored against their references with the params a
bundled suite would use, through the public `score()` (what an eval worker pays per item,
the failed-call check included). Each figure is the median of several runs, on one core
(the process is pinned to CPU 0 where the OS allows). Also times the regex scorer on a
catastrophic pattern, to show what the timeout costs per such answer. Prints figures;
asserts nothing. Usage:

    .venv/bin/python benchmarks/scorer_throughput.py [--answers 2000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetctl.evals.scorers import score, validate  # noqa: E402
from fleetctl.inference.compare import Answer, ToolCall  # noqa: E402

WORDS = ("the", "train", "leaves", "at", "noon", "and", "travels", "so", "we", "add",
         "apples", "each", "box", "holds", "then", "total", "price", "per", "item", "km")
SCHEMA = {"type": "object", "required": ["name", "email", "items"],
          "properties": {"name": {"type": "string"}, "email": {"type": "string"},
                         "items": {"type": "array", "items": {
                             "type": "object", "required": ["sku", "qty"],
                             "properties": {"sku": {"type": "string"},
                                            "qty": {"type": "integer", "minimum": 1}}}}}}


def prose(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(50, 300))]
    for i in range(0, len(words), 12):
        words[i] = str(rng.randint(1, 999))
    return " ".join(words) + "."


def cases(n: int, seed: int = 7) -> dict[str, tuple[dict[str, Any], list[tuple[Any, list[str]]]]]:
    """scorer -> (params, [(answer, references)]), half of the answers right."""
    rng = random.Random(seed)
    out: dict[str, tuple[dict[str, Any], list[tuple[Any, list[str]]]]] = {}

    def items(make: Any) -> list[tuple[Any, list[str]]]:
        return [make(i % 2 == 0) for i in range(n)]

    out["exact"] = ({}, items(lambda ok: ("Paris" if ok else "Lyon", ["Paris"])))
    out["normalised"] = ({}, items(lambda ok: (
        " The  Eiffel Tower!" if ok else "the louvre", ["the eiffel tower"])))
    out["regex"] = ({"pattern": r"answer is (\S+?)\.?$", "occurrence": "last"}, items(
        lambda ok: (prose(rng) + f" So the answer is {'Paris' if ok else 'Lyon'}.", ["Paris"])))
    out["numeric"] = ({"abs_tol": 0.01}, items(lambda ok: (
        prose(rng) + f" The total is ${'1,234.50' if ok else '1,243.50'}.", ["1234.5"])))
    out["choice"] = ({}, items(lambda ok: (
        prose(rng) + f" Therefore the answer is ({'B' if ok else 'C'}).", ["B"])))
    out["contains"] = ({}, items(lambda ok: (
        prose(rng) + (" Paris" if ok else " Lyon"), ["Paris", "City of Light"])))

    def order(ok: bool) -> str:
        doc = {"name": "Ada Lovelace", "email": "ada@example.com",
               "items": [{"sku": f"SKU-{i}", "qty": rng.randint(1, 9) if ok else 0}
                         for i in range(rng.randint(2, 12))]}
        return json.dumps(doc, indent=2)

    out["json"] = ({}, items(lambda ok: (order(True) if ok else order(True)[:-3], [])))
    out["json_schema"] = ({"schema": SCHEMA}, items(lambda ok: (
        "```json\n" + order(ok) + "\n```", [])))
    ref = json.dumps({"name": "get_weather",
                      "arguments": {"city": "Paris", "units": "c", "days": 3}})
    out["tool_call"] = ({"partial": True}, items(lambda ok: (Answer(tool_calls=(ToolCall(
        "get_weather", json.dumps({"days": 3, "units": "c", "city": "Paris" if ok else "Rome"})),
    )), [ref])))
    return out


def rate(name: str, params: dict[str, Any], batch: list[tuple[Any, list[str]]],
         runs: int) -> tuple[float, float]:
    answers = [(a if isinstance(a, Answer) else Answer(text=a), refs) for a, refs in batch]
    got = []
    mean = 0.0
    for _ in range(runs):
        start = time.perf_counter()
        total = 0.0
        for answer, refs in answers:
            total += score(name, answer, refs, params).value
        got.append(len(answers) / (time.perf_counter() - start))
        mean = total / len(answers)
    return statistics.median(got), mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(f"scorer throughput, one core, {args.answers} answers, median of {args.runs} runs")
    print(f"{'scorer':<12} {'scores/s':>12}  mean score")
    for name, (raw, batch) in cases(args.answers).items():
        params = validate(name, raw)
        per_s, mean = rate(name, params, batch, args.runs)
        print(f"{name:<12} {per_s:>12,.0f}  {mean:.2f}")
    params = validate("regex", {"pattern": r"(a+)+$", "timeout_s": 0.1})
    start = time.perf_counter()
    got = score("regex", "a" * 5000 + "b", ["a"], params)
    print(f"catastrophic regex (a+)+$ on 5,001 chars: {time.perf_counter() - start:.3f} s, "
          f"scored {got.value:g}: {got.reason}")


if __name__ == "__main__":
    main()
