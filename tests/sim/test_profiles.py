"""Accelerator profiles: built-ins, and custom ones from TOML with errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.sim.profiles import BUILTIN_PROFILES, ProfileError, load_profiles, with_overrides


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profiles.toml"
    path.write_text(text)
    return path


HARDWARE = ("h200", "a100", "mi300x", "tpu-v5e", "gaudi3")


def test_every_builtin_profile_is_labelled_simulated_and_has_its_own_numbers() -> None:
    assert set(BUILTIN_PROFILES) == {*HARDWARE, "a100-legacy"}
    for profile in BUILTIN_PROFILES.values():
        assert profile.description.startswith("simulated "), profile.name
    numbers = {
        (p.prefill_tokens_per_s, p.decode_base_ms, p.decode_per_seq_ms, p.node_hourly_usd)
        for p in (BUILTIN_PROFILES[name] for name in HARDWARE)
    }
    assert len(numbers) == len(HARDWARE)
    assert {p.vendor for p in BUILTIN_PROFILES.values()} == {"cuda", "rocm", "tpu", "gaudi"}


def test_hardware_profiles_keep_the_whole_contract_and_a100_legacy_breaks_two_parts() -> None:
    for name in HARDWARE:
        p = BUILTIN_PROFILES[name]
        assert (p.tool_calls, p.json_mode, p.stream_usage, p.logprobs, p.tokenizer) == (
            True, True, True, True, "llama3"), name
        assert p.broken() == []
    legacy, a100 = BUILTIN_PROFILES["a100-legacy"], BUILTIN_PROFILES["a100"]
    assert legacy.description == ("simulated A100-class on an older serving stack: no tool "
                                  "parsing, another tokenizer")
    assert legacy.broken() == ["tool_calls=false", "tokenizer=other"]
    same = {k: v for k, v in legacy.as_dict().items()
            if k not in ("name", "description", "tool_calls", "tokenizer")}
    assert same == {k: v for k, v in a100.as_dict().items() if k in same}


def test_a_file_can_switch_parts_of_the_contract_off(tmp_path: Path) -> None:
    path = write(tmp_path, """
[profiles.partial]
base = "h200"
tool_calls = false
json_mode = false
stream_usage = false
logprobs = false
tokenizer = "other"
""")
    partial = load_profiles(path)["partial"]
    assert partial.broken() == ["tool_calls=false", "json_mode=false", "stream_usage=false",
                                "logprobs=false", "tokenizer=other"]
    assert load_profiles(path)["h200"].broken() == []


def test_command_line_overrides_are_typed_and_checked_like_file_fields() -> None:
    h200 = BUILTIN_PROFILES["h200"]
    changed = with_overrides(h200, [("tool_calls", "false"), ("tokenizer", "other"),
                                    ("max_seqs", "4"), ("divergence_rate", "0")], "--pool x")
    assert (changed.name, changed.tool_calls, changed.tokenizer, changed.max_seqs,
            changed.divergence_rate) == ("h200", False, "other", 4, 0.0)
    assert changed.description == ("simulated H200-class [tool_calls=false, tokenizer=other, "
                                   "max_seqs=4, divergence_rate=0.0]")
    assert with_overrides(h200, [], "--pool x") is h200
    with pytest.raises(ProfileError, match=r"--pool x.logprobs: expected true or false, got '1'"):
        with_overrides(h200, [("logprobs", "1")], "--pool x")
    with pytest.raises(ProfileError, match=r"--pool x.kv_cache_tokens: must be >= max_context"):
        with_overrides(h200, [("kv_cache_tokens", "100")], "--pool x")


def test_builtin_speeds_keep_realistic_order() -> None:
    p = BUILTIN_PROFILES

    def step_ms(name: str) -> float:
        return p[name].step_seconds(64, 0, 1.0) * 1000

    assert step_ms("h200") < step_ms("mi300x") < step_ms("gaudi3") < step_ms("a100")
    assert step_ms("a100") < step_ms("tpu-v5e")
    assert p["mi300x"].kv_cache_tokens > p["h200"].kv_cache_tokens
    assert p["h200"].prefill_tokens_per_s > p["a100"].prefill_tokens_per_s


def test_step_time_follows_the_documented_formula() -> None:
    h200 = BUILTIN_PROFILES["h200"]
    # (10 + 0.08 * 100) ms * 2 + 3000 tokens / 30000 tokens/s
    assert h200.step_seconds(100, 3000, 2.0) == pytest.approx(0.036 + 0.1)


def test_a_file_can_override_a_builtin_and_add_a_profile(tmp_path: Path) -> None:
    path = write(tmp_path, """
[profiles.h200]
divergence_rate = 0.0

[profiles.tiny]
base = "mi300x"
max_seqs = 2
models = ["m1"]
""")
    profiles = load_profiles(path)
    assert profiles["h200"].divergence_rate == 0.0
    assert profiles["h200"].max_seqs == BUILTIN_PROFILES["h200"].max_seqs
    tiny = profiles["tiny"]
    assert (tiny.max_seqs, tiny.models, tiny.vendor) == (2, ("m1",), "rocm")
    assert "simulated" in tiny.description


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[profiles.x]\nbase = "h200"\nmax_seqs = "many"', "profiles.x.max_seqs: expected an "
         "integer >= 1, got 'many'"),
        ('[profiles.x]\nbase = "h200"\nmax_seqs = true', "profiles.x.max_seqs"),
        ('[profiles.x]\nbase = "h200"\ndivergence_rate = 1.5', "profiles.x.divergence_rate"),
        ('[profiles.x]\nbase = "h200"\nvendor = "cobol"', "profiles.x.vendor: expected one of"),
        ('[profiles.x]\nbase = "h200"\nspeed = 3', "profiles.x.speed: unknown field"),
        ('[profiles.x]\nbase = "nope"', "profiles.x.base: unknown profile 'nope'"),
        ('[profiles.x]\nbase = "h200"\nkv_cache_tokens = 100', "profiles.x.kv_cache_tokens: "
         "must be >= max_context"),
        ('[profiles.x]\nbase = "h200"\nmodels = []', "profiles.x.models"),
        ("[profiles.x]\nmax_seqs = 3", "profiles.x: new profile needs `base` or fields:"),
        ('[profiles.x]\nbase = "h200"\ntool_calls = "no"', "profiles.x.tool_calls: expected "
         "true or false, got 'no'"),
        ('[profiles.x]\nbase = "h200"\ntokenizer = "gpt2"', "profiles.x.tokenizer: expected "
         "one of llama3, other, got 'gpt2'"),
        ("[pools]\nx = 1", "unknown top-level key 'pools'"),
        ("[profiles.x\n", "not valid TOML"),
    ],
)
def test_a_bad_profile_file_is_refused_naming_the_field(
    tmp_path: Path, toml: str, message: str
) -> None:
    with pytest.raises(ProfileError) as caught:
        load_profiles(write(tmp_path, toml))
    assert message in str(caught.value)
    assert str(tmp_path) in str(caught.value)


def test_a_missing_file_is_a_profile_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profiles(tmp_path / "absent.toml")
