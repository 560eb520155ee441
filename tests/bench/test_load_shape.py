"""How a fixed-concurrency level loads the server: its streams start staggered over a ramp
(seeded, recorded per stream, shown on the run page), the steady-state window starts only
once every stream is running, every endpoint of a pool is driven, and the defaults and the
ramp's bad values. Against a real simulator (two pools of it = two endpoints on two ports)
and, end to end, a real Celery worker."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from django.test import Client

from fleetctl.bench import runner, services
from fleetctl.bench.forms import RunForm
from fleetctl.bench.models import Level, Run, Sample, ShardPart
from fleetctl.bench.runner import Endpoint, LevelPlan, run_level, stagger_offsets
from tests.bench.helpers import MODEL, SLO, serving, small_trace
from tests.cli.test_cli import run as cli
from tests.sim.simproc import SimProcess
from tests.support.waiting import wait_until

from .conftest import Row

TRACE = [Row(prompt_tokens=100, completion_tokens=12), Row(80, 16)]


# ---- the runner ---------------------------------------------------------------------------------


def test_stagger_offsets_are_spread_over_the_ramp_seeded_and_reproducible() -> None:
    offsets = stagger_offsets(8, 4.0, seed=42)
    assert offsets == stagger_offsets(8, 4.0, seed=42)
    assert offsets != stagger_offsets(8, 4.0, seed=43)
    for k, t in enumerate(offsets):  # stream k inside its own slot of the ramp
        assert k * 0.5 <= t < (k + 1) * 0.5
    assert len(set(offsets)) == 8
    assert stagger_offsets(3, 0.0) == [0.0, 0.0, 0.0]  # no ramp: all at once, as asked
    with pytest.raises(ValueError):
        stagger_offsets(0, 1.0)


@pytest.mark.slow
def test_streams_start_staggered_and_every_start_is_recorded(bench_sim: SimProcess) -> None:
    plan = LevelPlan(warmup_s=1.0, window_s=0.6, min_samples=4, max_duration_s=20.0,
                     request_timeout_s=10.0, ramp_s=0.8)
    level = asyncio.run(run_level(Endpoint(bench_sim.url("paced"), MODEL), TRACE, plan,
                                  concurrency=8, request_id_prefix="stagger"))
    starts = level.stream_starts
    assert [s for s, _t, _e in starts] == list(range(8))
    times = [t for _s, t, _e in starts]
    assert len(set(times)) == 8 and min(times) < 0.1 and max(times) > 0.6  # spread, not 0s
    assert max(times) < plan.warmup_s
    planned = stagger_offsets(8, 0.8, seed=__import__("zlib").crc32(b"stagger"))
    for (_s, t, _e), want in zip(starts, planned, strict=True):
        assert t >= want - 1e-6  # never before its offset
    first = {}
    for r in sorted(level.results, key=lambda r: r.started_at):
        first.setdefault(r.stream, r)
    assert sorted(first) == list(range(8))
    for stream, _t, _e in starts:  # each stream's first request is the recorded start
        assert first[stream].started_at == pytest.approx(times[stream], abs=0.02)
    assert level.window_start_s == pytest.approx(plan.warmup_s, abs=1e-9)


@pytest.mark.slow
def test_the_window_starts_only_once_the_last_stream_is_running(bench_sim: SimProcess) -> None:
    # A ramp longer than the warm-up: the window must wait for the last stream.
    plan = LevelPlan(warmup_s=0.2, window_s=0.5, min_samples=4, max_duration_s=20.0,
                     request_timeout_s=10.0, ramp_s=1.2)
    level = asyncio.run(run_level(Endpoint(bench_sim.url("paced"), MODEL), TRACE, plan,
                                  concurrency=6, request_id_prefix="late-window"))
    last = max(t for _s, t, _e in level.stream_starts)
    assert last > 0.9
    assert level.window_start_s >= last
    measured = [r for r in level.results if not r.warmup]
    assert measured and all(r.started_at >= last for r in measured)
    assert all(r.warmup for r in level.results if r.started_at < last)


@pytest.mark.slow
def test_every_endpoint_gets_streams_round_robin(bench_sim: SimProcess) -> None:
    urls = [bench_sim.url("paced"), bench_sim.url("flaky")]
    level = asyncio.run(run_level([Endpoint(u, MODEL) for u in urls], TRACE,
                                  LevelPlan(warmup_s=0.3, window_s=0.5, min_samples=4,
                                            max_duration_s=20.0, request_timeout_s=10.0),
                                  concurrency=4, request_id_prefix="two-endpoints"))
    assert level.endpoints == [f"{u}/v1/chat/completions" for u in urls]
    assert [e for _s, _t, e in level.stream_starts] == [0, 1, 0, 1]
    per_endpoint = Counter(r.endpoint for r in level.results if r.status == "ok")
    assert per_endpoint[0] > 0 and per_endpoint[1] > 0
    assert all(r.endpoint == r.stream % 2 for r in level.results)
    # each simulator pool saw exactly the requests sent to it
    for index, url in enumerate(urls):
        seen = {r["request_id"] for r in _ground_truth(url)}
        sent = {r.request_id for r in level.results if r.endpoint == index}
        assert sent <= seen and not ({r.request_id for r in level.results} - sent) & seen


def _ground_truth(url: str) -> list[dict]:
    import httpx

    out, since = [], 0
    while True:
        page = httpx.get(f"{url}/admin/ground-truth",
                         params={"kind": "requests", "since": since, "limit": 500}).json()
        if not page["requests"]:
            return out
        out += page["requests"]
        since = page["next_since"]


# ---- a run, end to end ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_two_endpoint_pool_has_both_driven_and_the_page_shows_starts_and_counts(
    celery_worker, bench_sim, make_pool, system, make_user
):
    urls = [bench_sim.url("paced"), bench_sim.url("faulty")]
    pool = serving(make_pool, "paced", base_urls=urls)
    trace = small_trace()
    run = services.run_create(actor=system, trace=trace, pools=[pool], model_id=MODEL,
                              mode="levels", levels=[4], warmup_s=0.8, window_s=1.5, ramp_s=0.6,
                              min_samples=6, lag_limit_ms=500, shards=2, **SLO)
    wait_until(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s=90,
               what="the run to finish")
    run.refresh_from_db()
    assert run.status == "complete", (run.status, run.error)
    level = Level.objects.get(run=run)
    # two client processes, one ramp: streams 0-1 in shard 0, 2-3 in shard 1
    parts = {p.shard: p for p in ShardPart.objects.filter(level=level)}
    assert [s for s, _t, _e in parts[0].stream_starts] == [0, 1]
    assert [s for s, _t, _e in parts[1].stream_starts] == [2, 3]
    starts = [t for p in parts.values() for _s, t, _e in p.stream_starts]
    assert len(set(starts)) == 4 and max(starts) > 0.3
    assert all(p.window_start_s >= max(t for _s, t, _e in p.stream_starts) for p in
               parts.values())
    by_endpoint = Counter(Sample.objects.filter(level=level).values_list("endpoint", flat=True))
    assert by_endpoint[0] > 0 and by_endpoint[1] > 0
    shape = level.summary["load_shape"]
    assert [e["url"] for e in shape["endpoints"]] == [f"{u}/v1/chat/completions" for u in urls]
    assert all(e["requests"] > 0 and e["ok"] > 0 for e in shape["endpoints"])
    assert sum(e["output_tokens_per_s"] for e in shape["endpoints"]) == pytest.approx(
        level.output_tokens_per_s, rel=1e-6)  # the pool's throughput is both endpoints'
    assert [s["stream"] for s in shape["streams"]] == [0, 1, 2, 3]

    page = Client()
    page.force_login(make_user("viewer", "viewer"))
    html = page.get(f"/bench/runs/{run.pk}/").content.decode()
    assert html.count('class="stream-tick"') == 4
    assert 'class="window-mark"' in html
    for url in urls:
        assert f"{url}/v1/chat/completions" in html
    assert "staggered over 0.6 s" in html


# ---- defaults and bad input ----------------------------------------------------------------


@pytest.mark.django_db
def test_defaults_are_a_longer_warm_up_and_window(client_for, make_pool, settings, tmp_path,
                                                 django_capture_on_commit_callbacks):
    settings.DATA_DIR = tmp_path
    assert (Run().warmup_s, Run().window_s, Run().ramp_s) == (15.0, 60.0, None)
    assert LevelPlan().warmup_s == 15.0 and LevelPlan().window_s == 60.0
    assert LevelPlan().ramp == 7.5 and LevelPlan(warmup_s=10, ramp_s=2).ramp == 2
    form = RunForm()
    assert form.fields["warmup_s"].initial == 15.0 and form.fields["window_s"].initial == 60.0
    serving(make_pool, "paced")
    small_trace()
    with django_capture_on_commit_callbacks(execute=False):
        answer = client_for("on-call").post("/api/v1/bench/runs/", {
            "trace": "short-chat", "pools": ["paced"], "model_id": MODEL, **SLO},
            format="json")
    assert answer.status_code == 202, answer.json()
    body = answer.json()
    assert (body["warmup_s"], body["window_s"], body["ramp_s"]) == (15.0, 60.0, None)
    assert services._plan(Run.objects.get()).ramp == 7.5
    assert runner.LevelPlan(warmup_s=0).ramp == 0.0


@pytest.mark.django_db
@pytest.mark.parametrize(("change", "says"), [
    ({"ramp_s": 20, "warmup_s": 10}, "must fit in the warm-up (10 s)"),
    ({"ramp_s": -1}, "a number from 0 up to the warm-up"),
    ({"ramp_s": "soon"}, "A valid number is required"),
    ({"ramp_s": 1, "timing": "trace", "speeds": [1]}, "Leave it out"),
])
def test_bad_ramps_are_400s_that_name_ramp_s(client_for, make_pool, settings, tmp_path,
                                             change, says):
    settings.DATA_DIR = tmp_path
    serving(make_pool, "paced")
    small_trace()
    answer = client_for("on-call").post("/api/v1/bench/runs/", {
        "trace": "short-chat", "pools": ["paced"], "model_id": MODEL, "mode": "levels",
        "levels": [1], **SLO, **change}, format="json")
    assert answer.status_code == 400, answer.json()
    messages = answer.json()["error"]["fields"]["ramp_s"]
    assert any(says in m for m in messages), messages
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_the_form_refuses_a_ramp_longer_than_the_warm_up_on_the_field(make_user, make_pool,
                                                                       settings, tmp_path):
    settings.DATA_DIR = tmp_path
    serving(make_pool, "paced")
    small_trace()
    page = Client()
    page.force_login(make_user("oncall", "on-call"))
    answer = page.post("/bench/runs/new/", {
        "trace": "short-chat", "pools": ["paced"], "model_id": MODEL, "timing": "concurrency",
        "mode": "levels", "levels": "1, 4", "max_concurrency": "256", "warmup_s": "2",
        "window_s": "5", "ramp_s": "3", "min_samples": "8", "shards": "1",
        "lag_limit_ms": "500", "slo_ttft_p95_ms": "2000", "slo_tpot_p95_ms": "200",
        "slo_error_rate": "0.05"})
    assert answer.status_code == 200  # a form with errors, as every dashboard form answers
    html = answer.content.decode()
    assert "must fit in the warm-up" in html and "Nothing was stored" in html
    assert not Run.objects.exists()


@pytest.mark.slow
def test_the_cli_ramp_flag_refuses_a_negative_or_odd_value(live_server, transactional_db):
    for value, says in (("-1", "give seconds, a number >= 0"), ("nan", "give seconds")):
        bad = cli(live_server, "bench", "run", "--trace", "t", "--pool", "p", "--model", MODEL,
                  "--ttft-p95-ms", "2000", "--tpot-p95-ms", "200", "--error-rate", "0.05",
                  "--ramp-s", value, token="unused")
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr
