"""Every bad request gets the right status and an OpenAI error object — never a traceback
or a hang."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from .simproc import MODEL, SimProcess, client

pytestmark = pytest.mark.slow

OK_MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": OK_MESSAGES, **fields}


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    return error


BAD_REQUESTS = [
    # (id, path, body, expected param)
    ("malformed-json", "chat/completions", b'{"model": ', None),
    ("empty-body", "chat/completions", b"", None),
    ("not-an-object", "chat/completions", [1, 2], None),
    ("missing-messages", "chat/completions", {"model": MODEL}, "messages"),
    ("empty-messages", "chat/completions", chat(messages=[]), "messages"),
    ("messages-not-a-list", "chat/completions", chat(messages="hi"), "messages"),
    ("message-not-an-object", "chat/completions", chat(messages=["hi"]), "messages[0]"),
    ("unknown-role", "chat/completions", chat(messages=[{"role": "wizard", "content": "x"}]),
     "messages[0].role"),
    ("image-content", "chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages[0].content"),
    ("missing-model", "chat/completions", {"messages": OK_MESSAGES}, "model"),
    ("model-not-a-string", "chat/completions", chat(model=5), "model"),
    ("max-tokens-zero", "chat/completions", chat(max_tokens=0), "max_tokens"),
    ("max-tokens-string", "chat/completions", chat(max_tokens="ten"), "max_tokens"),
    ("max-tokens-bool", "chat/completions", chat(max_tokens=True), "max_tokens"),
    ("max-tokens-float", "chat/completions", chat(max_tokens=2.5), "max_tokens"),
    ("max-tokens-over-context", "chat/completions", chat(max_tokens=5000), "max_tokens"),
    ("max-completion-tokens-negative", "chat/completions", chat(max_completion_tokens=-1),
     "max_completion_tokens"),
    ("n-two", "chat/completions", chat(n=2), "n"),
    ("n-zero", "chat/completions", chat(n=0), "n"),
    ("temperature-too-high", "chat/completions", chat(temperature=3), "temperature"),
    ("temperature-string", "chat/completions", chat(temperature="hot"), "temperature"),
    ("top-p-too-high", "chat/completions", chat(top_p=1.5), "top_p"),
    ("seed-float", "chat/completions", chat(seed=1.5), "seed"),
    ("too-many-stops", "chat/completions", chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("stop-not-a-string", "chat/completions", chat(stop=5), "stop"),
    ("empty-stop", "chat/completions", chat(stop=[""]), "stop"),
    ("stream-not-bool", "chat/completions", chat(stream="yes"), "stream"),
    ("stream-options-without-stream", "chat/completions",
     chat(stream_options={"include_usage": True}), "stream_options"),
    ("top-logprobs-without-logprobs", "chat/completions", chat(top_logprobs=2),
     "top_logprobs"),
    ("top-logprobs-too-many", "chat/completions", chat(logprobs=True, top_logprobs=21),
     "top_logprobs"),
    ("missing-prompt", "completions", {"model": MODEL}, "prompt"),
    ("several-prompts", "completions", {"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
    ("prompt-number", "completions", {"model": MODEL, "prompt": 5}, "prompt"),
    ("completion-logprobs-too-many", "completions",
     {"model": MODEL, "prompt": "x", "logprobs": 6}, "logprobs"),
]


@pytest.mark.parametrize(("path", "body", "param"), [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
def test_a_bad_request_is_a_400_error_object(
    fleet: SimProcess, path: str, body: Any, param: str | None
) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{fleet.url('ref')}/v1/{path}", content=raw,
                          headers={"content-type": "application/json"}, timeout=10)
    error = assert_openai_error(response, 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_the_openai_client_sees_bad_requests_as_bad_request_errors(fleet: SimProcess) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(fleet.url("ref")).chat.completions.create(model=MODEL, messages=OK_MESSAGES, n=2)
    assert caught.value.status_code == 400
    assert caught.value.param == "n"


def test_an_unknown_model_is_a_404(fleet: SimProcess) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(fleet.url("ref")).chat.completions.create(model="gpt-9", messages=OK_MESSAGES)
    assert caught.value.code == "model_not_found"
    error = assert_openai_error(httpx.get(f"{fleet.url('ref')}/v1/models/gpt-9"), 404)
    assert error["code"] == "model_not_found"


def test_a_prompt_longer_than_the_context_is_context_length_exceeded(fleet: SimProcess) -> None:
    long_prompt = "word " * 5000  # the test profile's context is 4096 tokens
    with pytest.raises(openai.BadRequestError) as caught:
        client(fleet.url("ref")).completions.create(model=MODEL, prompt=long_prompt)
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 4096 tokens" in caught.value.message


def test_prompt_plus_max_tokens_over_the_context_is_context_length_exceeded(
    fleet: SimProcess,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(fleet.url("ref")).chat.completions.create(
            model=MODEL, messages=OK_MESSAGES, max_tokens=4090
        )
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"


def test_unknown_paths_and_methods_answer_with_error_objects(fleet: SimProcess) -> None:
    url = fleet.url("ref")
    assert assert_openai_error(httpx.get(f"{url}/v1/nothing"), 404)["code"] == "unknown_url"
    error = assert_openai_error(httpx.get(f"{url}/v1/chat/completions"), 405)
    assert error["code"] == "method_not_allowed"
