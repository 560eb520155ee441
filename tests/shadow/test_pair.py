"""One shadow pair end to end, on real simulated pools: a sampled request sent to the
primary, the primary's other endpoint (the secondary) and the candidate at once, compared,
stored as a ShadowPair (text only as the content policy allows) and counted in Redis.

The fixtures here (a simulator with a primary of two endpoints, an identical candidate and
a regressed one, a plan pointing at them) are shared by the other shadow run tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.db import models
from django.db.models.functions import Cast

from fleetctl.celery import app
from fleetctl.fleet.models import Pool, Region
from fleetctl.fleet.services import region_create
from fleetctl.shadow import live, services, stats
from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun
from fleetctl.traffic.models import Route
from migrations_plan.models import Plan
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

# No replica noise but on the noisy pools: a pair's outcome is then decided by the prompt
# alone, so each test knows what the comparison must find.
SIM_POOLS = {"p1": "quick", "p2": "quick", "same": "quick", "regressed": "shadow-regressed",
             # replica noise (batch nondeterminism) turned up so that a few pairs show it
             "noisy-a": "shadow-noisy", "noisy-b": "shadow-noisy", "noisy-c": "shadow-noisy"}


@pytest.fixture(scope="session")
def shadow_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("shadow-sim"), TEST_PROFILES, SIM_POOLS)
    yield sim
    sim.stop()


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """Runs publish to and count in Redis, which a rolled-back test database does not undo;
    run ids come back after a flush."""
    client = live.client()

    def forget() -> None:
        client.delete(live.ROUTES_KEY)
        for key in client.scan_iter("fleetctl:shadow:run:*"):
            client.delete(key)

    forget()
    yield
    forget()


def point(pool: Pool, *urls: str) -> Pool:
    Pool.objects.filter(pk=pool.pk).update(base_urls=list(urls))
    return Pool.objects.get(pk=pool.pk)


@pytest.fixture
def shadow_world(world: World, shadow_sim: SimProcess) -> World:  # noqa: F811
    """The plan's primary has two endpoints (p1, p2), its candidate answers as they do."""
    world.primary = point(world.primary, shadow_sim.url("p1"), shadow_sim.url("p2"))
    world.candidate = point(world.candidate, shadow_sim.url("same"))
    return world


def chat(i: int, marker: str = "", *, stream: bool = True, max_tokens: int = 12,
         **extra: Any) -> dict[str, Any]:
    """A greedy chat request; each i is another prompt (so another divergence draw)."""
    return {"model": MODEL, "temperature": 0, "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"question {i} {marker}".strip()}],
            **extra}


def start(w: World, plan: Plan | None = None, **kwargs: Any) -> ShadowRun:
    kwargs.setdefault("content", "full")
    return services.run_create(actor=w.actor("lead"), plan=plan or w.plan(), **kwargs)


def execute(run: ShadowRun, request: dict[str, Any], source: str = "mirror"
            ) -> ShadowPair | None:
    return services.pair_execute(run_id=run.pk, request=request, source=source,
                                 received_at="2026-12-02T09:00:00+00:00")


def send_pairs(run: ShadowRun, requests: list[dict[str, Any]]) -> None:
    """As the collector does: one `shadow.pair` task per sampled request."""
    for request in requests:
        app.send_task("shadow.pair", kwargs={"run_id": run.pk, "request": request,
                                             "received_at": "2026-12-02T09:00:00+00:00",
                                             "source": "mirror"})


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- a pair -----------------------------------------------------------------------------------

