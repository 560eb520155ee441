"""Serving behaviour: queueing under saturation, the prefix cache, identical text across
pools, and divergence at the configured rate with near-tie or hard-flip logprobs."""

from __future__ import annotations

import asyncio
import math
import time
import uuid

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.noise import best_of

from .simproc import MODEL, SimProcess, async_client, client

pytestmark = pytest.mark.slow


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    text = httpx.get(f"{url}/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


async def stream_ttft(api: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> float:
    started = time.monotonic()
    stream = await api.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True,
        extra_body={"ignore_eos": True},
    )
    ttft = math.inf
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text and ttft == math.inf:
            ttft = time.monotonic() - started
    return ttft


def test_requests_beyond_capacity_wait_in_the_queue_and_their_ttft_rises(
    fleet: SimProcess,
) -> None:
    url = fleet.url("narrow")  # 2 sequences at a time, 20 ms steps

    async def scenario() -> tuple[list[float], float]:
        async with async_client(url) as api:
            requests = [asyncio.create_task(stream_ttft(api, f"queue {i}", 10))
                        for i in range(6)]
            seen_waiting = 0.0
            while not all(r.done() for r in requests):
                await asyncio.sleep(0.03)
                seen_waiting = max(seen_waiting, await asyncio.to_thread(
                    metric, url, "vllm:num_requests_waiting"))
            return sorted(await asyncio.gather(*requests)), seen_waiting

    httpx.post(f"{url}/admin/ground-truth",
               json={"enabled": True, "clear": True}).raise_for_status()
    try:
        ttfts, seen_waiting = asyncio.run(scenario())
        steps = httpx.get(f"{url}/admin/ground-truth", params={"kind": "steps"}).json()["steps"]
    finally:
        httpx.post(f"{url}/admin/ground-truth", json={"enabled": False, "clear": True})
    # Two run at once and never more: the scheduler's own step records, no clock involved.
    assert max(step["batch"] for step in steps) == 2
    # Each takes 10 steps of 20 ms, so the fifth request can only start once three have
    # finished (30 tokens, at most 2 a step: 15 steps) and its first token comes a step
    # later: 0.32 s at the least. A floor; a loaded machine only adds to it.
    assert ttfts[-1] > 0.3
    assert seen_waiting >= 1
    queue_time_count = metric(url, "vllm:request_queue_time_seconds_count")
    assert queue_time_count >= 6


def test_a_full_waiting_queue_answers_429(fleet: SimProcess) -> None:
    url = fleet.url("small")  # 1 running, 1 waiting at most

    async def one(api: openai.AsyncOpenAI, i: int) -> int:
        try:
            await api.completions.create(  # 50 steps of 20 ms: 1 s each
                model=MODEL, prompt=f"burst {i}", max_tokens=50,
                extra_body={"ignore_eos": True},
            )
            return 200
        except openai.RateLimitError as exc:
            assert exc.code == "rate_limit_exceeded"
            assert isinstance(exc.body, dict) and exc.body.get("type") == "rate_limit_error"
            return 429

    async def burst() -> list[int]:
        async with async_client(url) as api:
            return list(await asyncio.gather(*(one(api, i) for i in range(6))))

    statuses = asyncio.run(burst())
    # One runs and one waits; a third is only let in if it arrives after the first has
    # finished (1 s), so the rest are refused even if the burst arrives spread out.
    assert statuses.count(429) >= 3
    assert statuses.count(200) >= 1
    assert set(statuses) == {200, 429}


def test_a_repeated_long_prefix_is_served_from_the_prefix_cache(fleet: SimProcess) -> None:
    url = fleet.url("cache")  # prefill 4,000 tokens/s

    def measure() -> str | None:
        """One fresh prefix: cold, then warm. The cache counters are checked every time; the
        warm TTFT (a ceiling a loaded machine can break) is what may be measured again."""
        prefix = " ".join(f"{uuid.uuid4().hex[:6]}" for _ in range(800))
        hits_before = metric(url, "vllm:prefix_cache_hits_total")
        queries_before = metric(url, "vllm:prefix_cache_queries_total")

        async def ttft(question: str) -> float:
            async with async_client(url) as api:
                return await stream_ttft(api, f"{prefix} {question}", 2)

        cold = asyncio.run(ttft("first question"))
        warm = asyncio.run(ttft("second question"))
        assert cold > 0.15  # ~800 tokens of prefill at 4,000 tokens/s: a floor
        reply = client(url).completions.create(model=MODEL, prompt=f"{prefix} third",
                                                max_tokens=1)
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        cached = reply.usage.prompt_tokens_details.cached_tokens or 0
        assert cached >= 784  # whole 16-token blocks of the 800-token shared prefix
        assert metric(url, "vllm:prefix_cache_hits_total") - hits_before >= 2 * 784
        assert metric(url, "vllm:prefix_cache_queries_total") - queries_before >= 3 * 800
        return None if warm < cold / 4 else f"warm TTFT {warm:.3f} s, cold {cold:.3f} s"

    best_of(3, measure)


async def texts(url: str, prompts: list[str], max_tokens: int = 48,
                concurrency: int = 48) -> list[str]:
    gate = asyncio.Semaphore(concurrency)
    async with async_client(url) as api:

        async def one(prompt: str) -> str:
            async with gate:
                reply = await api.completions.create(model=MODEL, prompt=prompt,
                                                     max_tokens=max_tokens)
                return reply.choices[0].text

        return list(await asyncio.gather(*(one(p) for p in prompts)))


def test_one_model_gives_the_same_text_on_every_pool_without_divergence(
    fleet: SimProcess,
) -> None:
    prompts = [f"same text {i}" for i in range(30)]
    on_h200 = asyncio.run(texts(fleet.url("ref"), prompts))
    on_mi300x = asyncio.run(texts(fleet.url("twin"), prompts))
    assert on_h200 == on_mi300x
    chat_a = client(fleet.url("ref")).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=30)
    chat_b = client(fleet.url("twin")).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=30)
    assert chat_a.choices[0].message.content == chat_b.choices[0].message.content


