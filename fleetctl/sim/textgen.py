"""Simulator tokens and deterministic text.

A *simulator token* is what `TOKEN_RE` finds: a run of word characters, or one
punctuation character (whitespace separates, and is not a token). A prompt costs its
regex tokens plus one BOS token; a chat prompt is first rendered with a tiny template
(`render_chat`), whose role markers count as tokens like any other text.

Generated tokens come from a fixed 256-entry vocabulary: words carry their leading space
(" river"), punctuation does not (","), so `count_tokens(generated_text) + 1` equals
`completion_tokens` (the +1 is the BOS counted for prompts only).

Determinism. Everything is derived from a 64-bit BLAKE2b hash of (model, prompt, seed):
the greedy token at position i is the i-th 64-bit draw of a Mersenne Twister seeded with
that hash, so the same model and prompt give the same text on every pool and every
process. Each profile diverges from that shared text for a fraction `divergence_rate` of
(model, prompt, seed) keys — decided by a hash that also includes the profile name — at a
position derived from the hash (within the first `DIVERGENCE_WINDOW` tokens and the natural
length), after which a different stream is used. At that position the logprobs show a
near-tie (-0.69 chosen vs -0.70 for the shared token) for `near_tie_fraction` of
divergences, or a hard flip (the chosen token clearly below the shared one) otherwise.

Replica noise: a pool may flip one greedy answer at one position (`TokenStream.add_flip`,
decided per request by the server's own random draw, not by the key, as GPU batch
nondeterminism does): the runner-up wins a near-tie there and the text continues
deterministically from the flipped token, so two replicas that flip alike agree again.

Natural stop: each key has a target length of 24..384 tokens (skewed short:
24 + 360·u², u uniform from the hash); generation ends there with finish_reason "stop"
unless `max_tokens` comes first ("length") or `ignore_eos` is set.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from dataclasses import dataclass
from typing import Protocol

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
DIVERGENCE_WINDOW = 48
NATURAL_MIN_TOKENS = 24
NATURAL_SPAN_TOKENS = 360
CANDIDATES = 5  # alternatives carried by one 64-bit draw (8 bits each + probability shape)
NEAR_TIE_LOGPROBS = (-0.69, -0.70)

_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but",
    "have", "an", "they", "you", "were", "her", "she", "there", "been", "one", "all", "we",
    "their", "has", "would", "when", "if", "so", "no", "will", "more", "can", "who", "its",
    "into", "some", "time", "them", "other", "than", "then", "now", "only", "could",
    "these", "two", "may", "first", "any", "my", "like", "our", "over", "such", "also",
    "new", "very", "way", "just", "where", "most", "after", "before", "through", "back",
    "much", "good", "well", "down", "should", "each", "long", "must", "great", "still",
    "here", "same", "old", "own", "see", "under", "make", "might", "while", "last", "know",
    "never", "city", "river", "light", "water", "stone", "field", "road", "house", "garden",
    "market", "music", "story", "paper", "signal", "engine", "model", "token", "cache",
    "batch", "queue", "stream", "vector", "layer", "kernel", "memory", "bridge", "harbor",
    "valley", "forest", "window", "letter", "number", "answer", "simple", "quiet", "bright",
    "early", "slow", "fast", "clear", "warm", "cold", "green", "blue", "silver", "golden",
    "north", "south", "east", "west", "morning", "evening", "winter", "summer", "spring",
    "autumn", "ocean", "island", "mountain", "lake", "cloud", "rain", "wind", "fire",
    "earth", "metal", "glass", "wood", "sand", "table", "chair", "door", "wall", "floor",
    "roof", "street", "corner", "station", "train", "ship", "plane", "voice", "word",
    "line", "page", "book", "note", "plan", "step", "part", "point", "place", "world",
    "system", "reason", "result", "season", "circle", "balance", "careful", "gentle",
    "honest", "hidden", "open", "close", "large", "small", "short", "tall", "heavy",
    "young", "ancient", "modern", "rapid", "steady", "sudden", "gradual", "carry", "build",
    "follow", "gather", "listen", "measure", "notice", "return", "travel", "wonder",
    "begin", "finish", "hold", "keep", "move", "turn", "watch", "write", "read", "speak",
    "think", "feel", "grow", "change", "rather", "almost", "always", "often", "seldom",
    "again", "around", "between", "beyond", "across",
)
_PUNCT = [",", ".", ";", ":", "!", "?"]
VOCAB: tuple[str, ...] = (*(" " + w for w in _WORDS[: 256 - len(_PUNCT)]), *_PUNCT)
assert len(VOCAB) == 256, len(VOCAB)
# JSON string literals of every vocabulary entry, so SSE chunks need no json.dumps per token.
VOCAB_JSON: tuple[str, ...] = tuple(json.dumps(t) for t in VOCAB)


def tokenize(text: str) -> list[str]:
    return TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return len(TOKEN_RE.findall(text))


def render_chat(messages: list[tuple[str, str]]) -> str:
    """The chat template: role markers around each message, then the assistant's turn."""
    parts = [f"<|{role}|>\n{content}\n" for role, content in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


# A second tokenizer and chat template (profile field `tokenizer = "other"`), standing in for
# a pool that serves the same model with another tokenizer or template: words split into
# pieces of at most 4 characters, and `[role]` markers instead of `<|role|>`. The generated
# text is the same; only the prompt's token count differs.
TOKENIZERS: tuple[str, ...] = ("llama3", "other")
OTHER_TOKEN_RE = re.compile(r"\w{1,4}|[^\w\s]")


def render_chat_other(messages: list[tuple[str, str]]) -> str:
    parts = [f"[{role}]\n{content}\n" for role, content in messages]
    parts.append("[assistant]\n")
    return "".join(parts)


def tokenize_other(text: str) -> list[str]:
    return OTHER_TOKEN_RE.findall(text)


def stable_hash(*parts: object) -> int:
    """64-bit hash that is the same in every process (unlike `hash()`)."""
    raw = "\x1f".join(repr(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big")


def stable_unit(*parts: object) -> float:
    """A number in [0, 1) derived from `parts`."""
    return stable_hash(*parts) / 2.0**64


@dataclass(slots=True)
class Token:
    vocab_index: int
    text: str
    logprob: float | None
    # (text, logprob) best first, only when the request asked for logprobs.
    top: list[tuple[str, float]] | None


@dataclass(frozen=True, slots=True)
class Divergence:
    position: int
    near_tie: bool


@dataclass(frozen=True, slots=True)
class TextKey:
    model: str
    prompt_digest: str
    seed: int | None

    @classmethod
    def of(cls, model: str, prompt: str, seed: int | None) -> TextKey:
        digest = hashlib.blake2b(prompt.encode(), digest_size=16).hexdigest()
        return cls(model=model, prompt_digest=digest, seed=seed)


def natural_length(key: TextKey) -> int:
    u = stable_unit("len", key)
    return NATURAL_MIN_TOKENS + int(NATURAL_SPAN_TOKENS * u * u)


def divergence_for(
    key: TextKey, profile_name: str, divergence_rate: float, near_tie_fraction: float
) -> Divergence | None:
    if stable_unit("diverge", profile_name, key) >= divergence_rate:
        return None
    window = min(natural_length(key), DIVERGENCE_WINDOW)
    position = stable_hash("div-pos", profile_name, key) % window
    near_tie = stable_unit("div-kind", profile_name, key) < near_tie_fraction
    return Divergence(position=position, near_tie=near_tie)


def _candidates(bits: int) -> list[int]:
    """Five distinct vocabulary indices from the low 40 bits of a draw."""
    seen: list[int] = []
    for k in range(CANDIDATES):
        idx = (bits >> (8 * k)) & 0xFF
        while idx in seen:
            idx = (idx + 1) & 0xFF
        seen.append(idx)
    return seen


def _probabilities(bits: int) -> list[float]:
    """A proper (sub-)distribution over the five candidates, top one in [0.55, 0.98]."""
    p_top = 0.55 + 0.43 * (((bits >> 40) & 0xFF) / 255.0)
    rest = 1.0 - p_top
    p_second = rest * (0.35 + 0.5 * (((bits >> 48) & 0xFF) / 255.0))
    rest -= p_second
    tail = [rest * 0.5, rest * 0.25, rest * 0.125]
    return [p_top, p_second, *tail]


class TokenSource(Protocol):
    """What the engine draws tokens from: free text (`TokenStream`) or a fixed JSON text
    (`structured.ScriptedStream`)."""

    natural_length: int
    divergence: Divergence | None
    flipped_at: int | None

    def next(self) -> Token: ...


class TokenStream:
    """Yields one generated token per call, deterministic for (model, prompt, seed, profile)."""

    def __init__(
        self,
        *,
        key: TextKey,
        profile_name: str,
        divergence_rate: float,
        near_tie_fraction: float,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_logprobs: int | None = None,
    ) -> None:
        self.key = key
        self.position = 0
        self.divergence = divergence_for(key, profile_name, divergence_rate, near_tie_fraction)
        base_length = natural_length(key)
        self.natural_length = self._diverged_length(base_length, profile_name)
        self._rng = random.Random(stable_hash("text", key))
        self._profile_name = profile_name
        self._temperature = temperature
        self._top_p = top_p
        self._top_logprobs = top_logprobs
        self._sampler = self._make_sampler(key, temperature)
        # Replica noise (`add_flip`): the position this answer flips at, if any.
        self.flipped_at: int | None = None

    def add_flip(self, draw: float, limit: int) -> None:
        """Flip this (greedy) answer at one position: `draw` in [0, 1) picks it uniformly among
        the first `limit` tokens (those the answer will have), never the profile's divergence
        position. The runner-up wins a near-tie there and the text continues from it."""
        div = self.divergence
        skip = div is not None and div.position < limit
        span = limit - int(skip)
        if span <= 0:
            return
        position = min(int(draw * span), span - 1)
        if div is not None and skip and position >= div.position:
            position += 1
        self.flipped_at = position

    def _flip(self, token: Token) -> None:
        """After the flip the text continues from the flipped token: a stream seeded by the
        position and the token (two replicas flipping alike agree again), with its own length.
        A later divergence of the profile no longer applies: the prefix is another one."""
        position = self.position - 1
        self._rng = random.Random(stable_hash("noise-text", self.key, position, token.vocab_index))
        factor = 0.75 + 0.5 * stable_unit("noise-len", self.key, position, token.vocab_index)
        after = max(0, self.natural_length - position - 1)
        self.natural_length = position + 1 + int(after * factor)
        if self.divergence is not None and self.divergence.position > position:
            self.divergence = None

    def _diverged_length(self, base_length: int, profile_name: str) -> int:
        # A different continuation ends at a different place, but never before it diverges.
        if self.divergence is None:
            return base_length
        factor = 0.75 + 0.5 * stable_unit("div-len", profile_name, self.key)
        after = max(0, base_length - self.divergence.position - 1)
        return self.divergence.position + 1 + int(after * factor)

    @staticmethod
    def _make_sampler(key: TextKey, temperature: float) -> random.Random | None:
        if temperature <= 0:
            return None
        if key.seed is None:
            return random.Random()  # unseeded: different on every request, as asked
        return random.Random(stable_hash("sample", key))

    def next(self) -> Token:
        position = self.position
        self.position += 1
        div = self.divergence
        if div is not None and position == div.position + 1:
            # From here on a different continuation: switch to this profile's own stream.
            self._rng = random.Random(stable_hash("div-text", self._profile_name, self.key))
        bits = self._rng.getrandbits(64)
        if position == self.flipped_at:
            token = self._full_token(bits, Divergence(position=position, near_tie=True))
            self._flip(token)
            return token
        at_divergence = div is not None and position == div.position
        if not at_divergence and self._sampler is None and self._top_logprobs is None:
            index = bits & 0xFF  # fast path: greedy, no logprobs
            return Token(vocab_index=index, text=VOCAB[index], logprob=None, top=None)
        return self._full_token(bits, div if at_divergence else None)

    def _full_token(self, bits: int, div: Divergence | None) -> Token:
        indices = _candidates(bits)
        probs = _probabilities(bits)
        chosen = 0
        if div is not None:
            chosen = self._diverge(indices, probs, div.near_tie)
        if self._sampler is not None:
            chosen = self._sample(probs)
        lps = [math.log(p) for p in probs]
        top = None
        if self._top_logprobs is not None:
            top = self._ranked(indices, lps, bits)[: self._top_logprobs]
        index = indices[chosen]
        return Token(vocab_index=index, text=VOCAB[index], logprob=lps[chosen], top=top)

    @staticmethod
    def _diverge(indices: list[int], probs: list[float], near_tie: bool) -> int:
        """Rewrite the distribution at the divergence position; return the chosen slot."""
        if near_tie:
            # The runner-up edges ahead: top two within 0.01 nats, and it is chosen.
            indices[0], indices[1] = indices[1], indices[0]
            probs[0], probs[1] = math.exp(NEAR_TIE_LOGPROBS[0]), math.exp(NEAR_TIE_LOGPROBS[1])
            chosen = 0
        else:
            # Hard flip: the shared token stays clearly on top, yet a much lower one is chosen.
            probs[0], probs[1] = max(probs[0], 0.85), min(probs[1], 0.08)
            chosen = 1
        rest = max(0.0, 1.0 - probs[0] - probs[1])
        probs[2:] = [rest * 0.5, rest * 0.25, rest * 0.125]
        return chosen

    def _sample(self, probs: list[float]) -> int:
        assert self._sampler is not None
        weights = [p ** (1.0 / self._temperature) for p in probs]
        total = sum(weights)
        cut, keep = 0.0, len(weights)
        for i, w in enumerate(weights):
            cut += w / total
            if cut >= self._top_p:
                keep = i + 1
                break
        kept = weights[:keep]
        return self._sampler.choices(range(keep), weights=kept)[0]

    @staticmethod
    def _ranked(indices: list[int], lps: list[float], bits: int) -> list[tuple[str, float]]:
        """Candidates best first, padded with deterministic low-probability alternatives
        that share out the mass the candidates leave (halving, so the total stays <= 1)."""
        ranked = sorted(zip(indices, lps, strict=True), key=lambda pair: -pair[1])
        out = [(VOCAB[i], lp) for i, lp in ranked]
        extra = random.Random(bits)
        used = set(indices)
        leftover = max(1e-12, 1.0 - sum(math.exp(lp) for lp in lps))
        share = leftover / 2
        while len(out) < 20:
            idx = extra.randrange(256)
            if idx in used:
                continue
            used.add(idx)
            out.append((VOCAB[idx], math.log(share * (0.6 + 0.4 * extra.random()))))
            share /= 2
        return out
