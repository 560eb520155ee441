"""How a case is declared and judged: the registry, the two decorators that add to it, and the
helpers every case judges with."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetctl.conformance.cases.probe import (
    ERROR,
    EXCERPT_CHARS,
    FAIL,
    SKIP,
    Outcome,
    Probe,
)
from fleetctl.core.http import OutboundError, OutboundResponse

Judge = Callable[[Probe, "Probe | None"], Outcome]


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    required: bool
    sends: str
    judges: str
    judge: Judge
    parity: bool = False  # compares with the reference pool: runs on the pool under test only
    opt_in: bool = False  # runs only when the run asks for it
    short: str = ""  # how the run's summary names it

    @property
    def label(self) -> str:
        return self.short or self.key


CASES: list[Case] = []


# A case's body: it judges the pool under test (and the reference, for a parity case) and is
# given the sentence saying what was expected. The decorators add the rest every case shares.
CaseBody = Callable[[Probe, str], Outcome]
ParityBody = Callable[[Probe, Probe, str], Outcome]
Expected = str | Callable[[Probe], str]  # the sentence, or how to say it for this probe
NO_REFERENCE = "no reference pool (name a plan or --primary)"


def case(key: str, title: str, *, required: bool, sends: str, judges: str, expected: Expected,
         opt_in: bool = False, short: str = "") -> Callable[[CaseBody], Judge]:
    """Register a case judged on the pool under test. An endpoint that does not answer is an
    error outcome, not a failure."""
    def add(body: CaseBody) -> Judge:
        def judge(probe: Probe, ref: Probe | None) -> Outcome:
            wanted = _expected(expected, probe)
            return _call(lambda: body(probe, wanted), wanted)

        CASES.append(Case(key, title, required, sends, judges, judge, False, opt_in, short))
        return judge

    return add


def parity_case(key: str, title: str, *, required: bool, sends: str, judges: str,
                expected: Expected, short: str = "") -> Callable[[ParityBody], Judge]:
    """Register a case that compares the pool under test with the reference pool: skipped
    when the run has no reference."""
    def add(body: ParityBody) -> Judge:
        def judge(probe: Probe, ref: Probe | None) -> Outcome:
            wanted = _expected(expected, probe)
            if ref is None:
                return _outcome(SKIP, wanted, NO_REFERENCE)
            reference = ref
            return _call(lambda: body(probe, reference, wanted), wanted)

        CASES.append(Case(key, title, required, sends, judges, judge, True, False, short))
        return judge

    return add


def _expected(expected: Expected, probe: Probe) -> str:
    return expected(probe) if callable(expected) else expected


def by_key() -> dict[str, Case]:
    return {c.key: c for c in CASES}


# --- helpers ----------------------------------------------------------------------------------

def _excerpt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + " …(cut)"


def _outcome(status: str, expected: str, got: str, *, brief: str = "", request: Any = None,
             answer: OutboundResponse | None = None, **numbers: Any) -> Outcome:
    return Outcome(status=status, expected=expected, got=got, brief=brief or got,
                   request=request,
                   response=_excerpt(f"HTTP {answer.status_code} {answer.text}") if answer
                   else "",
                   latency_ms=round(answer.latency_ms, 1) if answer else None, numbers=numbers)


def _json(answer: OutboundResponse) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None


def _not_ok(expected: str, body: Any, answer: OutboundResponse) -> Outcome:
    message = ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = f": {str(body['error'].get('message', ''))[:200]}"
    return _outcome(FAIL, expected, f"HTTP {answer.status_code}{message}", request=body,
                    answer=answer, brief=f"HTTP {answer.status_code}")


def sse_events(text: str) -> tuple[list[Any], bool, str]:
    """The `data:` payloads of an SSE body: (decoded chunks, saw [DONE], first problem)."""
    chunks: list[Any] = []
    done = False
    problem = ""
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        if done and not problem:
            problem = "data after [DONE]"
        try:
            chunks.append(json.loads(payload))
        except ValueError:
            problem = problem or f"a data line is not JSON: {payload[:80]!r}"
    return chunks, done, problem


def _usage_problem(usage: Any) -> str:
    if not isinstance(usage, dict):
        return "no usage object"
    numbers = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
        return f"usage fields are not counts: {usage}"
    if numbers[0] + numbers[1] != numbers[2]:  # type: ignore[operator]
        return f"total_tokens {numbers[2]} ≠ prompt {numbers[0]} + completion {numbers[1]}"
    if numbers[0] == 0:
        return "usage.prompt_tokens is 0"
    return ""


def _first_choice(body: Any) -> dict[str, Any] | None:
    if not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]


def _content(body: Any) -> str | None:
    choice = _first_choice(body)
    message = (choice or {}).get("message")
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    return content if isinstance(content, str) else None


def _call(judge: Callable[[], Outcome], expected: str) -> Outcome:
    try:
        return judge()
    except OutboundError as exc:
        return Outcome(ERROR, expected, f"no answer: {exc}", brief="no answer")
