"""The simulator's shadow switches, on real processes: replica noise (two endpoints of one
pool differ a little, at near-ties, at the rate the profile says) and the regress switches
a candidate is given to show that a shadow run catches it (broken JSON, truncation).

Rates are checked against Wilson intervals (fleetctl.inference.confidence), never for equality.
The processes get `--random-seed`, so the non-keyed noise draws repeat from run to run; the
regress switches are keyed by prompt, so they repeat anyway."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetctl.inference.compare import Answer, compare
from fleetctl.inference.confidence import wilson_interval
from fleetctl.sim.profiles import BUILTIN_PROFILES, ProfileError, load_profiles, with_overrides
from fleetctl.sim.structured import broken_json
from fleetctl.sim.textgen import TextKey, TokenStream

from .simproc import MODEL, SimProcess, run_cli

pytestmark = pytest.mark.slow

NOISE = 0.1  # high enough that 300 prompts measure it, low enough to be a floor
N = 300
CONFIDENCE = 0.99
SWITCH_POOLS = {
    "a": f"quick:replica_noise={NOISE}",
    "zero": "quick",  # replica_noise = 0 in the test profiles
    "always": "quick:replica_noise=1",
    "broken": "quick:json_broken=1",
    "json30": "quick:json_broken=0.3",
    "cut": "quick:truncate_rate=1",
    "cut20": "quick:truncate_rate=0.2",
}


@pytest.fixture(scope="module")
def sims(profiles_file: Path, tmp_path_factory: pytest.TempPathFactory,
         ) -> Iterator[tuple[SimProcess, SimProcess]]:
    """Two processes: the switch pools in one, and `b` — the same profile as `a` — in the
    other, each with its own random seed."""
    folder = tmp_path_factory.mktemp("switches")
    common = ["--profiles", str(profiles_file), "--log-level", "WARNING",
              "--record-ground-truth"]
    first = SimProcess([*common, "--random-seed", "1",
                        *(f for name, spec in SWITCH_POOLS.items()
                          for f in ("--pool", f"{name}={spec}@0"))],
                       len(SWITCH_POOLS), folder / "first.log")
    try:
        second = SimProcess([*common, "--random-seed", "2",
                             "--pool", f"b=quick:replica_noise={NOISE}@0"], 1,
                            folder / "second.log")
    except BaseException:
        first.stop()
        raise
    yield first, second
    assert second.stop() == 0, second.log()
    assert first.stop() == 0, first.log()


def chat(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], **extra}


async def _post_all(requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(48)
    async with httpx.AsyncClient(timeout=30.0) as http:

        async def one(url: str, body: dict[str, Any]) -> dict[str, Any]:
            async with gate:
                reply = await http.post(f"{url}/v1/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
                return dict(reply.json())

        return list(await asyncio.gather(*(one(url, body) for url, body in requests)))


def post_all(requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Non-streamed chat answers, concurrently, in the order asked."""
    return asyncio.run(_post_all(requests))


