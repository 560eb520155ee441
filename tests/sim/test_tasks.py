"""The simulator's task answers (fleetctl/sim/tasks.py): it solves every bundled eval item,
right at the profile's task_accuracy (measured inside its Wilson interval), wrong on nested
sets across accuracies, discordant both ways on the divergence share, deterministic; and a
real pool process answers a bundled item through the normal chat path, streamed or not,
with `task_accuracy` taken from the command line.

This ties three parts together: the generator (fleetctl/evals/bundled.py), the solver here
(which parses the generator's text without importing it) and the item's own scorer."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetctl.evals import bundled, scorers
from fleetctl.inference.confidence import wilson_interval
from fleetctl.sim import tasks
from fleetctl.sim.profiles import (
    BUILTIN_PROFILES,
    Profile,
    ProfileError,
    load_profiles,
    with_overrides,
)
from fleetctl.sim.textgen import TextKey, render_chat
from tests.support.profiles import TEST_PROFILES

from .simproc import MODEL, SimProcess, run_cli, sim_with_profiles

CORE = [json.loads(line) for line in bundled.suite_lines(bundled.MIX)[1:]]
QUIET = dataclasses.replace(BUILTIN_PROFILES["h200"], name="quiet", divergence_rate=0.0)


def _profile(accuracy: float, name: str = "quiet", divergence: float = 0.0) -> Profile:
    return dataclasses.replace(QUIET, name=name, task_accuracy=accuracy,
                               divergence_rate=divergence)


_PARAMS: dict[str, dict[str, Any]] = {}


def _score(item: dict[str, Any], text: str) -> float:
    params = _PARAMS.get(item["id"])
    if params is None:  # validating a JSON Schema is slow: once per item
        params = _PARAMS[item["id"]] = scorers.validate(item["scorer"], item["params"])
    return scorers.score(item["scorer"], text, item["references"], params).value


def _scores(profile: Profile, seed: int = 0) -> list[float]:
    out = []
    for item in CORE:
        text = tasks.task_text(MODEL, item["messages"], seed, profile)
        assert text is not None, item["id"]
        out.append(_score(item, text))
    return out


def _right(profile: Profile, seed: int = 0) -> list[bool]:
    """Which items the profile answers right: its text is the right answer's (what a pool of
    accuracy 1 says). Cheaper than scoring; the first test shows the two agree (right
    answers score 1, wrong ones 0)."""
    always = dataclasses.replace(profile, task_accuracy=1.0)
    return [tasks.task_text(MODEL, item["messages"], seed, profile)
            == tasks.task_text(MODEL, item["messages"], seed, always) for item in CORE]


def test_every_bundled_item_is_solved_and_its_scorer_agrees() -> None:
    """The solver recognises all 1,200 items; its right answer scores 1 and its wrong answer
    0 with the item's own scorer and params."""
    kinds = set()
    for item in CORE:
        task = tasks.solve(item["messages"][-1]["content"])
        assert task is not None, item["id"]
        assert task.family == item["tags"][0], item["id"]
        kinds.add((task.family, task.kind))
        for draw in range(3):
            right = tasks.right_text(task, random.Random(draw))
            wrong = tasks.wrong_text(task, random.Random(draw), random.Random(draw + 7))
            assert _score(item, right) == 1.0, (item["id"], right)
            assert _score(item, wrong) == 0.0, (item["id"], wrong)
    assert len(kinds) >= 25


