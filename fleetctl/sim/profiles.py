"""Accelerator profiles: the numbers that make one simulated pool behave unlike another.

Every built-in profile is *simulated*: the figures keep realistic relative speeds (H200
fastest, MI300X close behind with a bigger KV cache, A100 slower, TPU v5e and Gaudi 3
slower still) but are scaled so a demo on a laptop is lively. None of them is a
measurement of real hardware.

Decode cost model (per scheduler step, in milliseconds)::

    step_ms = (decode_base_ms + decode_per_seq_ms * batch_size) * slowdown
              + uncached_prefill_tokens / prefill_tokens_per_s * 1000

A custom TOML file may add profiles or override fields of built-in ones::

    [profiles.tiny]
    base = "h200"          # start from a built-in (or earlier) profile
    max_seqs = 2
    models = ["llama-3.1-8b-instruct"]
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

DEFAULT_MODELS: tuple[str, ...] = ("llama-3.1-8b-instruct", "qwen2.5-7b-instruct")
VENDORS: tuple[str, ...] = ("cuda", "rocm", "tpu", "gaudi", "other")
TOKENIZERS: tuple[str, ...] = ("llama3", "other")
# Switches that make a pool ignore part of the OpenAI contract (all on by default).
SWITCHES: tuple[str, ...] = ("tool_calls", "json_mode", "stream_usage", "logprobs", "tokenizer")
# Regress switches: shares (0..1) of answers a candidate gets wrong, so a shadow run can be
# shown to catch a regression. Off (0) in every built-in profile.
REGRESSIONS: tuple[str, ...] = ("json_broken", "truncate_rate")


class ProfileError(ValueError):
    """A profile file or override is invalid; the message names the field."""


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    accelerator: str
    vendor: str
    prefill_tokens_per_s: float
    decode_base_ms: float
    decode_per_seq_ms: float
    max_seqs: int
    kv_cache_tokens: int
    prefix_cache_tokens: int
    network_latency_ms: float
    node_hourly_usd: float
    max_context: int
    max_waiting: int
    divergence_rate: float
    near_tie_fraction: float
    # Upper bound on prompt tokens prefilled in one step (like vLLM's max_num_batched_tokens);
    # the head of the queue is always admitted alone even when its prompt is larger.
    max_prefill_tokens_per_step: int = 16384
    models: tuple[str, ...] = field(default=DEFAULT_MODELS)
    # Contract switches. False: the pool ignores `tools`/`tool_choice` (plain text, as a
    # server started without tool parsing), `response_format`, `stream_options.include_usage`,
    # or logprobs requests. tokenizer "other" counts prompt tokens with another tokenizer and
    # chat template, so `usage.prompt_tokens` differs from a "llama3" pool's.
    tool_calls: bool = True
    json_mode: bool = True
    stream_usage: bool = True
    logprobs: bool = True
    tokenizer: str = "llama3"
    # Replica (batch) nondeterminism: the probability that one greedy answer of this server
    # flips at one near-tie position, drawn per request and not keyed (as GPU batch
    # nondeterminism), so two endpoints of one pool, or one endpoint asked twice, differ a
    # little: the noise floor a shadow run measures between primary and secondary.
    replica_noise: float = 0.0
    # Regress switches (shares of answers, keyed like divergence so a prompt regresses the
    # same way every time): JSON-mode answers made invalid JSON (the object cut short, yet
    # finish_reason "stop"), and answers cut short with finish_reason "length" well before
    # max_tokens.
    json_broken: float = 0.0
    truncate_rate: float = 0.0
    # The share of bundled eval tasks (fleetctl/evals/bundled.py; tasks.py solves them) this
    # pool answers right; the rest get a plausible wrong answer. Which items are wrong is
    # shared across profiles (a lower accuracy is wrong on a superset), except on the
    # profile's divergence share of prompts, where it is drawn again (tasks.py).
    task_accuracy: float = 0.9

    def broken(self) -> list[str]:
        """The switches that differ from the default, as `name=value`."""
        defaults = {"tool_calls": True, "json_mode": True, "stream_usage": True,
                    "logprobs": True, "tokenizer": "llama3"}
        return [f"{k}={_show(getattr(self, k))}" for k, v in defaults.items()
                if getattr(self, k) != v]

    def step_seconds(self, batch_size: int, prefill_tokens: int, slowdown: float) -> float:
        decode_ms = (self.decode_base_ms + self.decode_per_seq_ms * batch_size) * slowdown
        return decode_ms / 1000.0 + prefill_tokens / self.prefill_tokens_per_s

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["models"] = list(self.models)
        return data


def _show(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _builtin(**kwargs: Any) -> Profile:
    return Profile(**kwargs)


BUILTIN_PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        _builtin(
            name="h200",
            description="simulated H200-class",
            accelerator="H200",
            vendor="cuda",
            prefill_tokens_per_s=30000.0,
            decode_base_ms=10.0,
            decode_per_seq_ms=0.08,
            max_seqs=256,
            kv_cache_tokens=300_000,
            prefix_cache_tokens=150_000,
            network_latency_ms=0.5,
            node_hourly_usd=32.0,
            max_context=32768,
            max_waiting=512,
            divergence_rate=0.02,
            near_tie_fraction=0.8,
            replica_noise=0.01,
            task_accuracy=0.92,
        ),
        _builtin(
            name="a100",
            description="simulated A100-class",
            accelerator="A100-80GB",
            vendor="cuda",
            prefill_tokens_per_s=12000.0,
            decode_base_ms=18.0,
            decode_per_seq_ms=0.16,
            max_seqs=128,
            kv_cache_tokens=120_000,
            prefix_cache_tokens=60_000,
            network_latency_ms=0.5,
            node_hourly_usd=16.0,
            max_context=16384,
            max_waiting=256,
            divergence_rate=0.03,
            near_tie_fraction=0.8,
            replica_noise=0.01,
            # The A100 profiles serve an older, quantised build: clearly worse on tasks, so
            # an eval of an A100 candidate against an H200 primary fails (a100-legacy too).
            task_accuracy=0.86,
        ),
        _builtin(
            name="mi300x",
            description="simulated MI300X-class",
            accelerator="MI300X",
            vendor="rocm",
            prefill_tokens_per_s=28000.0,
            decode_base_ms=11.0,
            decode_per_seq_ms=0.09,
            max_seqs=256,
            kv_cache_tokens=500_000,
            prefix_cache_tokens=250_000,
            network_latency_ms=0.6,
            node_hourly_usd=28.0,
            max_context=32768,
            max_waiting=512,
            divergence_rate=0.06,
            near_tie_fraction=0.7,
            replica_noise=0.015,
            task_accuracy=0.92,
        ),
        _builtin(
            name="tpu-v5e",
            description="simulated TPU v5e-class",
            accelerator="TPU v5e",
            vendor="tpu",
            prefill_tokens_per_s=8000.0,
            decode_base_ms=20.0,
            decode_per_seq_ms=0.20,
            max_seqs=64,
            kv_cache_tokens=60_000,
            prefix_cache_tokens=30_000,
            network_latency_ms=0.8,
            node_hourly_usd=9.6,
            max_context=8192,
            max_waiting=128,
            divergence_rate=0.08,
            near_tie_fraction=0.6,
            replica_noise=0.02,
            task_accuracy=0.90,
        ),
        _builtin(
            name="gaudi3",
            description="simulated Gaudi 3-class",
            accelerator="Gaudi 3",
            vendor="gaudi",
            prefill_tokens_per_s=10000.0,
            decode_base_ms=16.0,
            decode_per_seq_ms=0.14,
            max_seqs=128,
            kv_cache_tokens=250_000,
            prefix_cache_tokens=100_000,
            network_latency_ms=0.7,
            node_hourly_usd=14.0,
            max_context=32768,
            max_waiting=256,
            divergence_rate=0.10,
            near_tie_fraction=0.5,
            replica_noise=0.02,
            task_accuracy=0.89,
        ),
    )
}
BUILTIN_PROFILES["a100-legacy"] = dataclasses.replace(
    BUILTIN_PROFILES["a100"],
    name="a100-legacy",
    description="simulated A100-class on an older serving stack: no tool parsing, another "
    "tokenizer",
    tool_calls=False,
    tokenizer="other",
)

# field name -> (accepted python types, human description of the constraint, check)
_FLOAT = (int, float)
_FRACTION = (_FLOAT, "a number between 0 and 1", lambda v: 0 <= v <= 1)
_SWITCH = ((bool,), "true or false", lambda v: True)
_CHECKS: dict[str, tuple[tuple[type, ...], str, Any]] = {
    "description": ((str,), "a string", lambda v: True),
    "accelerator": ((str,), "a non-empty string", lambda v: bool(v)),
    "vendor": ((str,), f"one of {', '.join(VENDORS)}", lambda v: v in VENDORS),
    "prefill_tokens_per_s": (_FLOAT, "a number > 0", lambda v: v > 0),
    "decode_base_ms": (_FLOAT, "a number >= 0", lambda v: v >= 0),
    "decode_per_seq_ms": (_FLOAT, "a number >= 0", lambda v: v >= 0),
    "max_seqs": ((int,), "an integer >= 1", lambda v: v >= 1),
    "kv_cache_tokens": ((int,), "an integer >= 1", lambda v: v >= 1),
    "prefix_cache_tokens": ((int,), "an integer >= 0", lambda v: v >= 0),
    "network_latency_ms": (_FLOAT, "a number >= 0", lambda v: v >= 0),
    "node_hourly_usd": (_FLOAT, "a number >= 0", lambda v: v >= 0),
    "max_context": ((int,), "an integer >= 2", lambda v: v >= 2),
    "max_waiting": ((int,), "an integer >= 0", lambda v: v >= 0),
    "divergence_rate": _FRACTION,
    "near_tie_fraction": _FRACTION,
    "max_prefill_tokens_per_step": ((int,), "an integer >= 1", lambda v: v >= 1),
    "tool_calls": _SWITCH,
    "json_mode": _SWITCH,
    "stream_usage": _SWITCH,
    "logprobs": _SWITCH,
    "tokenizer": ((str,), f"one of {', '.join(TOKENIZERS)}", lambda v: v in TOKENIZERS),
    "replica_noise": _FRACTION,
    "json_broken": _FRACTION,
    "truncate_rate": _FRACTION,
    "task_accuracy": _FRACTION,
}
_OPTIONAL = ("description", "models", "max_prefill_tokens_per_step", *SWITCHES,
             "replica_noise", *REGRESSIONS, "task_accuracy")
_REQUIRED = (*_CHECKS, "models")


def _check_field(where: str, key: str, value: Any) -> Any:
    if key == "models":
        return _check_models(where, value)
    if key not in _CHECKS:
        known = ", ".join(sorted((*_REQUIRED, "base")))
        raise ProfileError(f"{where}.{key}: unknown field (known fields: {known})")
    types, expected, check = _CHECKS[key]
    # bool is an int subclass; `max_seqs = true` is a typo, not a number.
    if types == (bool,):
        if not isinstance(value, bool):
            raise ProfileError(f"{where}.{key}: expected {expected}, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, types) or not check(value):
        raise ProfileError(f"{where}.{key}: expected {expected}, got {value!r}")
    return float(cast(float, value)) if types is _FLOAT else value


def _check_models(where: str, value: Any) -> tuple[str, ...]:
    ok = isinstance(value, list) and value and all(isinstance(m, str) and m for m in value)
    if not ok:
        raise ProfileError(f"{where}.models: expected a non-empty list of model names")
    return tuple(value)


def _check_consistency(where: str, profile: Profile) -> None:
    # Like vLLM at start-up: a request of max_context tokens must fit in the KV cache alone.
    if profile.kv_cache_tokens < profile.max_context:
        raise ProfileError(
            f"{where}.kv_cache_tokens: must be >= max_context "
            f"({profile.kv_cache_tokens} < {profile.max_context})"
        )


def build_profile(name: str, table: dict[str, Any], known: dict[str, Profile]) -> Profile:
    """One `[profiles.NAME]` table → Profile, starting from `base` or an existing profile."""
    where = f"profiles.{name}"
    base_name = table.get("base", name if name in known else None)
    if base_name is not None and base_name not in known:
        raise ProfileError(f"{where}.base: unknown profile {base_name!r}")
    fields = {k: _check_field(where, k, v) for k, v in table.items() if k != "base"}
    if base_name is None:
        missing = [k for k in _REQUIRED if k not in fields and k not in _OPTIONAL]
        if missing:
            raise ProfileError(f"{where}: new profile needs `base` or fields: {', '.join(missing)}")
        fields.setdefault("description", f"simulated {name}")
        profile = Profile(name=name, **fields)
    else:
        profile = dataclasses.replace(known[base_name], name=name, **fields)
        if "description" not in fields and base_name != name:
            profile = dataclasses.replace(profile, description=f"{profile.description} ({name})")
    _check_consistency(where, profile)
    return profile


def _parse_override(key: str, text: str) -> Any:
    """A `KEY=VALUE` from the command line, typed as the profile field wants it."""
    if key not in _CHECKS:
        return text  # `_check_field` names the unknown field
    types = _CHECKS[key][0]
    if types == (bool,):
        lowered = text.lower()
        return {"true": True, "false": False}.get(lowered, text)
    if types in ((int,), _FLOAT):
        number = int if types == (int,) else float
        try:
            return number(text)
        except ValueError:
            return text
    return text


def with_overrides(profile: Profile, overrides: list[tuple[str, str]], where: str) -> Profile:
    """`profile` with command-line overrides (`KEY=VALUE` strings) applied and checked like a
    profile file's fields. The name stays, so its text and divergence stay the profile's."""
    if not overrides:
        return profile
    fields: dict[str, Any] = {}
    for key, text in overrides:
        if key in ("name", "base", "models"):
            raise ProfileError(f"{where}.{key}: cannot be set on --pool (use a profiles file "
                               "or --model)")
        fields[key] = _check_field(where, key, _parse_override(key, text))
    changed = ", ".join(f"{k}={_show(v)}" for k, v in fields.items())
    description = fields.pop("description", f"{profile.description} [{changed}]")
    result = dataclasses.replace(profile, description=description, **fields)
    _check_consistency(where, result)
    return result


def load_profiles(path: Path | None) -> dict[str, Profile]:
    """Built-in profiles, overlaid with those of a TOML file when one is given."""
    profiles = dict(BUILTIN_PROFILES)
    if path is None:
        return profiles
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from exc
    tables = data.get("profiles")
    extra = sorted(set(data) - {"profiles"})
    if extra:
        raise ProfileError(f"{path}: unknown top-level key {extra[0]!r} (expected [profiles.NAME])")
    if not isinstance(tables, dict):
        raise ProfileError(f"{path}: expected one or more [profiles.NAME] tables")
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ProfileError(f"{path}: profiles.{name}: expected a table")
        try:
            profiles[name] = build_profile(name, table, profiles)
        except ProfileError as exc:
            raise ProfileError(f"{path}: {exc}") from exc
    return profiles