def answers(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return post_all([(url, body) for body in bodies])


def contains(rate: float, successes: int, n: int) -> bool:
    interval = wilson_interval(successes, n, CONFIDENCE)
    return interval.lower <= rate <= interval.upper


def greedy_prompts(tag: str) -> list[dict[str, Any]]:
    # Short answers keep it fast; the flip always falls inside the answer the pool gives.
    return [chat(f"{tag} {i}", max_tokens=6, logprobs=True, top_logprobs=2) for i in range(N)]


# ---- replica noise ----------------------------------------------------------------------


def test_two_processes_of_one_profile_differ_at_the_noise_floor_and_only_at_near_ties(
        sims: tuple[SimProcess, SimProcess]) -> None:
    first, second = sims
    bodies = greedy_prompts("noise floor")
    a, a_again = answers(first.url("a"), bodies), answers(first.url("a"), bodies)
    b = answers(second.url("b"), bodies)
    zero, zero_again = answers(first.url("zero"), bodies), answers(first.url("zero"), bodies)

    # No noise configured: the same answer every time.
    assert all(z["choices"] == y["choices"] for z, y in zip(zero, zero_again, strict=True))

    def differing(xs: list[dict[str, Any]], ys: list[dict[str, Any]]) -> list[Any]:
        pairs = [compare(Answer.from_body(x), Answer.from_body(y), greedy=True)
                 for x, y in zip(xs, ys, strict=True)]
        return [c for c in pairs if not c.exact_match]

    floor = 1 - (1 - NOISE) ** 2
    versus_zero = differing(zero, a)  # one noisy side: about NOISE
    across = differing(a, b)  # two replicas, two processes: 1 - (1 - p)^2
    twice = differing(a, a_again)  # one endpoint asked twice: the same
    for what, rate, found in (("noisy vs noise-free", NOISE, versus_zero),
                              ("two processes", floor, across),
                              ("one endpoint twice", floor, twice)):
        interval = wilson_interval(len(found), N, CONFIDENCE)
        print(f"replica_noise={NOISE}: {what}: {len(found)}/{N} differ = {interval.estimate:.3f} "
              f"[{interval.lower:.3f}, {interval.upper:.3f}] (expected {rate:.3f})")
    assert contains(NOISE, len(versus_zero), N), len(versus_zero)
    assert contains(floor, len(across), N), len(across)
    assert contains(floor, len(twice), N), len(twice)
    for c in (*versus_zero, *across, *twice):
        # A flip, never anything else: same finish reason, and a near-tie where it starts.
        assert c.near_tie is True and not c.finish_mismatch, c


def test_a_flip_is_a_near_tie_and_the_text_goes_on_from_the_flipped_token(
        sims: tuple[SimProcess, SimProcess]) -> None:
    first, _ = sims
    bodies = [chat(f"always flips {i}", max_tokens=40, logprobs=True, top_logprobs=3)
              for i in range(20)]
    zero, noisy = answers(first.url("zero"), bodies), answers(first.url("always"), bodies)
    truth = httpx.get(f"{first.url('always')}/admin/ground-truth",
                      params={"kind": "requests"}).json()["requests"]
    flipped = {r["response_id"]: r["flipped_at"] for r in truth}
    for reference, answer in zip(zero, noisy, strict=True):
        c = compare(Answer.from_body(reference), Answer.from_body(answer), greedy=True)
        at = flipped[answer["id"]]
        assert c.first_divergence == at and c.near_tie is True
        entry = answer["choices"][0]["logprobs"]["content"][at]
        top = {t["token"]: t["logprob"] for t in entry["top_logprobs"]}
        shared = reference["choices"][0]["logprobs"]["content"][at]["token"]
        # The flipped side shows the token the others chose a hair (< 0.1 nats) behind.
        assert entry["token"] != shared and abs(entry["logprob"] - top[shared]) < 0.1


def test_flips_at_the_same_place_continue_alike_and_no_flip_keeps_the_text() -> None:
    key = TextKey.of(MODEL, "continue", None)

    def text(flip: float | None, profile: str = "h200") -> str:
        stream = TokenStream(key=key, profile_name=profile, divergence_rate=0.0,
                             near_tie_fraction=1.0)
        if flip is not None:
            stream.add_flip(flip, 20)
        out, position = [], 0
        while position < stream.natural_length:
            out.append(stream.next().text)
            position += 1
        return "".join(out)

    assert text(0.5) == text(0.5) != text(None)  # deterministic after the flip
    assert text(0.5) != text(0.1)
    # A profile's own divergence position is never the flip's: the two stay apart.
    diverging = TokenStream(key=key, profile_name="x", divergence_rate=1.0,
                            near_tie_fraction=1.0)
    assert diverging.divergence is not None
    at = diverging.divergence.position
    diverging.add_flip(at / 20, 20)
    assert diverging.flipped_at is not None and diverging.flipped_at != at


def test_sampled_and_structured_answers_get_no_replica_flip(
        sims: tuple[SimProcess, SimProcess]) -> None:
    first, _ = sims
    url = first.url("always")
    httpx.delete(f"{url}/admin/ground-truth")
    answers(url, [chat(f"sampled {i}", max_tokens=8, temperature=0.7) for i in range(10)]
            + [chat(f"json {i}", response_format={"type": "json_object"}) for i in range(5)])
    records = httpx.get(f"{url}/admin/ground-truth", params={"kind": "requests"}).json()
    assert len(records["requests"]) == 15
    assert all(r["flipped_at"] is None for r in records["requests"])


# ---- regress switches -------------------------------------------------------------------


def json_valid(body: dict[str, Any]) -> bool:
    try:
        json.loads(body["choices"][0]["message"]["content"])
    except ValueError:
        return False
    return True


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "rooms": {"type": "array", "items": {
                                               "type": "integer"}, "minItems": 2}},
          "required": ["city", "rooms"]}


def json_bodies(n: int) -> list[dict[str, Any]]:
    half = n // 2
    return ([chat(f"json please {i}", response_format={"type": "json_object"})
             for i in range(half)]
            + [chat(f"schema please {i}", response_format={
                "type": "json_schema", "json_schema": {"name": "hotel", "schema": SCHEMA}})
               for i in range(n - half)])


def test_json_broken_makes_json_answers_invalid_at_its_rate(
        sims: tuple[SimProcess, SimProcess]) -> None:
    first, _ = sims
    bodies = json_bodies(200)
    healthy = answers(first.url("zero"), bodies)
    assert all(json_valid(b) for b in healthy)
    broken = answers(first.url("broken"), bodies)
    assert not any(json_valid(b) for b in broken)
    # Broken, not cut off: the server says it stopped by itself.
    assert {b["choices"][0]["finish_reason"] for b in broken} == {"stop"}
    some = answers(first.url("json30"), bodies)
    invalid = sum(not json_valid(b) for b in some)
    assert contains(0.3, invalid, len(bodies)), invalid
    # Keyed by prompt: the same answers break on every call.
    assert [json_valid(b) for b in answers(first.url("json30"), bodies)] == [
        json_valid(b) for b in some]
    # Plain text and tool calls are untouched.
    text = answers(first.url("broken"), [chat("no json", max_tokens=12)])[0]
    assert text["choices"][0]["message"]["content"] == answers(
        first.url("zero"), [chat("no json", max_tokens=12)])[0]["choices"][0]["message"][
        "content"]


