"""The OpenAI-compatible surface, driven by the official `openai` client against a real
simulator process."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam

from fleetctl.sim.textgen import TOKEN_RE, render_chat

from .simproc import MODEL, SimProcess, client

pytestmark = pytest.mark.slow

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name three rivers, please!"},
]


def chat_text(url: str, messages: list[ChatCompletionMessageParam], **kwargs: Any) -> str:
    reply = client(url).chat.completions.create(model=MODEL, messages=messages, **kwargs)
    return reply.choices[0].message.content or ""


def test_models_are_listed(fleet: SimProcess) -> None:
    models = client(fleet.url("ref")).models.list()
    assert [m.id for m in models.data] == ["llama-3.1-8b-instruct", "qwen2.5-7b-instruct"]
    assert client(fleet.url("ref")).models.retrieve(MODEL).id == MODEL


def test_chat_usage_counts_tokens_by_the_documented_definition(fleet: SimProcess) -> None:
    reply = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12
    )
    rendered = render_chat([(str(m["role"]), str(m.get("content"))) for m in MESSAGES])
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(TOKEN_RE.findall(rendered)) + 1  # + BOS
    assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    assert reply.choices[0].finish_reason == "length"
    assert len(TOKEN_RE.findall(reply.choices[0].message.content or "")) == 12


def test_completions_answer_with_text_and_usage(fleet: SimProcess) -> None:
    reply = client(fleet.url("ref")).completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=5
    )
    assert reply.object == "text_completion"
    assert len(TOKEN_RE.findall(reply.choices[0].text)) == 5
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (5, 5)


def test_max_completion_tokens_is_honoured(fleet: SimProcess) -> None:
    reply = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_a_stream_with_usage_matches_the_non_streamed_answer(fleet: SimProcess) -> None:
    url = fleet.url("ref")
    full = chat_text(url, MESSAGES, max_tokens=20)
    chunks = list(client(url).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    ))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full
    token_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(token_chunks) == 20  # one token per chunk
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f] == ["length"]
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens == 20
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.id for c in chunks} == {chunks[0].id}


def test_a_completions_stream_without_usage_has_no_usage_chunk(fleet: SimProcess) -> None:
    url = fleet.url("ref")
    full = client(url).completions.create(model=MODEL, prompt="Once upon", max_tokens=9)
    chunks = list(client(url).completions.create(
        model=MODEL, prompt="Once upon", max_tokens=9, stream=True
    ))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_answers_stop_by_themselves_at_varied_lengths(fleet: SimProcess) -> None:
    c = client(fleet.url("ref"))
    lengths = []
    for i in range(12):
        reply = c.completions.create(model=MODEL, prompt=f"story number {i}", max_tokens=1000)
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage is not None
        lengths.append(reply.usage.completion_tokens)
    assert all(24 <= n <= 384 for n in lengths)
    assert len(set(lengths)) >= 6


def test_a_stop_string_ends_the_answer_just_before_it(fleet: SimProcess) -> None:
    url = fleet.url("ref")
    prompt: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Tell me about stop strings."}
    ]
    full = chat_text(url, prompt, max_tokens=30)
    words = full.split(" ")
    stop = f" {words[9]} {words[10]}"  # spans two tokens
    expected = full[: full.find(stop)]
    reply = client(url).chat.completions.create(
        model=MODEL, messages=prompt, max_tokens=30, stop=[stop, "never-generated"]
    )
    assert reply.choices[0].message.content == expected
    assert reply.choices[0].finish_reason == "stop"
    streamed = list(client(url).chat.completions.create(
        model=MODEL, messages=prompt, max_tokens=30, stop=stop, stream=True
    ))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_chat_logprobs_list_the_chosen_token_and_top_alternatives(fleet: SimProcess) -> None:
    reply = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, logprobs=True, top_logprobs=3
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    entries = logprobs.content
    assert "".join(e.token for e in entries) == reply.choices[0].message.content
    for entry in entries:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3
        assert tops == sorted(tops, reverse=True)
        assert entry.token == entry.top_logprobs[0].token  # greedy, no divergence on "ref"
        assert entry.logprob < 0
        assert sum(math.exp(lp) for lp in tops) <= 1.0
        assert entry.bytes == list(entry.token.encode())


def test_streamed_chat_logprobs_come_one_entry_per_chunk(fleet: SimProcess) -> None:
    chunks = list(client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, logprobs=True, top_logprobs=2,
        stream=True,
    ))
    entries = [c.choices[0].logprobs.content for c in chunks
               if c.choices and c.choices[0].logprobs is not None]
    assert [len(e or []) for e in entries] == [1] * 5


def test_completions_logprobs_use_the_legacy_shape(fleet: SimProcess) -> None:
    reply = client(fleet.url("ref")).completions.create(
        model=MODEL, prompt="legacy logprobs", max_tokens=6, logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert "".join(logprobs.tokens or []) == reply.choices[0].text
    assert [len(t) for t in logprobs.top_logprobs or []] == [2] * 6
    offsets = logprobs.text_offset or []
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_seeded_sampling_repeats_and_unseeded_sampling_does_not(fleet: SimProcess) -> None:
    url = fleet.url("ref")
    prompt: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Sample something."}]

    def sample(**kwargs: object) -> str:
        return chat_text(url, prompt, max_tokens=40, temperature=1.0, **kwargs)

    seeded = sample(seed=7)
    assert sample(seed=7) == seeded
    assert sample(seed=8) != seeded
    assert chat_text(url, prompt, max_tokens=40, temperature=0, seed=7) != seeded
    assert sample() != sample()


def test_the_request_id_header_is_echoed(fleet: SimProcess) -> None:
    response = httpx.post(
        f"{fleet.url('ref')}/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
        headers={"x-request-id": "trace-123"},
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "trace-123"


# --- embeddings ---------------------------------------------------------------------------------

def test_embeddings_are_deterministic_unit_vectors_with_usage(fleet: SimProcess) -> None:
    from fleetctl.sim.textgen import count_tokens

    texts = ["the quick brown fox", "jumps over the lazy dog"]
    first = client(fleet.url("ref")).embeddings.create(model=MODEL, input=texts, dimensions=32)
    again = client(fleet.url("ref")).embeddings.create(model=MODEL, input=texts[1],
                                                        dimensions=32)
    assert [d.index for d in first.data] == [0, 1]
    assert all(len(d.embedding) == 32 for d in first.data)
    assert all(abs(math.sqrt(sum(v * v for v in d.embedding)) - 1) < 1e-5 for d in first.data)
    # The same input, in another request: the same vector; another input: another one.
    assert again.data[0].embedding == first.data[1].embedding
    assert first.data[0].embedding != first.data[1].embedding
    tokens = sum(count_tokens(t) for t in texts)
    assert (first.usage.prompt_tokens, first.usage.total_tokens) == (tokens, tokens)
    # Asked as floats: the same vector the client decoded from base64 (its default).
    floats = httpx.post(fleet.url("ref") + "/v1/embeddings", json={
        "model": MODEL, "input": texts[1], "dimensions": 32, "encoding_format": "float"})
    assert floats.json()["data"][0]["embedding"] == pytest.approx(first.data[1].embedding,
                                                                  abs=1e-6)


def test_embeddings_refuse_bad_input_in_the_openai_error_shape(fleet: SimProcess) -> None:
    import openai

    sim = client(fleet.url("ref"))
    with pytest.raises(openai.BadRequestError, match="input"):
        sim.embeddings.create(model=MODEL, input="")
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        sim.embeddings.create(model=MODEL, input="x", dimensions=0)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        sim.embeddings.create(model="no-such-model", input="x")
    raw = httpx.post(fleet.url("ref") + "/v1/embeddings", json={"model": MODEL})
    assert raw.status_code == 400
    assert raw.json()["error"]["param"] == "input"
