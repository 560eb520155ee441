"""How many answer pairs per second does `fleetctl.inference.compare` compare on one core?

Builds 512-token chat answers (each token with its logprob and 5 top_logprobs, as a shadow
run requests them) for four cases — identical, diverging at token 5, diverging at token
500, and JSON objects checked against a schema — and times, per case:

- `compare`: `compare(a, b, greedy=True)` on answers already built;
- `parse+compare`: `Answer.from_body` on both bodies, then `compare` (what a shadow worker
  pays per pair);

and `compare` in sampled mode (greedy=False) on the identical pair. Each figure is the
median of several runs. Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/compare_throughput.py [--pairs 2000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetctl.inference.compare import Answer, compare  # noqa: E402

TOKENS = 512
TARGET_PAIRS_PER_S = 500
VOCAB = [" river", " stone", " light", " the", " of", " and", ",", ".", " model", " pool",
         " answer", " token", " quick", " brown", " fox", " jumps", " over", " lazy", " dog"]
SCHEMA = {"type": "object", "required": ["items"],
          "properties": {"items": {"type": "array", "items": {
              "type": "object", "required": ["id", "name"],
              "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}}}}


def body(tokens: list[str]) -> dict[str, Any]:
    rng = random.Random(len(tokens))
    content = []
    for t in tokens:
        top = [{"token": t, "logprob": -0.05}] + [
            {"token": rng.choice(VOCAB), "logprob": -3.0 - i} for i in range(4)]
        content.append({"token": t, "logprob": -0.05, "top_logprobs": top})
    return {"choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "".join(tokens)},
                         "logprobs": {"content": content}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": len(tokens),
                      "total_tokens": 100 + len(tokens)}}


def text_tokens(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(VOCAB) for _ in range(TOKENS)]


def json_tokens(seed: int) -> list[str]:
    rng = random.Random(seed)
    items = []
    while True:
        items.append({"id": len(items), "name": rng.choice(VOCAB).strip()})
        # Roughly one token per JSON punctuation mark or word: stop near 512.
        text = json.dumps({"items": items})
        if len(text) // 4 >= TOKENS:
            break
    return cut(text)


def cut(text: str) -> list[str]:
    """The text in 512 pieces, so that the logprob tokens still concatenate to it."""
    step = len(text) / TOKENS
    cuts = [round(i * step) for i in range(TOKENS + 1)]
    return [text[cuts[i]:cuts[i + 1]] for i in range(TOKENS)]


def cases() -> dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    base = text_tokens(1)
    early, late = list(base), list(base)
    early[5] = " different"
    late[500] = " different"
    js = json_tokens(2)
    js_other = json.loads("".join(js))
    js_other["items"][-1]["name"] = "changed"
    other_tokens = cut(json.dumps(js_other))
    return {
        "identical": (body(base), body(list(base)), {}),
        "diverging early (token 5)": (body(base), body(early), {}),
        "diverging late (token 500)": (body(base), body(late), {}),
        "JSON with a schema": (body(js), body(other_tokens), {"schema": SCHEMA}),
    }


def rate(fn: Callable[[], object], pairs: int, runs: int) -> float:
    results = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(pairs):
            fn()
        results.append(pairs / (time.perf_counter() - start))
    return statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{TOKENS}-token answers, {args.pairs} pairs per run, median of {args.runs} runs "
          f"(target {TARGET_PAIRS_PER_S} pairs/s)")
    print(f"{'case':<28} {'compare':>12} {'parse+compare':>14}")
    for name, (ba, bb, kwargs) in cases().items():
        a, b = Answer.from_body(ba), Answer.from_body(bb)
        only = rate(lambda a=a, b=b, kw=kwargs: compare(a, b, greedy=True, **kw),
                    args.pairs, args.runs)
        both = rate(lambda ba=ba, bb=bb, kw=kwargs: compare(
            Answer.from_body(ba), Answer.from_body(bb), greedy=True, **kw),
            args.pairs, args.runs)
        print(f"{name:<28} {only:>9,.0f}/s {both:>11,.0f}/s")
    ba, bb, _ = cases()["identical"]
    a, b = Answer.from_body(ba), Answer.from_body(bb)
    sampled = rate(lambda: compare(a, b, greedy=False), args.pairs, args.runs)
    print(f"{'sampled mode (identical)':<28} {sampled:>9,.0f}/s")


if __name__ == "__main__":
    main()