def test_a_mirrored_request_becomes_a_pair_with_all_three_sides(
        celery_worker, shadow_world: World, shadow_sim):
    run = start(shadow_world, min_pairs=10)
    assert live.published()["llama"].run == run.pk  # published once committed
    send_pairs(run, [chat(1, logprobs=True, top_logprobs=3), chat(2, stream=False)])
    wait_until(lambda: ShadowPair.objects.filter(run=run).count() == 2, timeout_s=60,
               what="two pairs")
    streamed, whole = (ShadowPair.objects.get(run=run, params__stream=True),
                       ShadowPair.objects.get(run=run, params__stream=False))
    p1, p2, same = (shadow_sim.url(n) for n in ("p1", "p2", "same"))
    for pair in (streamed, whole):
        assert set(pair.sides) == {"primary", "secondary", "candidate"}
        assert {pair.sides["primary"]["endpoint"], pair.sides["secondary"]["endpoint"]} == {
            p1, p2}, "the secondary is the primary's other endpoint"
        assert pair.sides["candidate"]["endpoint"] == same
        for side in pair.sides.values():
            assert (side["status"], side["error"], side["finish"]) == (200, "", "length")
            assert side["completion_tokens"] == 12 and side["latency_ms"] > 0
            assert len(side["text_sha256"]) == 64
        assert pair.greedy and pair.source == "mirror"
        assert pair.params["model"] == MODEL and pair.params["max_tokens"] == 12
        assert not (pair.noise_diverged or pair.signal_diverged or pair.candidate_error)
        assert pair.noise["exact_match"] == 1 and pair.signal["exact_match"] == 1
        assert pair.divergence_score == 0
        assert pair.content["prompt"][0]["content"].startswith("question")
        assert pair.content["primary"] == pair.content["candidate"] != ""
    assert streamed.sides["primary"]["ttft_ms"] > 0 and streamed.sides["primary"]["tpot_ms"] > 0
    assert whole.sides["primary"]["ttft_ms"] is None  # a whole answer has its latency only
    assert streamed.params["logprobs"] is True
    counters = live.counters(run.pk)
    assert (counters["pairs"], counters["pair_errors"]) == (2, 0)
    assert counters["tokens"] == live.tokens_today(run.pk) > 6 * 12

    judgement = services.run_judge(run=run)
    assert judgement.pairs == 2 and judgement.verdict == "insufficient"
    assert ShadowRun.objects.get(pk=run.pk).counters["pairs"] == 2


def test_a_candidate_that_is_down_gives_a_pair_with_a_candidate_error(shadow_world: World):
    shadow_world.candidate = point(shadow_world.candidate, closed_port_url())
    run = start(shadow_world)
    pair = execute(run, chat(3))
    assert pair is not None and pair.candidate_error
    assert pair.sides["candidate"]["status"] == 0
    assert pair.sides["candidate"]["error"].startswith("unreachable")
    assert pair.sides["primary"]["status"] == 200
    assert pair.signal["error_mismatch"] == 1 and pair.noise["error_mismatch"] == 0
    assert pair.signal_diverged and pair.divergence_score == 1.0
    counters = live.counters(run.pk)
    assert (counters["pairs"], counters["pair_errors"]) == (1, 1)
    judged = services.run_judge(run=run)
    assert judged.metrics["error_mismatch"]["signal_rate"] == 1.0


def test_a_diverging_candidate_is_seen_against_a_quiet_noise_floor(shadow_world, shadow_sim):
    shadow_world.candidate = point(shadow_world.candidate, shadow_sim.url("regressed"))
    run = start(shadow_world)
    pairs = [execute(run, chat(i, max_tokens=48)) for i in range(12)]
    assert all(p is not None for p in pairs)
    assert not any(p.noise_diverged for p in pairs if p)
    diverged = [p for p in pairs if p and p.signal_diverged]
    assert 2 <= len(diverged) <= 11  # 60 % of prompts diverge within their first 48 tokens
    for pair in diverged:
        assert pair.signal["first_divergence"] is not None and pair.signal["token_a"]
        assert 0 < pair.divergence_score <= 1


def test_replica_noise_flips_are_near_ties_the_gate_excuses_on_both_sides(
        shadow_world: World, shadow_sim):
    shadow_world.primary = point(shadow_world.primary, shadow_sim.url("noisy-a"),
                                 shadow_sim.url("noisy-b"))
    shadow_world.candidate = point(shadow_world.candidate, shadow_sim.url("noisy-c"))
    run = start(shadow_world, content="off", min_pairs=10)
    pairs = [execute(run, chat(100 + i, max_tokens=32, logprobs=True, top_logprobs=3))
             for i in range(16)]
    flipped = [p for p in pairs if p and (p.noise_diverged or p.signal_diverged)]
    assert len(flipped) >= 4, "at 50 % per answer most pairs have a flip"
    for pair in flipped:
        for comparison in (pair.noise, pair.signal):
            if comparison["diverged"]:
                assert comparison["near_tie"] == 1 and comparison["hard_flip"] == 0
                # Excused unless the flip also changed how the answer ended (the text after
                # a flip differs, so its length may too): then it counts, on both sides alike.
                assert stats.metric_values(comparison)["divergence"] == comparison[
                    "finish_mismatch"]
    judged = services.run_judge(run=run).metrics
    for side in ("noise_rate", "signal_rate"):
        assert judged["divergence"][side] == judged["finish_mismatch"][side]
    assert judged["diverged_any"]["noise_rate"] > judged["divergence"]["noise_rate"]


# --- dropped --------------------------------------------------------------------------------

