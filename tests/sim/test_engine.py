"""The scheduler on its own: KV admission, preemption, prefix cache, deadlines, lag flag."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging

import pytest

from fleetctl.sim.engine import (
    LAG_WINDOW_STEPS,
    REBASE_AFTER_S,
    Engine,
    EngineHooks,
    LagMonitor,
    PrefixCache,
    SeqParams,
    Sequence,
    StepRecord,
)
from fleetctl.sim.gcgovernor import GcGovernor
from fleetctl.sim.profiles import BUILTIN_PROFILES, Profile
from fleetctl.sim.textgen import TextKey, TokenStream


def fast_profile(**changes: object) -> Profile:
    base = dataclasses.replace(
        BUILTIN_PROFILES["h200"], decode_base_ms=1.0, decode_per_seq_ms=0.0,
        network_latency_ms=0.0, divergence_rate=0.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def sequence(prompt_tokens: int, max_tokens: int, name: str = "p") -> Sequence:
    stream = TokenStream(key=TextKey.of("m", name, None), profile_name="t",
                         divergence_rate=0.0, near_tie_fraction=0.0)
    params = SeqParams(model="m", prompt_tokens=prompt_tokens, prefix_hashes=[],
                       max_tokens=max_tokens, ignore_eos=True)
    return Sequence(params, stream, arrival=0.0)


async def run_all(profile: Profile, seqs: list[Sequence],
                  steps: list[StepRecord] | None = None) -> tuple[Engine, list[int]]:
    """Run `seqs` to completion; also returns the batch size of every step (and appends
    every step's record to `steps`, if given)."""
    batches: list[int] = []

    def on_step(step: StepRecord, lag: float) -> None:
        batches.append(step.batch)
        if steps is not None:
            steps.append(step)

    hooks = EngineHooks(on_step=on_step)
    engine = Engine(profile, pool_name="test", hooks=hooks, governor=GcGovernor())
    engine.start()
    loop = asyncio.get_running_loop()
    for seq in seqs:
        engine.submit(seq, loop.time())
    await asyncio.wait_for(asyncio.gather(*(s.wait_done() for s in seqs)), timeout=20)
    await engine.stop()
    return engine, batches


def test_kv_capacity_limits_admission_below_max_seqs() -> None:
    # 1000 KV tokens hold two 400-token prompts (plus their output), never three.
    profile = fast_profile(max_seqs=8, max_context=600, kv_cache_tokens=1000)
    seqs = [sequence(400, 20, f"p{i}") for i in range(4)]
    engine, batches = asyncio.run(run_all(profile, seqs))
    assert max(batches) == 2
    assert all(s.generated == 20 and s.finish_reason == "length" for s in seqs)
    assert engine.kv_used == 0


def test_a_full_kv_cache_preempts_the_newest_sequence_which_then_resumes() -> None:
    # Two 450-token prompts fit (900), but their growth to 1000 forces a preemption.
    profile = fast_profile(max_seqs=8, max_context=1000, kv_cache_tokens=1000)
    seqs = [sequence(450, 120, f"p{i}") for i in range(2)]
    engine, _ = asyncio.run(run_all(profile, seqs))
    assert engine.preemptions >= 1
    assert seqs[1].preemptions >= 1
    assert all(s.generated == 120 for s in seqs)


def test_steps_follow_absolute_deadlines_without_drift() -> None:
    profile = fast_profile(decode_base_ms=5.0)
    steps: list[StepRecord] = []

    async def timed() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await run_all(profile, [sequence(1, 100)], steps)
        return loop.time() - started

    elapsed = asyncio.run(timed())
    assert len(steps) == 100
    # Every wake-up is at or after its deadline, and each deadline is the previous deadline
    # plus one step, however late the previous wake-up was: the lateness of one wake-up
    # never moves the ones after it. (Only a stall past REBASE_AFTER_S starts a new grid
    # from the late wake-up.) Read from the scheduler's own records, so a loaded machine
    # can make steps late but cannot make this fail.
    assert all(step.actual >= step.intended for step in steps)
    for before, step in itertools.pairwise(steps):
        late = before.actual - before.intended
        start = before.intended if late < REBASE_AFTER_S else before.actual
        assert step.intended == pytest.approx(start + step.step_s, abs=1e-9)
    assert sum(step.actual - step.intended for step in steps) > 0  # drift had something to add
    # 100 steps of 5 ms: the run cannot end early (a floor; a loaded machine only adds).
    assert elapsed > 0.5 - 1e-6


def test_prefix_cache_hits_a_shared_prefix_and_evicts_least_recently_used() -> None:
    cache = PrefixCache(capacity_tokens=16 * 4)
    shared = [f"w{i}" for i in range(32)]
    first = PrefixCache.block_hashes("m", [*shared, *(f"a{i}" for i in range(16))])
    second = PrefixCache.block_hashes("m", [*shared, *(f"b{i}" for i in range(16))])
    other_model = PrefixCache.block_hashes("n", [*shared, *(f"a{i}" for i in range(16))])
    assert cache.peek(first) == 0
    cache.insert(first)
    assert cache.peek(second) == 2  # the two shared blocks, not the differing third
    assert cache.peek(other_model) == 0
    cache.insert(second)  # 3 + 1 new block = 4 blocks: at capacity
    cache.insert(other_model)  # 3 more: the least recently used blocks go
    assert len(cache) == 4
    assert cache.peek(first) == 0 or cache.peek(first) < 3


def test_partial_blocks_are_not_cached() -> None:
    assert PrefixCache.block_hashes("m", [f"w{i}" for i in range(31)]).__len__() == 1


def test_lag_monitor_flags_and_logs_once_per_transition(caplog: pytest.LogCaptureFixture) -> None:
    monitor = LagMonitor("gpu-pool")
    with caplog.at_level(logging.WARNING, logger="fleetctl.sim"):
        for _ in range(LAG_WINDOW_STEPS):
            monitor.record(0.005)
        assert monitor.lagging
        for _ in range(LAG_WINDOW_STEPS):
            monitor.record(0.0001)
        assert not monitor.lagging
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("sim pool gpu-pool lagging: p99 schedule lag 5.00 ms over")
    assert "no longer lagging" in messages[1]


def test_lag_p99_ignores_a_single_outlier_in_two_hundred_steps() -> None:
    monitor = LagMonitor("p")
    for i in range(200):
        monitor.record(0.050 if i == 7 else 0.0005)
    assert monitor.p99() == pytest.approx(0.0005)
    assert not monitor.lagging


def test_a_scheduler_error_fails_requests_in_flight_and_serving_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    steps = 0

    def explode_once(step: object, lag: float) -> None:
        nonlocal steps
        steps += 1
        if steps == 3:
            raise RuntimeError("boom")

    async def scenario() -> tuple[Sequence, Sequence]:
        engine = Engine(fast_profile(), pool_name="test", governor=GcGovernor(),
                        hooks=EngineHooks(on_step=explode_once))
        engine.start()
        loop = asyncio.get_running_loop()
        victim, later = sequence(1, 10, "victim"), sequence(1, 10, "later")
        engine.submit(victim, loop.time())
        await asyncio.wait_for(victim.wait_done(), timeout=30)
        engine.submit(later, loop.time())
        await asyncio.wait_for(later.wait_done(), timeout=30)
        await engine.stop()
        return victim, later

    with caplog.at_level(logging.ERROR, logger="fleetctl.sim"):
        victim, later = asyncio.run(scenario())
    assert victim.error == "internal simulator error"
    assert later.finish_reason == "length" and later.generated == 10
    assert "scheduler error" in caplog.text
