"""The error cases: a malformed body, an unknown model, a prompt over the context and, when a
run asks for it, saturation."""

from __future__ import annotations

import asyncio
from email.utils import parsedate_to_datetime
from typing import Any

from fleetctl.conformance.cases.probe import (
    FAIL,
    MESSAGES,
    PASS,
    SATURATION_REQUESTS,
    SATURATION_WAVES,
    SKIP,
    UNKNOWN_MODEL,
    Outcome,
    Probe,
)
from fleetctl.conformance.cases.registry import _json, _outcome, case
from fleetctl.core.http import AsyncClient, OutboundError, OutboundResponse


def _error_answer_problems(answer: OutboundResponse, status: int, body: Any) -> list[str]:
    """What keeps `answer` from being an HTTP `status` with an OpenAI error object `body`."""
    problems = []
    if answer.status_code != status:
        problems.append(f"HTTP {answer.status_code}")
    if problem := _error_object_problem(body):
        problems.append(problem)
    return problems


def _error_object_problem(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "no {\"error\": {…}} object"
    if not isinstance(error.get("message"), str) or not error["message"]:
        return "the error has no message"
    if "type" not in error:
        return "the error has no type"
    return ""


@case("errors.malformed", "A malformed body answers 400 with an error object",
      short="400 on a malformed body", required=True,
      sends="POST /v1/chat/completions with a body that is not valid JSON",
      judges="400 and an OpenAI error object (error.message, error.type)",
      expected="400 with an error object")
def errors_malformed(probe: Probe, expected: str) -> Outcome:
    raw = b'{"model": "' + probe.model.encode() + b'", "messages": ['
    answer = probe.post("/v1/chat/completions", content=raw)
    body = _json(answer)
    problems = _error_answer_problems(answer, 400, body)
    request = raw.decode()
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), request=request,
                        answer=answer)
    return _outcome(PASS, expected, f"400: {body['error']['message'][:100]}",
                    request=request, answer=answer)


@case("errors.unknown_model", "An unknown model answers 404",
      short="404 on an unknown model", required=True,
      sends=f"a chat request for model {UNKNOWN_MODEL}",
      judges="404 and an OpenAI error object (code model_not_found noted)",
      expected="404 with an error object")
def errors_unknown_model(probe: Probe, expected: str) -> Outcome:
    request = {"model": UNKNOWN_MODEL, "messages": MESSAGES, "max_tokens": 4}
    answer = probe.post("/v1/chat/completions", request)
    body = _json(answer)
    problems = _error_answer_problems(answer, 404, body)
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), request=request,
                        answer=answer)
    code = body["error"].get("code")
    return _outcome(PASS, expected, f"404, code {code}", request=request, answer=answer,
                    code=code)


@case("errors.context_length", "A prompt over the context answers context_length_exceeded",
      short="context_length_exceeded", required=True,
      sends="a user message of more words than the model's context (max_model_len from "
            "/v1/models, else the pool registry's max context) + 64",
      judges="400 with error.code context_length_exceeded",
      expected="400, error.code context_length_exceeded")
def errors_context_length(probe: Probe, expected: str) -> Outcome:
    limit, source = probe.max_context()
    if limit is None:
        return _outcome(SKIP, expected, "the model's context is unknown (no max_model_len "
                        "and no registry entry)")
    words = limit + 64
    request = {"model": probe.model, "max_tokens": 16,
               "messages": [{"role": "user", "content": "word " * words}]}
    answer = probe.post("/v1/chat/completions", request)
    body = _json(answer)
    shown = {**request, "messages": [{"role": "user",
                                      "content": f"word × {words} ({source}: {limit})"}]}
    code = ((body or {}).get("error") or {}).get("code") if isinstance(body, dict) else None
    if answer.status_code != 400 or code != "context_length_exceeded":
        return _outcome(FAIL, expected, f"HTTP {answer.status_code}, code {code!r}",
                        request=shown, answer=answer, max_context=limit,
                        max_context_source=source)
    return _outcome(PASS, expected, f"400 context_length_exceeded for {words} words "
                    f"({source}: {limit})", request=shown, answer=answer,
                    max_context=limit, max_context_source=source)


def _retry_after_ok(value: str) -> bool:
    try:
        return float(value) >= 0
    except ValueError:
        pass
    try:
        parsedate_to_datetime(value)
        return True
    except (TypeError, ValueError):
        return False


async def _flood(probe: Probe) -> tuple[OutboundResponse | None, int, int]:
    """Waves of concurrent streams until one answers 429: (that answer, sent, errors)."""
    request = {"model": probe.model, "messages": MESSAGES, "max_tokens": 32,
               "temperature": 0}
    sent = errors = 0
    async with AsyncClient(base_url=probe.base_url, timeout_s=probe.timeout_s,
                           max_connections=SATURATION_REQUESTS) as client:
        for _ in range(SATURATION_WAVES):
            wave = [asyncio.ensure_future(client.post("/v1/chat/completions", json=request))
                    for _ in range(SATURATION_REQUESTS)]
            sent += len(wave)
            try:
                for next_done in asyncio.as_completed(wave):
                    try:
                        result = await next_done
                    except OutboundError:
                        errors += 1
                        continue
                    if result.status_code == 429:
                        return result, sent, errors
            finally:  # the first 429 is the answer: the rest of the wave is not needed
                for task in wave:
                    task.cancel()
                await asyncio.gather(*wave, return_exceptions=True)
    return None, sent, errors


@case("errors.rate_limit", "Saturation answers 429 with Retry-After",
      short="429 with Retry-After", required=False,
      opt_in=True,
      sends=f"up to {SATURATION_WAVES} waves of {SATURATION_REQUESTS} concurrent chat "
            f"requests (floods the pool: only when the run asks for it)",
      judges="some request answers 429 with a Retry-After header (seconds or an HTTP date) "
             "and an error object",
      expected="a 429 with Retry-After under saturation")
def errors_rate_limit(probe: Probe, expected: str) -> Outcome:
    answer, sent, errors = asyncio.run(_flood(probe))
    request = f"{sent} concurrent chat requests"
    if answer is None:
        return _outcome(FAIL, expected, f"no 429 after {sent} concurrent requests "
                        f"({errors} without an answer)", brief="no 429 under saturation",
                        request=request, sent=sent)
    retry = {k.lower(): v for k, v in answer.headers.items()}.get("retry-after")
    problems = []
    if retry is None:
        problems.append("429 without Retry-After")
    elif not _retry_after_ok(retry):
        problems.append(f"Retry-After {retry!r} is neither seconds nor a date")
    if problem := _error_object_problem(_json(answer)):
        problems.append(problem)
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), request=request,
                        answer=answer, sent=sent)
    return _outcome(PASS, expected, f"429 with Retry-After {retry} after {sent} requests",
                    request=request, answer=answer, sent=sent, retry_after=retry)