def test_anything_else_is_not_a_task() -> None:
    for text in ("Hello there.", "", "What is 2 + 2?",
                 "Describe the sea in exactly many words.",
                 "Which number is the largest?\nA. 3\nB. 3\nAnswer with the letter.",
                 "Which number is the largest?\nA. 1\nC. 2",
                 "x" * 10_000,
                 # Near misses that once cost the regexes a lot of backtracking.
                 "Shipment SHP-1 left " + "a carrying 1 kg of " * 200,
                 "Reply only with a JSON object with keys " + '"a", ' * 790 + "where"):
        assert tasks.solve(text) is None, text
    profile = _profile(1.0)
    assert tasks.task_text(MODEL, [{"role": "user", "content": "Hello there."}], 0,
                           profile) is None
    # The LAST user message decides: an item earlier in the chat is not the question.
    item = CORE[0]
    chat = [*item["messages"], {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": "Thanks! Now tell me a joke."}]
    assert tasks.task_text(MODEL, chat, 0, profile) is None


def test_a_system_message_a_completions_prompt_and_text_parts_are_tasks_too() -> None:
    profile = _profile(1.0)
    for item in CORE[:60]:
        question = item["messages"][-1]["content"]
        chat = [{"role": "system", "content": "You are careful."},
                {"role": "user", "content": [{"type": "text", "text": question}]}]
        assert _score(item, tasks.task_text(MODEL, chat, 0, profile) or "") == 1.0
        assert _score(item, tasks.task_text(MODEL, question, 0, profile) or "") == 1.0


@pytest.mark.parametrize("accuracy", [0.92, 0.80])
def test_measured_accuracy_lies_in_its_wilson_interval(accuracy: float) -> None:
    """Over the 1,200 items, for a pool without divergence and one with the built-in mi300x
    divergence; the 99 % interval of the measured share holds the profile's accuracy."""
    for profile in (_profile(accuracy), dataclasses.replace(BUILTIN_PROFILES["mi300x"],
                                                            task_accuracy=accuracy)):
        scores = _scores(profile)
        assert set(scores) <= {0.0, 1.0}
        interval = wilson_interval(int(sum(scores)), len(scores), 0.99)
        assert interval.lower <= accuracy <= interval.upper, (profile.name, interval)
        # ... and per family (300 items each), so no family is always right or wrong.
        for family in bundled.FAMILIES:
            got = [s for s, item in zip(scores, CORE, strict=True) if item["tags"][0] == family]
            fam = wilson_interval(int(sum(got)), len(got), 0.999)
            assert fam.lower <= accuracy <= fam.upper, (family, fam)


def test_wrong_items_are_nested_across_accuracies_without_divergence() -> None:
    wrong = {}
    for accuracy, name in ((0.95, "a"), (0.92, "b"), (0.89, "c"), (0.80, "d")):
        right = _right(_profile(accuracy, name=name))
        wrong[accuracy] = {item["id"] for r, item in zip(right, CORE, strict=True) if not r}
    assert wrong[0.95] <= wrong[0.92] <= wrong[0.89] <= wrong[0.80]
    assert len(wrong[0.95]) < len(wrong[0.92]) < len(wrong[0.89]) < len(wrong[0.80])
    assert _scores(_profile(0.0)) == [0.0] * len(CORE)


def test_answers_are_deterministic_per_model_prompt_seed_and_profile() -> None:
    profile = _profile(0.5)
    items = CORE[:200]
    first = [tasks.task_text(MODEL, item["messages"], 0, profile) for item in items]
    assert first == [tasks.task_text(MODEL, item["messages"], 0, profile) for item in items]
    # Another seed or another model draws again: some answers change, as a real model's
    # would with another sampling seed.
    assert first != [tasks.task_text(MODEL, item["messages"], 1, profile) for item in items]
    assert first != [tasks.task_text("qwen2.5-7b-instruct", item["messages"], 0, profile)
                     for item in items]
    # The key is the text key the server uses: (model, rendered prompt, seed).
    item = items[0]
    key = TextKey.of(MODEL, render_chat([("user", item["messages"][0]["content"])]), 0)
    task = tasks.solve(item["messages"][0]["content"])
    assert task is not None
    assert first[0] == tasks.answer(task, key_hash_parts=(key,), profile_name="quiet",
                                    accuracy=0.5, divergence_rate=0.0)


def test_divergence_redraws_with_the_profile_name_discordant_both_ways() -> None:
    a = _right(_profile(0.9, name="vendor-a", divergence=0.3))
    b = _right(_profile(0.9, name="vendor-b", divergence=0.3))
    assert a == _right(_profile(0.9, name="vendor-a", divergence=0.3))
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x > y)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if y > x)
    assert a_only > 0 and b_only > 0
    # Only on the divergence shares: about 2 x 0.3 x (0.9 x 0.1 x 2) of items, far from all.
    assert a_only + b_only < 0.15 * len(CORE)
    # Two pools of one profile (an A/A run) never disagree, divergence or not.
    mi300x = BUILTIN_PROFILES["mi300x"]
    assert [tasks.task_text(MODEL, item["messages"], 0, mi300x) for item in CORE] == [
        tasks.task_text(MODEL, item["messages"], 0, dataclasses.replace(mi300x)) for item in CORE]


def test_task_accuracy_in_profiles_overrides_and_toml(tmp_path: Path) -> None:
    assert BUILTIN_PROFILES["h200"].task_accuracy == 0.92
    assert BUILTIN_PROFILES["mi300x"].task_accuracy == 0.92
    assert BUILTIN_PROFILES["a100-legacy"].task_accuracy < 0.9
    assert all(0.8 <= p.task_accuracy <= 1 for p in BUILTIN_PROFILES.values())
    cand = with_overrides(BUILTIN_PROFILES["mi300x"], [("task_accuracy", "0.87")], "--pool c")
    assert (cand.name, cand.task_accuracy) == ("mi300x", 0.87)
    assert "[task_accuracy=0.87]" in cand.description
    with pytest.raises(ProfileError, match=r"--pool c.task_accuracy: expected a number "
                       r"between 0 and 1, got 1.5"):
        with_overrides(BUILTIN_PROFILES["mi300x"], [("task_accuracy", "1.5")], "--pool c")
    with pytest.raises(ProfileError, match="task_accuracy: expected a number between 0 and 1"):
        with_overrides(BUILTIN_PROFILES["mi300x"], [("task_accuracy", "high")], "--pool c")
    path = tmp_path / "p.toml"
    path.write_text('[profiles.worse]\nbase = "h200"\ntask_accuracy = 0.8\n')
    assert load_profiles(path)["worse"].task_accuracy == 0.8
    path.write_text('[profiles.worse]\nbase = "h200"\ntask_accuracy = "0.8"\n')
    with pytest.raises(ProfileError, match=r"profiles\.worse\.task_accuracy: expected a number"):
        load_profiles(path)


