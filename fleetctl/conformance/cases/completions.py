"""The completion cases: /v1/models, chat and text completions, plain and streamed, stop,
length, seed and logprobs."""

from __future__ import annotations

from typing import Any

from fleetctl.conformance.cases.probe import FAIL, MESSAGES, PASS, PROMPT, SKIP, Outcome, Probe
from fleetctl.conformance.cases.registry import (
    _content,
    _first_choice,
    _json,
    _not_ok,
    _outcome,
    _usage_problem,
    case,
    sse_events,
)


@case("models.list", "/v1/models lists the model",
      short="/v1/models", required=True,
      sends="GET /v1/models",
      judges="200, an object of type list whose data holds every model the plan's routes "
             "serve (or the run's model), each with id and object \"model\"",
      expected=lambda probe: f"200 listing {', '.join(probe.expected_models)}")
def models_list(probe: Probe, expected: str) -> Outcome:
    answer, _ = probe.models_card()
    if answer is None:
        answer = probe.client.get("/v1/models")
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, body, answer)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or body.get("object") != "list":
        return _outcome(FAIL, expected, "not an object of type list with data",
                        answer=answer)
    ids = [m.get("id") for m in data if isinstance(m, dict)]
    missing = [m for m in probe.expected_models if m not in ids]
    if missing:
        return _outcome(FAIL, expected, f"missing {', '.join(missing)} (lists "
                        f"{', '.join(map(str, ids)) or 'nothing'})", answer=answer,
                        brief=f"does not list {', '.join(missing)}")
    return _outcome(PASS, expected, f"lists {', '.join(map(str, ids))}", answer=answer)


@case("chat.basic", "Chat completion (not streamed) with usage",
      short="chat", required=True,
      sends="POST /v1/chat/completions, a system and a user message, max_tokens 16",
      judges="200, object chat.completion, one choice with an assistant message and text "
             "content, finish_reason stop or length, usage with prompt, completion and total "
             "token counts that add up",
      expected="a chat.completion with content, finish_reason and usage that adds up")
def chat_basic(probe: Probe, expected: str) -> Outcome:
    request, answer = probe.chat()
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    choice = _first_choice(body)
    problems = []
    if body.get("object") != "chat.completion":
        problems.append(f"object is {body.get('object')!r}")
    if choice is None or _content(body) is None:
        problems.append("no choice with text content")
    elif (choice.get("message") or {}).get("role") != "assistant":
        problems.append("the message's role is not assistant")
    if choice is not None and choice.get("finish_reason") not in ("stop", "length"):
        problems.append(f"finish_reason {choice.get('finish_reason')!r}")
    if usage := _usage_problem(body.get("usage")):
        problems.append(usage)
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer)
    return _outcome(PASS, expected, f"{body['usage']['completion_tokens']} tokens, "
                    f"finish_reason {choice['finish_reason']}",  # type: ignore[index]
                    request=request, answer=answer)


def _stream_judge(probe: Probe, expected: str, *, chat: bool, include_usage: bool) -> Outcome:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    request: dict[str, Any] = {"model": probe.model, "max_tokens": 16, "temperature": 0,
                               "stream": True}
    if chat:
        request["messages"] = MESSAGES
    else:
        request["prompt"] = PROMPT
    if include_usage:
        request["stream_options"] = {"include_usage": True}
    answer = probe.post(path, request)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    chunks, done, problem = sse_events(answer.text)
    problems = [problem] if problem else []
    if "text/event-stream" not in answer.content_type:
        problems.append(f"content type {answer.content_type or 'missing'}")
    if not done:
        problems.append("the stream does not end with data: [DONE]")
    kind = "chat.completion.chunk" if chat else "text_completion"
    if any(not isinstance(c, dict) or c.get("object") != kind for c in chunks):
        problems.append(f"a chunk's object is not {kind}")
    texts, finishes = [], []
    for chunk in chunks:
        for choice in (chunk.get("choices") or []) if isinstance(chunk, dict) else []:
            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if isinstance(text, str) and text:
                texts.append(text)
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
    if not texts:
        problems.append("no text in any chunk")
    if len(finishes) != 1:
        problems.append(f"{len(finishes)} chunks carry a finish_reason (expected one)")
    numbers: dict[str, Any] = {"chunks": len(chunks)}
    if include_usage:
        last = chunks[-1] if chunks else None
        usage = last.get("usage") if isinstance(last, dict) else None
        if usage is None:
            problems.append("no usage in the final chunk")
            brief = "no usage in the final chunk"
        else:
            if why := _usage_problem(usage):
                problems.append(f"final chunk: {why}")
            if last.get("choices"):  # type: ignore[union-attr]
                problems.append("the usage chunk has choices (expected an empty list)")
            brief = "; ".join(problems)
            numbers["usage"] = usage
    else:
        brief = "; ".join(problems)
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), brief=brief, request=request,
                        answer=answer, **numbers)
    return _outcome(PASS, expected, f"{len(chunks)} chunks, {len(texts)} with text, "
                    f"finish_reason {finishes[0]}, [DONE]", request=request, answer=answer,
                    **numbers)