def test_measured_divergence_matches_the_configured_rate(fleet: SimProcess) -> None:
    n, rate = 400, 0.25  # the "diverging" profile
    prompts = [f"divergence probe {i}" for i in range(n)]
    reference = asyncio.run(texts(fleet.url("ref"), prompts))
    candidate = asyncio.run(texts(fleet.url("div"), prompts))
    diverged = sum(a != b for a, b in zip(reference, candidate, strict=True))
    sigma = math.sqrt(n * rate * (1 - rate))
    assert abs(diverged - n * rate) <= 4 * sigma, f"{diverged} of {n} diverged"


def token_logprobs(url: str, prompt: str) -> list[openai.types.chat.ChatCompletionTokenLogprob]:
    reply = client(url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=48,
        logprobs=True, top_logprobs=2,
    )
    assert reply.choices[0].logprobs is not None
    return reply.choices[0].logprobs.content or []


def first_difference(a: list[str], b: list[str]) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)


@pytest.mark.parametrize("prompt", [f"tie or flip {i}" for i in range(6)])
def test_a_divergence_shows_a_near_tie_or_a_hard_flip_in_logprobs(
    fleet: SimProcess, prompt: str
) -> None:
    reference = [e.token for e in token_logprobs(fleet.url("ref"), prompt)]

    tie = token_logprobs(fleet.url("tie"), prompt)  # every divergence a near-tie
    at = first_difference(reference, [e.token for e in tie])
    chosen, (first, second) = tie[at], tie[at].top_logprobs
    assert chosen.token == first.token
    assert first.logprob == pytest.approx(-0.69)
    assert second.logprob == pytest.approx(-0.70)
    assert second.token == reference[at]  # the shared token, a hair behind

    flip = token_logprobs(fleet.url("flip"), prompt)  # every divergence a hard flip
    at = first_difference(reference, [e.token for e in flip])
    chosen, top = flip[at], flip[at].top_logprobs[0]
    assert top.token == reference[at]  # the shared token is still clearly the best...
    assert chosen.token != top.token  # ...yet another was chosen
    assert chosen.logprob < top.logprob - 1.0