def test_a_bad_task_accuracy_on_the_command_line_exits_2() -> None:
    done = run_cli("--pool", "c=h200:task_accuracy=2@0")
    assert done.returncode == 2
    assert "--pool c.task_accuracy: expected a number between 0 and 1, got 2" in done.stderr
    assert "Traceback" not in done.stderr


# -- through a real pool process --------------------------------------------------------

TASK_POOLS = {"good": "quick:task_accuracy=1", "bad": "quick:task_accuracy=0",
              "plain": "quick"}


@pytest.fixture(scope="module")
def task_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("tasks"), TEST_PROFILES, TASK_POOLS)
    yield sim
    assert sim.stop() == 0, sim.log()


def _pool_profile(spec: str, tmp_path: Path) -> Profile:
    path = tmp_path / "profiles.toml"
    path.write_text(TEST_PROFILES)
    name, _, override = spec.partition(":")
    pairs = [tuple(p.split("=", 1)) for p in override.split(",") if p]
    return with_overrides(load_profiles(path)[name], pairs, "--pool x")  # type: ignore[arg-type]


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/{path}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def _streamed(url: str, body: dict[str, Any]) -> tuple[str, str | None, dict[str, Any] | None]:
    text, finish, usage = "", None, None
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}
                      ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                text += choice["delta"].get("content") or ""
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
    return text, finish, usage


@pytest.mark.slow
def test_a_pool_answers_bundled_items_through_chat_streamed_and_not(
        task_sim: SimProcess, tmp_path: Path) -> None:
    picks = {family: next(i for i in CORE if i["tags"][0] == family)
             for family in bundled.FAMILIES}
    for pool, want in (("good", 1.0), ("bad", 0.0)):
        profile = _pool_profile(TASK_POOLS[pool], tmp_path)
        assert profile.task_accuracy == want  # taken from the command line
        url = task_sim.url(pool)
        for item in picks.values():
            body = {"model": MODEL, "messages": item["messages"], "temperature": 0, "seed": 0,
                    "max_tokens": 128}
            expected = tasks.task_text(MODEL, item["messages"], 0, profile)
            assert expected is not None
            reply = _post(url, "chat/completions", body)
            text = reply["choices"][0]["message"]["content"]
            assert text == expected, (pool, item["id"])
            assert _score(item, text) == want, (pool, item["id"], text)
            assert reply["choices"][0]["finish_reason"] == "stop"
            assert reply["usage"]["completion_tokens"] > 0
            streamed, finish, usage = _streamed(url, body)
            assert (streamed, finish) == (expected, "stop"), (pool, item["id"])
            assert usage is not None
            assert usage["completion_tokens"] == reply["usage"]["completion_tokens"]
    # max_tokens cuts a task's answer as any other: "length", a prefix of the answer.
    item = picks["extraction"]
    body = {"model": MODEL, "messages": item["messages"], "seed": 0, "max_tokens": 3}
    reply = _post(task_sim.url("good"), "chat/completions", body)
    full = tasks.task_text(MODEL, item["messages"], 0, _pool_profile(TASK_POOLS["good"],
                                                                     tmp_path))
    assert reply["choices"][0]["finish_reason"] == "length"
    assert full is not None and full.startswith(reply["choices"][0]["message"]["content"])
    assert reply["usage"]["completion_tokens"] == 3
    # The completions endpoint reads its prompt the same way.
    done = _post(task_sim.url("good"), "completions", {
        "model": MODEL, "prompt": picks["choice"]["messages"][0]["content"], "seed": 0,
        "max_tokens": 32})
    assert _score(picks["choice"], done["choices"][0]["text"]) == 1.0


@pytest.mark.slow
def test_other_prompts_keep_the_usual_text(task_sim: SimProcess) -> None:
    """Not a task: the pools answer with the profile's generated text, the same from a pool
    of accuracy 1 and one of accuracy 0 (task_accuracy touches tasks only)."""
    messages = [{"role": "user", "content": "Tell me about ships."}]
    body = {"model": MODEL, "messages": messages, "seed": 3, "max_tokens": 40}
    texts = {pool: _post(task_sim.url(pool), "chat/completions", body)["choices"][0]
             ["message"]["content"] for pool in TASK_POOLS}
    assert len(set(texts.values())) == 1
    assert tasks.task_text(MODEL, messages, 3, QUIET) is None
