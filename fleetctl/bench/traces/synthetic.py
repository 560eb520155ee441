"""Synthetic traces: token-length distributions, arrival processes and the seeded
generator, and the length spec people type for them."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fleetctl.bench.traces.request import (
    LATENCY_CLASSES,
    MAX_TOKENS,
    TraceRequest,
    _positive_int,
)


@dataclass(frozen=True, slots=True)
class Dist:
    """A distribution of token counts (integers ≥ 1). Build with the class methods."""

    kind: Literal["constant", "uniform", "lognormal", "empirical"]
    params: tuple[float, ...]
    values: tuple[int, ...] = ()

    @classmethod
    def constant(cls, value: int) -> Dist:
        _need_tokens("constant value", value)
        return cls("constant", (value,))

    @classmethod
    def uniform(cls, lo: int, hi: int) -> Dist:
        _need_tokens("uniform lo", lo)
        _need_tokens("uniform hi", hi)
        if lo > hi:
            raise ValueError(f"uniform needs lo ≤ hi, got lo={lo}, hi={hi}")
        return cls("uniform", (lo, hi))

    @classmethod
    def lognormal(cls, median: float, sigma: float, *, lo: int = 1,
                  hi: int = MAX_TOKENS) -> Dist:
        """exp(N(ln median, sigma²)), rounded and clipped to [lo, hi]."""
        if not (isinstance(median, int | float) and 1 <= median <= MAX_TOKENS):
            raise ValueError(f"lognormal median must be a number in [1, {MAX_TOKENS:,}], "
                             f"got {median!r}")
        if not (isinstance(sigma, int | float) and 0 <= sigma <= 10):
            raise ValueError(f"lognormal sigma must be a number in [0, 10], got {sigma!r}")
        _need_tokens("lognormal lo", lo)
        _need_tokens("lognormal hi", hi)
        if lo > hi:
            raise ValueError(f"lognormal needs lo ≤ hi, got lo={lo}, hi={hi}")
        return cls("lognormal", (math.log(median), sigma, lo, hi))

    @classmethod
    def empirical(cls, values: Sequence[int]) -> Dist:
        """Draw uniformly from observed values (repeat a value to weight it)."""
        if not values:
            raise ValueError("empirical needs at least one value")
        for v in values:
            _need_tokens("empirical value", v)
        return cls("empirical", (), tuple(values))

    def sample(self, rng: random.Random) -> int:
        if self.kind == "constant":
            return int(self.params[0])
        if self.kind == "uniform":
            return rng.randint(int(self.params[0]), int(self.params[1]))
        if self.kind == "lognormal":
            mu, sigma, lo, hi = self.params
            return int(min(max(round(math.exp(rng.gauss(mu, sigma))), lo), hi))
        return self.values[rng.randrange(len(self.values))]


def _need_tokens(name: str, value: object) -> None:
    problem = _positive_int(name, value)
    if problem:
        raise ValueError(problem)


def _need_rate(name: str, value: object) -> float:
    if not (isinstance(value, int | float) and not isinstance(value, bool)
            and 0 < value < math.inf):
        raise ValueError(f"{name} must be a positive number of requests per second, "
                         f"got {value!r}")
    return float(value)


def _need_seconds(name: str, value: object) -> float:
    if not (isinstance(value, int | float) and not isinstance(value, bool)
            and 0 < value < math.inf):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Arrival:
    """An arrival process. Build with the class methods:

    - constant(rate): one request every 1/rate seconds.
    - poisson(rate): exponential gaps with mean 1/rate.
    - bursty(rate, burstiness): Gamma gaps with mean 1/rate and shape `burstiness`, as
      vLLM's `bench serve --burstiness` (1 = Poisson, < 1 burstier, > 1 more even).
    - on_off(base_rate, burst_rate, on_s, off_s): a Poisson process whose rate is
      burst_rate for on_s seconds, then base_rate for off_s seconds, repeating.
    """

    kind: Literal["constant", "poisson", "bursty", "on_off"]
    params: tuple[float, ...]

    @classmethod
    def constant(cls, rate: float) -> Arrival:
        return cls("constant", (_need_rate("constant rate", rate),))

    @classmethod
    def poisson(cls, rate: float) -> Arrival:
        return cls("poisson", (_need_rate("poisson rate", rate),))

    @classmethod
    def bursty(cls, rate: float, burstiness: float) -> Arrival:
        rate = _need_rate("bursty rate", rate)
        if not (isinstance(burstiness, int | float) and 0 < burstiness <= 1000):
            raise ValueError(f"burstiness must be a number in (0, 1000], got {burstiness!r}")
        return cls("bursty", (rate, float(burstiness)))

    @classmethod
    def on_off(cls, base_rate: float, burst_rate: float, on_s: float, off_s: float) -> Arrival:
        return cls("on_off", (_need_rate("base_rate", base_rate),
                              _need_rate("burst_rate", burst_rate),
                              _need_seconds("on_s", on_s), _need_seconds("off_s", off_s)))

    def times(self, rng: random.Random) -> Iterator[float]:
        """Arrival offsets in seconds, starting with 0."""
        t = 0.0
        if self.kind == "on_off":
            yield from self._on_off_times(rng)
            return
        while True:
            yield t
            t += self._gap(rng)

    def _gap(self, rng: random.Random) -> float:
        if self.kind == "constant":
            return 1.0 / self.params[0]
        if self.kind == "poisson":
            return rng.expovariate(self.params[0])
        rate, shape = self.params
        return rng.gammavariate(shape, 1.0 / (rate * shape))

    def _on_off_times(self, rng: random.Random) -> Iterator[float]:
        # The exponential is memoryless, so a gap that crosses a phase boundary can be
        # redrawn from the boundary at the new rate: this samples the modulated process exactly.
        base, burst, on_s, off_s = self.params
        t, phase_end, bursting = 0.0, on_s, True
        yield t
        while True:
            candidate = t + rng.expovariate(burst if bursting else base)
            while candidate > phase_end:
                t, bursting = phase_end, not bursting
                phase_end += on_s if bursting else off_s
                candidate = t + rng.expovariate(burst if bursting else base)
            t = candidate
            yield t


def generate(*, n: int, seed: int, prompt_tokens: Dist, completion_tokens: Dist,
             arrival: Arrival, shared_prefix_groups: int = 0, shared_prefix_tokens: int = 0,
             latency_class: str | None = None) -> Iterator[TraceRequest]:
    """A synthetic trace of n requests, identical for the same arguments.

    With shared prefix groups, each request joins one group at random and its prompt is the
    group's shared_prefix_tokens followed by a unique part drawn from `prompt_tokens`.
    """
    _check_generate(n, seed, prompt_tokens, completion_tokens, arrival,
                    shared_prefix_groups, shared_prefix_tokens, latency_class)
    return _generated(n, random.Random(seed), prompt_tokens, completion_tokens, arrival,
                      shared_prefix_groups, shared_prefix_tokens, latency_class)


def _check_generate(n: int, seed: int, prompt_tokens: Dist, completion_tokens: Dist,
                    arrival: Arrival, groups: int, prefix: int,
                    latency_class: str | None) -> None:
    if type(n) is not int or not 1 <= n <= 100_000_000:
        raise ValueError(f"n must be an integer in [1, 100,000,000], got {n!r}")
    if type(seed) is not int:
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not isinstance(prompt_tokens, Dist) or not isinstance(completion_tokens, Dist):
        raise ValueError("prompt_tokens and completion_tokens must be Dist "
                         "(Dist.constant, Dist.uniform, Dist.lognormal, Dist.empirical)")
    if not isinstance(arrival, Arrival):
        raise ValueError("arrival must be an Arrival (Arrival.constant, Arrival.poisson, "
                         "Arrival.bursty, Arrival.on_off)")
    if type(groups) is not int or groups < 0:
        raise ValueError(f"shared_prefix_groups must be an integer ≥ 0, got {groups!r}")
    if type(prefix) is not int or not 0 <= prefix <= MAX_TOKENS:
        raise ValueError(f"shared_prefix_tokens must be an integer in [0, {MAX_TOKENS:,}], "
                         f"got {prefix!r}")
    if bool(groups) != bool(prefix):
        raise ValueError("shared_prefix_groups and shared_prefix_tokens go together: set both "
                         f"or neither (got {groups} groups of {prefix} tokens)")
    if latency_class is not None and latency_class not in LATENCY_CLASSES:
        raise ValueError(f"latency_class must be one of {', '.join(LATENCY_CLASSES)}, "
                         f"got {latency_class!r}")


def _generated(n: int, rng: random.Random, prompt_tokens: Dist, completion_tokens: Dist,
               arrival: Arrival, groups: int, prefix: int,
               latency_class: str | None) -> Iterator[TraceRequest]:
    times = arrival.times(rng)
    for _ in range(n):
        at = round(next(times), 6)
        group = f"group-{rng.randrange(groups)}" if groups else None
        unique = prompt_tokens.sample(rng)
        yield TraceRequest(prompt_tokens=min(prefix + unique, MAX_TOKENS),
                           completion_tokens=completion_tokens.sample(rng), arrival_s=at,
                           prefix_group=group, prefix_tokens=prefix,
                           latency_class=latency_class)


def length_spec(text: str) -> int | dict[str, Any]:
    """A token-length distribution as people type it: '512' → 512 (constant); '64-512' →
    uniform; '{…}' → that JSON object (checked when the generator builds it). ValueError
    otherwise. Shared by the dashboard form and the CLI."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    match = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    if match:
        return {"kind": "uniform", "lo": int(match[1]), "hi": int(match[2])}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"{text!r}: give a number, a range like 64-512, or JSON such as "
                         '\'{"kind": "lognormal", "median": 800, "sigma": 0.9}\'')
    return value