def test_residency_a_candidate_moved_outside_the_pin_drops_the_pair_and_stops_the_run(
        shadow_world: World, django_capture_on_commit_callbacks):
    Route.objects.filter(pk=shadow_world.route.pk).update(residency="US")
    with django_capture_on_commit_callbacks(execute=True):
        run = start(shadow_world)
    assert live.published()["llama"].run == run.pk
    assert Route.objects.get(pk=shadow_world.route.pk).mirror_percent == 10
    eu: Region = region_create(actor=shadow_world.actor("admin"), code="eu-west",
                               name="EU West", jurisdiction="DE")
    Pool.objects.filter(pk=shadow_world.candidate.pk).update(region=eu)

    with django_capture_on_commit_callbacks(execute=True):
        assert execute(run, chat(4)) is None
    run.refresh_from_db()
    assert run.status == "stopped" and run.cancelled_by == "system:shadow"
    assert "residency: pool mi300x-us is now in jurisdiction DE" in run.stop_reason
    assert not ShadowPair.objects.filter(run=run).exists()
    assert live.counters(run.pk)["dropped_residency"] == 1
    assert "llama" not in live.published()
    assert Route.objects.get(pk=shadow_world.route.pk).mirror_percent == 0
    # Whatever was still queued for it is dropped as stopped.
    assert execute(run, chat(5)) is None
    assert live.counters(run.pk)["dropped_stopped"] == 1


def test_a_request_without_a_model_is_dropped_as_malformed(shadow_world: World):
    run = start(shadow_world)
    assert execute(run, {"messages": [{"role": "user", "content": "hi"}]}) is None
    assert execute(run, ["not", "an", "object"]) is None  # type: ignore[arg-type]
    assert live.counters(run.pk)["dropped_malformed"] == 2


# --- content policy ---------------------------------------------------------------------------

def _text_columns(model: type[models.Model]) -> list[str]:
    return [f.name for f in model._meta.concrete_fields
            if isinstance(f, models.CharField | models.TextField | models.JSONField)]


def rows_containing(needle: str) -> list[str]:
    """Every shadow table's text and JSON columns searched, as stored, for `needle`."""
    found = []
    for model in (ShadowRun, ShadowPair, ShadowJudgement):
        for column in _text_columns(model):
            hits = model.objects.annotate(_t=Cast(column, models.TextField())).filter(
                _t__contains=needle)
            found += [f"{model.__name__}.{column} #{pk}" for pk in hits.values_list(
                "pk", flat=True)]
    return found


def _answer_phrase(sim: SimProcess, request: dict[str, Any]) -> str:
    body = httpx.post(f"{sim.url('p1')}/v1/chat/completions",
                      json={**request, "stream": False}, timeout=30).json()
    words = body["choices"][0]["message"]["content"].split()
    return " ".join(words[:4])


def test_content_off_leaves_no_prompt_or_answer_text_in_any_shadow_column(
        shadow_world: World, shadow_sim):
    # The search finds text where it is stored: a run keeping it all...
    plan = shadow_world.plan()
    full = start(shadow_world, plan)
    kept = chat(6, "MARKER-kept-7f3a", max_tokens=16)
    assert execute(full, kept) is not None
    assert rows_containing("MARKER-kept-7f3a")
    assert rows_containing(_answer_phrase(shadow_sim, kept))
    services.run_stop(actor=shadow_world.actor("oncall"), run=full, reason="next")
    # ...and none of a run with content off, whatever the pair found.
    shadow_world.candidate = point(shadow_world.candidate, shadow_sim.url("regressed"))
    off = start(shadow_world, plan, content="off", min_pairs=10)
    secret = [chat(i, "MARKER-off-91c2", max_tokens=40, logprobs=True, top_logprobs=2)
              for i in range(8)]
    pairs = [execute(off, request) for request in secret]
    assert all(p is not None for p in pairs)
    assert any(p.signal_diverged for p in pairs if p)  # divergent tokens existed
    services.run_judge(run=off)
    assert rows_containing("MARKER-off-91c2") == []
    for request in secret:
        assert rows_containing(_answer_phrase(shadow_sim, request)) == []
    for pair in ShadowPair.objects.filter(run=off):
        assert pair.content == {}
        assert "token_a" not in pair.signal and "token_b" not in pair.noise
        assert set(pair.params) >= {"model", "max_tokens", "messages"}
        assert pair.params["messages"] == 1


def test_content_redacted_masks_what_identifies_a_person(shadow_world: World):
    run = start(shadow_world, content="redacted")
    pair = execute(run, chat(7, "mail ada@example.com or call +44 20 7946 0958"))
    assert pair is not None
    assert pair.content["prompt"][0]["content"] == "question 7 mail «email» or call «phone»"
    assert rows_containing("ada@example.com") == []