@case("chat.stream", "Chat completion, streamed",
      short="streamed chat", required=True,
      sends="POST /v1/chat/completions with stream: true",
      judges="200, text/event-stream of chat.completion.chunk objects with content deltas, "
             "exactly one finish_reason, ending with data: [DONE]",
      expected="SSE chat.completion.chunk deltas, one finish_reason, [DONE]")
def chat_stream(probe: Probe, expected: str) -> Outcome:
    return _stream_judge(probe, expected, chat=True, include_usage=False)


@case("chat.stream_usage", "Streamed usage (stream_options.include_usage)",
      short="streamed usage", required=True,
      sends="POST /v1/chat/completions with stream: true and "
            "stream_options: {include_usage: true}",
      judges="the final chunk before [DONE] carries usage (counts that add up) and an empty "
             "choices list",
      expected="usage in the final chunk, with choices []")
def chat_stream_usage(probe: Probe, expected: str) -> Outcome:
    return _stream_judge(probe, expected, chat=True, include_usage=True)


@case("completions.basic", "Text completion (not streamed)",
      short="completions", required=False,
      sends="POST /v1/completions with a prompt, max_tokens 16",
      judges="200, object text_completion, one choice with text and finish_reason, usage "
             "that adds up",
      expected="a text_completion with text, finish_reason and usage")
def completions_basic(probe: Probe, expected: str) -> Outcome:
    request = {"model": probe.model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    answer = probe.post("/v1/completions", request)
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    choice = _first_choice(body)
    problems = []
    if body.get("object") != "text_completion":
        problems.append(f"object is {body.get('object')!r}")
    if choice is None or not isinstance(choice.get("text"), str):
        problems.append("no choice with text")
    elif choice.get("finish_reason") not in ("stop", "length"):
        problems.append(f"finish_reason {choice.get('finish_reason')!r}")
    if usage := _usage_problem(body.get("usage")):
        problems.append(usage)
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer)
    return _outcome(PASS, expected, f"text, finish_reason {choice['finish_reason']}",  # type: ignore[index]
                    request=request, answer=answer)


@case("completions.stream", "Text completion, streamed",
      short="streamed completions", required=False,
      sends="POST /v1/completions with stream: true",
      judges="text/event-stream of text_completion chunks with text, one finish_reason, "
             "[DONE]",
      expected="SSE text_completion chunks, one finish_reason, [DONE]")
def completions_stream(probe: Probe, expected: str) -> Outcome:
    return _stream_judge(probe, expected, chat=False, include_usage=False)


@case("chat.stop", "A stop sequence ends the answer",
      short="stop", required=True,
      sends="a first answer (temperature 0, seed 7), then the same request with one of its "
            "words as stop",
      judges="finish_reason stop and the stop string absent from the content",
      expected="finish_reason stop, the stop string not in the content")
def chat_stop(probe: Probe, expected: str) -> Outcome:
    first_request, first = probe.chat(max_tokens=24, seed=7)
    text = _content(_json(first)) if first.status_code == 200 else None
    if text is None:
        return _not_ok(expected, first_request, first)
    words = [w.strip(".,;:!?\"'()") for w in text.split()]
    words = [w for w in words[2:] if len(w) >= 3]
    if not words:
        return _outcome(SKIP, expected, f"the first answer has no word to stop on "
                        f"({text[:60]!r})", request=first_request, answer=first)
    stop = f" {words[0]}"
    request, answer = probe.chat(max_tokens=24, seed=7, stop=[stop])
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    content = _content(body)
    finish = (_first_choice(body) or {}).get("finish_reason")
    problems = []
    if content is None:
        problems.append("no content")
    elif stop in content:
        problems.append(f"the content contains the stop string {stop!r}")
    if finish != "stop":
        problems.append(f"finish_reason {finish!r}")
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer,
                        stop=stop)
    return _outcome(PASS, expected, f"stopped before {stop!r}, finish_reason stop",
                    request=request, answer=answer, stop=stop)


@case("chat.length", "max_tokens ends the answer with finish_reason length",
      short="max_tokens → length", required=True,
      sends="POST /v1/chat/completions with max_tokens 4",
      judges="finish_reason length and usage.completion_tokens at most 4",
      expected='finish_reason "length", at most 4 completion tokens')
