"""Deterministic text, the simulator token, and divergence statistics (no server)."""

from __future__ import annotations

import math

from fleetctl.sim.textgen import (
    DIVERGENCE_WINDOW,
    TextKey,
    Token,
    TokenStream,
    count_tokens,
    divergence_for,
    natural_length,
    tokenize,
)


def stream(prompt: str, *, model: str = "m", seed: int | None = None, profile: str = "p",
           rate: float = 0.0, near_tie: float = 0.5, temperature: float = 0.0,
           top_logprobs: int | None = None) -> TokenStream:
    return TokenStream(key=TextKey.of(model, prompt, seed), profile_name=profile,
                       divergence_rate=rate, near_tie_fraction=near_tie,
                       temperature=temperature, top_logprobs=top_logprobs)


def text(s: TokenStream, n: int) -> str:
    return "".join(s.next().text for _ in range(n))


def test_the_simulator_token_is_a_word_run_or_one_punctuation_mark() -> None:
    assert tokenize("Hello, world! It's 42.") == ["Hello", ",", "world", "!", "It", "'", "s",
                                                   "42", "."]


def test_same_key_gives_the_same_text_and_other_keys_do_not() -> None:
    assert text(stream("a prompt"), 50) == text(stream("a prompt"), 50)
    assert text(stream("a prompt"), 50) != text(stream("a prompt", model="other"), 50)
    assert text(stream("a prompt"), 50) != text(stream("a prompt", seed=1), 50)
    assert text(stream("a prompt"), 50) != text(stream("another prompt"), 50)


def test_generated_text_retokenises_to_its_token_count() -> None:
    for i in range(50):
        assert count_tokens(text(stream(f"prompt {i}"), 40)) == 40


def test_natural_lengths_stay_in_range_and_vary() -> None:
    lengths = [natural_length(TextKey.of("m", f"prompt {i}", None)) for i in range(2000)]
    assert min(lengths) >= 24
    assert max(lengths) <= 384
    assert 60 < sum(lengths) / len(lengths) < 250
    assert len(set(lengths)) > 100


def binomial_ok(hits: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    return abs(hits - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_divergence_rate_and_near_tie_fraction_match_the_profile() -> None:
    n, rate, near_tie = 20000, 0.1, 0.7
    found = [divergence_for(TextKey.of("m", f"prompt {i}", None), "gaudi3", rate, near_tie)
             for i in range(n)]
    diverged = [d for d in found if d is not None]
    assert binomial_ok(len(diverged), n, rate)
    assert binomial_ok(sum(d.near_tie for d in diverged), len(diverged), near_tie)
    assert all(0 <= d.position < DIVERGENCE_WINDOW for d in diverged)


def test_a_divergent_stream_matches_until_its_position_then_differs() -> None:
    for i in range(30):
        prompt = f"prompt {i}"
        diverging = stream(prompt, profile="x", rate=1.0)
        assert diverging.divergence is not None
        at = diverging.divergence.position
        base_tokens = [t.text for t in take(stream(prompt), at + 1)]
        div_tokens = [t.text for t in take(diverging, at + 1)]
        assert div_tokens[:at] == base_tokens[:at]
        assert div_tokens[at] != base_tokens[at]


def take(s: TokenStream, n: int) -> list[Token]:
    return [s.next() for _ in range(n)]


def test_logprobs_form_a_distribution_best_first() -> None:
    s = stream("logprobs", top_logprobs=20)
    for _ in range(100):
        token = s.next()
        assert token.top is not None and len(token.top) == 20
        lps = [lp for _, lp in token.top]
        assert lps == sorted(lps, reverse=True)
        assert sum(math.exp(lp) for lp in lps) <= 1.0 + 1e-9
        assert token.top[0] == (token.text, token.logprob)
        assert len({t for t, _ in token.top}) == 20


def test_seeded_sampling_repeats_and_differs_from_greedy() -> None:
    a = text(stream("sample", seed=3, temperature=1.0), 60)
    b = text(stream("sample", seed=3, temperature=1.0), 60)
    greedy = text(stream("sample", seed=3), 60)
    unseeded = [text(stream("sample", temperature=1.0), 60) for _ in range(2)]
    assert a == b
    assert a != greedy
    assert unseeded[0] != unseeded[1]
