"""The shadow feature's Redis contract (fleetctl/shadow/live.py) against a real Redis: the
routes hash the collectors read, the counters, today's tokens, and admit()'s answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from fleetctl.shadow import live
from tests.shadow import forget_shadow_keys, use_isolated_redis

RUN = 7_700_001


@pytest.fixture
def shadow_redis(settings: Any) -> Iterator[redis.Redis]:
    """live.* on this module's own Redis database, emptied of shadow keys after the test."""
    r = use_isolated_redis(settings)
    yield r
    forget_shadow_keys(r)


def test_a_published_run_is_what_collectors_read_and_unpublishing_removes_only_its_route(
        shadow_redis):
    live.publish_run(RUN, "chat-us", max_rps=2.5, max_tokens_per_day=5000)
    live.publish_run(RUN + 1, "chat-eu", max_rps=1, max_tokens_per_day=9000)

    assert live.published() == {
        "chat-us": live.RunConfig(RUN, 2.5, 5000), "chat-eu": live.RunConfig(RUN + 1, 1.0, 9000)}
    assert json.loads(shadow_redis.hget(live.ROUTES_KEY, "chat-us")) == {
        "run": RUN, "max_rps": 2.5, "max_tokens_per_day": 5000}

    live.unpublish_run("chat-us")

    assert live.published() == {"chat-eu": live.RunConfig(RUN + 1, 1.0, 9000)}
    live.unpublish_run("chat-us")  # twice is harmless (a stop retried)


def test_a_route_value_that_is_not_a_run_is_skipped_not_fatal(shadow_redis):
    shadow_redis.hset(live.ROUTES_KEY, mapping={
        "garbage": "not json", "half": json.dumps({"run": 3}),
        "zero-rate": json.dumps({"run": 4, "max_rps": 0, "max_tokens_per_day": 10})})
    live.publish_run(RUN, "good", max_rps=1, max_tokens_per_day=1000)

    assert set(live.published()) == {"good"}
    with pytest.raises(ValueError, match="max_rps"):
        live.publish_run(RUN, "bad", max_rps=0, max_tokens_per_day=1000)


def test_counters_add_up_and_list_every_field(shadow_redis):
    live.count(RUN, received=3, sampled=2, dropped_rate=1)
    live.count(RUN, received=1, dropped_malformed=1)

    counted = live.counters(RUN)

    assert list(counted) == list(live.COUNTER_FIELDS)
    assert (counted["received"], counted["sampled"], counted["dropped_rate"],
            counted["dropped_malformed"], counted["pairs"]) == (4, 2, 1, 1, 0)
    assert live.counters(RUN + 99) == dict.fromkeys(live.COUNTER_FIELDS, 0)


def test_an_unknown_counter_is_refused_and_nothing_is_written(shadow_redis):
    with pytest.raises(ValueError, match="dropped_typo"):
        live.count(RUN, received=1, dropped_typo=1)
    assert live.counters(RUN)["received"] == 0


def test_unmatched_requests_are_counted_per_route(shadow_redis):
    live.count_unmatched("chat-us")
    live.count_unmatched("chat-us", 2)
    live.count_unmatched(None)

    assert live.unmatched() == {"chat-us": 3, live.NO_ROUTE: 1}


def test_todays_tokens_add_up_on_a_key_of_the_utc_day_that_expires(shadow_redis):
    assert live.tokens_today(RUN) == 0

    assert live.add_tokens(RUN, 1200) == 1200
    assert live.add_tokens(RUN, 300) == 1500

    assert live.tokens_today(RUN) == 1500
    assert 0 < shadow_redis.ttl(live.tokens_key(RUN)) <= 2 * 24 * 3600
    today = datetime.now(UTC).strftime("%Y%m%d")
    assert shadow_redis.get(f"fleetctl:shadow:run:{RUN}:tokens:{today}") == b"1500"
    assert live.counters(RUN)["tokens"] == 0  # the run's counter is counted separately


def test_admit_spends_the_rate_budget_then_refuses_with_rate(shadow_redis):
    config = live.RunConfig(RUN, max_rps=2, max_tokens_per_day=10_000)

    answers = [live.admit(RUN, config) for _ in range(6)]

    # A burst of max(1, max_rps) = 2, then one every 0.5 s: six calls made well within that.
    assert answers[:2] == ["", ""]
    assert answers.count("") <= 3
    assert set(answers[2:]) <= {"", "rate"} and "rate" in answers


def test_a_rate_below_one_per_second_admits_one_then_refuses(shadow_redis):
    config = {"max_rps": 0.2, "max_tokens_per_day": 10_000}

    assert [live.admit(RUN, config) for _ in range(3)] == ["", "rate", "rate"]


def test_admit_refuses_with_tokens_once_todays_total_reaches_the_cap(shadow_redis):
    run = SimpleNamespace(max_rps=100, max_tokens_per_day=1000)  # a ShadowRun has these
    live.add_tokens(RUN, 999)
    assert live.admit(RUN, run) == ""

    live.add_tokens(RUN, 1)

    assert live.admit(RUN, run) == "tokens"


def test_admit_refuses_with_behind_while_the_shadow_queue_is_full(shadow_redis, settings):
    settings.SHADOW_MAX_QUEUED = 3
    config = live.RunConfig(RUN, max_rps=100, max_tokens_per_day=10_000)
    shadow_redis.lpush(live.SHADOW_QUEUE, "a", "b")
    assert live.shadow_queue_length() == 2
    assert live.admit(RUN, config) == ""

    shadow_redis.lpush(live.SHADOW_QUEUE, "c")

    assert live.admit(RUN, config) == "behind"


def test_the_async_twins_agree_with_the_sync_functions(shadow_redis, settings):
    settings.SHADOW_MAX_QUEUED = 500
    live.publish_run(RUN, "chat-us", max_rps=1, max_tokens_per_day=1000)
    live.add_tokens(RUN, 400)

    async def scenario() -> tuple[Any, ...]:
        r = live.aclient()
        try:
            routes, tokens, queued = await live.asnapshot(r, [RUN, RUN + 1])
            await live.acount_many(r, {RUN: {"received": 2, "sampled": 1}}, {"other": 1})
            answers = [await live.aadmit(r, RUN, routes["chat-us"]) for _ in range(2)]
            return routes, tokens, queued, answers
        finally:
            await r.aclose()

    routes, tokens, queued, answers = asyncio.run(scenario())

    assert routes == live.published()
    assert tokens == {RUN: 400, RUN + 1: 0}
    assert queued == 0
    assert answers == ["", "rate"]
    assert (live.counters(RUN)["received"], live.counters(RUN)["sampled"]) == (2, 1)
    assert live.unmatched() == {"other": 1}


def test_the_local_rate_check_is_the_same_arithmetic():
    limit = live.LocalRate(2)  # burst 2, then one per 0.5 s
    second = 1_000_000

    assert [limit.allow(0), limit.allow(0), limit.allow(0)] == [True, True, False]
    assert limit.allow(second // 4) is False
    assert limit.allow(second // 2) is True
    assert limit.allow(second // 2) is False
    assert limit.allow(10 * second) and limit.allow(10 * second)  # the burst again
    assert not limit.allow(10 * second)

    slow = live.LocalRate(0.5)  # one per 2 s, no burst
    assert [slow.allow(0), slow.allow(second), slow.allow(2 * second)] == [True, False, True]
