"""The parity cases: the pool under test against the reference pool."""

from __future__ import annotations

from typing import Any

from fleetctl.conformance.cases.probe import (
    ERROR,
    FAIL,
    PARITY_MESSAGES,
    PASS,
    SKIP,
    Outcome,
    Probe,
)
from fleetctl.conformance.cases.registry import _outcome, parity_case


@parity_case("parity.prompt_tokens", "Prompt-token parity with the reference",
             short="prompt-token parity", required=True,
             sends=f"{len(PARITY_MESSAGES)} message sets (one turn, system + user, multi-turn, "
             "a passage of prose) to both pools, max_tokens 1",
             judges="usage.prompt_tokens is the same on both for every set (same tokenizer and "
             "chat template)",
             expected="the same usage.prompt_tokens as the reference")
def parity_prompt_tokens(probe: Probe, ref: Probe, expected: str) -> Outcome:
    mine, theirs, diffs, problems = [], [], [], []
    for index in range(len(PARITY_MESSAGES)):
        a, why_a = probe.prompt_tokens(index)
        b, why_b = ref.prompt_tokens(index)
        mine.append(a)
        theirs.append(b)
        if a is None:
            problems.append(f"set {index + 1}: {why_a}")
        elif b is None:
            problems.append(f"set {index + 1} on {ref.pool_name}: {why_b}")
        elif a != b:
            diffs.append(a - b)
    numbers: dict[str, Any] = {"pool": mine, "reference": theirs,
                               "reference_pool": ref.pool_name}
    request = {"messages": PARITY_MESSAGES, "max_tokens": 1}
    response = f"{probe.pool_name}: {mine}; {ref.pool_name}: {theirs}"
    if problems:
        out = _outcome(ERROR, expected, "; ".join(problems), request=request, **numbers)
    elif diffs:
        worst = max(diffs, key=abs)
        out = _outcome(FAIL, expected, f"prompt tokens {mine} vs {theirs} on "
                       f"{ref.pool_name}", brief=f"{worst:+d} tokens vs {ref.pool_name}",
                       request=request, **numbers)
    else:
        out = _outcome(PASS, expected, f"{mine} on both", request=request, **numbers)
    out.response = response
    return out


@parity_case("parity.max_context", "Max-context parity with the reference",
             short="max-context parity", required=False,
             sends="GET /v1/models on both pools",
             judges="the same context window: max_model_len from /v1/models where reported, else "
             "the pool registry's max context for the model (the row says which)",
             expected="the same max context as the reference")
def parity_max_context(probe: Probe, ref: Probe, expected: str) -> Outcome:
    a, source_a = probe.max_context()
    b, source_b = ref.max_context()
    numbers: dict[str, Any] = {"pool": a, "pool_source": source_a, "reference": b,
               "reference_source": source_b, "reference_pool": ref.pool_name}
    if a is None or b is None:
        return _outcome(SKIP, expected, "a context window is unknown", **numbers)
    if a != b:
        return _outcome(FAIL, expected, f"{a} ({source_a}) vs {b} on {ref.pool_name} "
                        f"({source_b})", brief=f"{a} vs {b} tokens on {ref.pool_name}",
                        **numbers)
    return _outcome(PASS, expected, f"{a} on both ({source_a})", **numbers)