def test_broken_json_is_never_valid_whatever_the_value() -> None:
    for text in ('{"answer": "a b c"}', "[1, 2, 3]", "42", "true", '"word"', "null"):
        for u in (0.0, 0.5, 0.999):
            with pytest.raises(ValueError):
                json.loads(broken_json(text, u))


def test_truncate_rate_cuts_answers_short_with_finish_reason_length(
        sims: tuple[SimProcess, SimProcess]) -> None:
    first, _ = sims
    bodies = [chat(f"cut me {i}", max_tokens=400) for i in range(200)]
    full = answers(first.url("zero"), bodies)
    cut = answers(first.url("cut"), bodies)
    for whole, short in zip(full, cut, strict=True):
        used = short["usage"]["completion_tokens"]
        assert short["choices"][0]["finish_reason"] == "length"
        # Well before max_tokens (400): at most 60 % of what the healthy pool answers.
        assert used <= 0.6 * whole["usage"]["completion_tokens"]
        assert whole["choices"][0]["message"]["content"].startswith(
            short["choices"][0]["message"]["content"])
    some = answers(first.url("cut20"), bodies)
    lengths = sum(b["choices"][0]["finish_reason"] == "length" for b in some)
    assert contains(0.2, lengths, len(bodies)), lengths
    # A JSON answer cut short is invalid JSON, and says "length".
    json_cut = answers(first.url("cut"), json_bodies(10))
    assert not any(json_valid(b) for b in json_cut)
    assert {b["choices"][0]["finish_reason"] for b in json_cut} == {"length"}


# ---- where the switches show, and bad values ---------------------------------------------


def test_each_switch_shows_in_the_pools_state_and_start_up_line(
        sims: tuple[SimProcess, SimProcess]) -> None:
    first, second = sims
    expected = {"a": (NOISE, 0.0, 0.0), "zero": (0.0, 0.0, 0.0), "broken": (0.0, 1.0, 0.0),
                "cut20": (0.0, 0.0, 0.2)}
    for pool, values in expected.items():
        profile = httpx.get(f"{first.url(pool)}/admin/state").json()["profile"]
        assert (profile["replica_noise"], profile["json_broken"],
                profile["truncate_rate"]) == values
    assert any("[json_broken=1.0]" in line for line in first.banners)
    assert "[replica_noise=0.1]" in second.banners[0]


def test_builtin_profiles_have_a_small_replica_noise_and_no_regression() -> None:
    for profile in BUILTIN_PROFILES.values():
        assert 0.005 <= profile.replica_noise <= 0.02, profile.name
        assert (profile.json_broken, profile.truncate_rate) == (0.0, 0.0)


def test_switches_are_checked_like_every_profile_field(tmp_path: Path) -> None:
    h200 = BUILTIN_PROFILES["h200"]
    changed = with_overrides(h200, [("replica_noise", "0"), ("json_broken", "0.3"),
                                    ("truncate_rate", "1")], "--pool cand")
    assert (changed.replica_noise, changed.json_broken, changed.truncate_rate) == (0, 0.3, 1)
    for key, value, shown in (("replica_noise", "2", "2.0"), ("json_broken", "-0.1", "-0.1"),
                              ("truncate_rate", "often", "'often'")):
        with pytest.raises(ProfileError) as raised:
            with_overrides(h200, [(key, value)], "--pool cand")
        assert str(raised.value) == (f"--pool cand.{key}: expected a number between 0 and 1, "
                                     f"got {shown}")
    path = tmp_path / "profiles.toml"
    path.write_text('[profiles.cand]\nbase = "mi300x"\njson_broken = 0.5\ntruncate_rate = 0.1\n'
                    'replica_noise = 0\n')
    cand = load_profiles(path)["cand"]
    assert (cand.replica_noise, cand.json_broken, cand.truncate_rate) == (0, 0.5, 0.1)
    path.write_text('[profiles.cand]\nbase = "mi300x"\ntruncate_rate = true\n')
    with pytest.raises(ProfileError, match=r"profiles.cand.truncate_rate: expected a number "
                       r"between 0 and 1, got True"):
        load_profiles(path)


def test_a_bad_switch_on_the_command_line_exits_2_naming_it() -> None:
    result = run_cli("--pool", "cand=mi300x:replica_noise=0,json_broken=1.5@0")
    assert result.returncode == 2
    assert ("--pool cand.json_broken: expected a number between 0 and 1, got 1.5"
            in result.stderr), result.stderr