def chat_length(probe: Probe, expected: str) -> Outcome:
    request, answer = probe.chat(max_tokens=4,
                                 messages=[{"role": "user",
                                            "content": "Write a long story about a ship."}])
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    finish = (_first_choice(body) or {}).get("finish_reason")
    used = (body.get("usage") or {}).get("completion_tokens")
    problems = []
    if finish != "length":
        problems.append(f"finish_reason {finish!r}")
    if not isinstance(used, int) or used > 4:
        problems.append(f"usage.completion_tokens {used!r}")
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer)
    return _outcome(PASS, expected, f"finish_reason length after {used} tokens",
                    request=request, answer=answer)


@case("chat.seed", "Seed: the same request gives the same text at temperature 0",
      short="seed determinism", required=False,
      sends="the same chat request twice, temperature 0, seed 1234, max_tokens 24",
      judges="the two contents are identical",
      expected="identical content")
def chat_seed(probe: Probe, expected: str) -> Outcome:
    request, one = probe.chat(max_tokens=24, seed=1234)
    _, two = probe.chat(max_tokens=24, seed=1234)
    if one.status_code != 200:
        return _not_ok(expected, request, one)
    if two.status_code != 200:
        return _not_ok(expected, request, two)
    a, b = _content(_json(one)), _content(_json(two))
    if a is None or a != b:
        return _outcome(FAIL, expected, f"{a!r} then {b!r}", brief="answers differ",
                        request=request, answer=two)
    return _outcome(PASS, expected, f"both {a[:60]!r}", request=request, answer=two)


@case("chat.logprobs", "Chat logprobs and top_logprobs",
      short="chat logprobs", required=False,
      sends="POST /v1/chat/completions with logprobs: true, top_logprobs: 2, max_tokens 8",
      judges="choices[0].logprobs.content: one entry per token, each with token, a logprob "
             "≤ 0 and 2 top_logprobs",
      expected="logprobs.content entries with token, logprob ≤ 0 and 2 top_logprobs")
def chat_logprobs(probe: Probe, expected: str) -> Outcome:
    request, answer = probe.chat(max_tokens=8, logprobs=True, top_logprobs=2)
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    content = ((_first_choice(body) or {}).get("logprobs") or {}).get("content")
    if not isinstance(content, list) or not content:
        return _outcome(FAIL, expected, "no logprobs.content", request=request,
                        answer=answer)
    bad = [e for e in content if not isinstance(e, dict)
           or not isinstance(e.get("token"), str)
           or not isinstance(e.get("logprob"), int | float) or e["logprob"] > 0
           or not isinstance(e.get("top_logprobs"), list) or len(e["top_logprobs"]) != 2]
    if bad:
        return _outcome(FAIL, expected, f"{len(bad)} of {len(content)} entries are not "
                        f"shaped so (first: {str(bad[0])[:120]})", request=request,
                        answer=answer, brief="logprobs misshapen")
    return _outcome(PASS, expected, f"{len(content)} entries", request=request,
                    answer=answer)


@case("completions.logprobs", "Completions logprobs",
      short="completions logprobs", required=False,
      sends="POST /v1/completions with logprobs: 2, max_tokens 8",
      judges="choices[0].logprobs has tokens, token_logprobs and top_logprobs of one length, "
             "2 alternatives per token",
      expected="tokens, token_logprobs, top_logprobs (2 each) of one length")
def completions_logprobs(probe: Probe, expected: str) -> Outcome:
    request = {"model": probe.model, "prompt": PROMPT, "max_tokens": 8, "logprobs": 2,
               "temperature": 0}
    answer = probe.post("/v1/completions", request)
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    lp = (_first_choice(body) or {}).get("logprobs")
    if not isinstance(lp, dict):
        return _outcome(FAIL, expected, "no logprobs object", request=request,
                        answer=answer)
    tokens, values, tops = (lp.get("tokens"), lp.get("token_logprobs"),
                            lp.get("top_logprobs"))
    if not (isinstance(tokens, list) and isinstance(values, list)
            and isinstance(tops, list) and tokens
            and len(tokens) == len(values) == len(tops)):
        return _outcome(FAIL, expected, "tokens, token_logprobs and top_logprobs are not "
                        "lists of one length", request=request, answer=answer)
    if any(not isinstance(t, dict) or len(t) != 2 for t in tops):
        return _outcome(FAIL, expected, "top_logprobs does not give 2 alternatives per "
                        "token", request=request, answer=answer)
    return _outcome(PASS, expected, f"{len(tokens)} tokens", request=request,
                    answer=answer)
