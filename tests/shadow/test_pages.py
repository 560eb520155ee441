"""The Shadow dashboard: the runs list, the run page (live counters and judgement blocks for
htmx, the chart's data, the per-metric table, the most divergent pairs side by side with the
first divergent token marked and every text escaped), the forms that start, adjust and stop
a run (bad input and refusals shown on the form, nothing changed), and the plan page's
Shadow panel and stage-2 gate action, for a viewer (no buttons) and for people with `jobs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from fleetctl.audit.models import AuditEvent
from fleetctl.core.charts import figure_data
from fleetctl.shadow import live, services
from fleetctl.shadow.charts import MARGIN_COLOUR, MOST_POINTS, divergence_figure, thin
from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun
from fleetctl.shadow.views import mark_first_divergence
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.shadow.test_pair import (  # noqa: F401 - fixtures
    chat,
    execute,
    point,
    shadow_sim,
    shadow_world,
    start,
)

pytestmark = pytest.mark.django_db

XSS = "<script>window.__xss=1</script><img src=x onerror=alert(1)>"


@pytest.fixture(autouse=True)
def _clean_live_state() -> Any:
    """Run ids restart with each test database while this Redis db outlives it: a run's
    counters from an earlier session must not show on this one's page."""
    r = live.client()
    for key in r.scan_iter("fleetctl:shadow:*"):
        r.delete(key)
    yield
    for key in r.scan_iter("fleetctl:shadow:*"):
        r.delete(key)


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def metrics(noise: float, signal: float, lower: float, upper: float, n: int,
            verdict: str) -> dict[str, Any]:
    return {"divergence": {"n": n, "noise_rate": noise, "signal_rate": signal,
                           "estimate": signal - noise, "lower": lower, "upper": upper,
                           "p_value": 0.2, "method": "newcombe", "verdict": verdict,
                           "gated": True},
            "diverged_any": {"n": n, "noise_rate": noise * 2, "signal_rate": signal * 2,
                             "estimate": 2 * (signal - noise), "lower": lower, "upper": upper,
                             "p_value": 0.1, "method": "newcombe", "verdict": "warn",
                             "gated": False}}


PRIMARY = "The capital of France is Paris."
SERIES = [(0.01, 0.02, -0.02, 0.04, "insufficient"), (0.01, 0.015, -0.01, 0.03, "warn"),
          (0.01, 0.018, -0.004, 0.026, "warn")]


def seeded_run(world: World, *, content: str = "full", status: str = "running",  # noqa: F811
               answer: str = PRIMARY, pairs: Sequence[tuple[float, str]] | None = None,
               primary: str = PRIMARY, series: Sequence[tuple[float, float, float, float, str]]
               = SERIES, step_s: float = 60, **fields: Any) -> ShadowRun:
    """A run with pairs ((divergence score, candidate answer); by default one scored 0.4
    answering `answer` and one identical to the primary) and one judgement per `series`
    entry (noise, signal, lower, upper, verdict), `step_s` apart, written as the worker and
    the judge would."""
    plan = world.plan()
    fields = {"verdict": "warn", "summary": "divergence +0.8 points [−0.4, +2.6]",
              "counters": {"received": 40, "sampled": 30, "pairs": 2}, **fields}
    run = ShadowRun.objects.create(
        plan=plan, route=world.route, candidate=world.candidate, primary=world.primary,
        model_id="llama-3.1-8b-instruct", content=content, margin=0.02, status=status,
        created_by="alice", **fields)
    now = timezone.now()
    for i, (score, candidate) in enumerate(pairs or [(0.4, answer), (0.0, primary)]):
        texts = {"prompt": [{"role": "system", "content": "Answer in one sentence."},
                            {"role": "user", "content": "What is the capital of France?"}],
                 "primary": primary, "secondary": primary, "candidate": candidate}
        ShadowPair.objects.create(
            run=run, source="mirror", received_at=now - timedelta(seconds=30 - i),
            request_hash=f"{i:064d}", greedy=True,
            params={"model": "llama-3.1-8b-instruct", "temperature": 0},
            sides={side: {"endpoint": f"http://127.0.0.1:9{n}/v1", "status": 200,
                          "finish": "stop", "completion_tokens": 7, "ttft_ms": 12.0 + n,
                          "text_sha256": "ab" * 32}
                   for n, side in enumerate(("primary", "secondary", "candidate"))},
            content=(texts if content != "off" else {}), noise={"diverged": 0},
            signal={"diverged": int(score > 0)}, noise_diverged=False,
            signal_diverged=score > 0, divergence_score=score)
    for i, (noise, signal, lo, hi, verdict) in enumerate(series):
        n = 100 * (i + 1)
        ShadowJudgement.objects.create(
            run=run, at=now - timedelta(seconds=step_s * (len(series) - i)), pairs=n,
            verdict=verdict, metrics=metrics(noise, signal, lo, hi, n, verdict))
    return run


# ---- pure pieces ---------------------------------------------------------------------------------

def test_the_first_divergent_token_is_marked_and_everything_around_it_escaped():
    assert mark_first_divergence("Paris is big", "Paris is small") == \
        "Paris is <mark>big</mark>"
    assert mark_first_divergence("same text", "same text") == "same text"
    assert mark_first_divergence("a <b>", "a <i>") == "a &lt;<mark>b</mark>&gt;"
    assert mark_first_divergence("cut", "cut short") == \
        'cut<mark class="cut" title="ends here"></mark>'
    assert mark_first_divergence("cut short", "cut") == "cut <mark>short</mark>"
    marked = mark_first_divergence(XSS, "hello")
    assert "<script>" not in marked and "<img" not in marked
    assert "<mark>&lt;</mark>script&gt;" in marked


def test_the_chart_draws_both_rates_the_band_and_the_margin():
    now = timezone.now()
    rows = [ShadowJudgement(at=now + timedelta(seconds=15 * i), pairs=50 * i, verdict="warn",
                            metrics=metrics(0.01, 0.02, -0.01, 0.03, 50 * i, "warn"))
            for i in range(1, 4)]
    rows.insert(0, ShadowJudgement(at=now, pairs=0, verdict="insufficient", metrics={}))
    fig = divergence_figure(rows, margin=0.02)
    by_name = {trace.name: trace for trace in fig.data}
    assert list(by_name["signal (primary vs candidate)"].y) == [2.0, 2.0, 2.0]
    assert list(by_name["noise floor (primary vs secondary)"].y) == [1.0, 1.0, 1.0]
    lower = [t for t in fig.data if t.name == "confidence band" and t.fill == "tonexty"]
    assert len(lower) == 1 and list(lower[0].y) == [-1.0, -1.0, -1.0]
    assert [s.y0 for s in fig.layout.shapes if s.line.color == MARGIN_COLOUR] == [2.0]
    assert set(figure_data(fig)) >= {"data", "layout"}  # JSON for the page


def test_a_long_run_draws_at_most_so_many_judgements_always_with_the_newest():
    ids = list(range(10_000, 10_000 + 5760))  # a day, every 15 s
    picked = thin(ids)
    assert len(picked) == MOST_POINTS and picked == sorted(picked)
    assert picked[0] == ids[0] and picked[-1] == ids[-1]
    assert thin(ids[:10]) == ids[:10]


# ---- the pages, as a viewer and as people who may act --------------------------------------------

def test_the_list_and_the_run_page_for_a_viewer_have_no_buttons(world: World):  # noqa: F811
    run = seeded_run(world)
    live.count(run.pk, received=50, sampled=31, dropped_rate=4, dropped_behind=2, pairs=3,
               pair_errors=1)
    live.add_tokens(run.pk, 1234)
    viewer = signed_in(world.viewer)
    listing = viewer.get("/shadow/").content.decode()
    assert f'data-run="{run.pk}"' in listing and "mi300x-us" in listing and "h200-us" in listing
    assert "mi300x-llama" in listing and "mirror" in listing
    assert viewer.get("/shadow/?status=stopped").content.decode().count("data-run=") == 0

    response = viewer.get(f"/shadow/runs/{run.pk}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'hx-trigger="every 3s"' in page and 'hx-trigger="every 15s"' in page
    assert 'data-plotly-figure="shadow-divergence-data"' in page
    assert 'id="shadow-divergence-data" type="application/json"' in page
    assert 'data-metric="divergence"' in page and "newcombe" in page
    assert "+0.80" in page and "[-0.40, +2.60]" in page and "informational" in page
    assert f"/api/v1/shadow-runs/{run.pk}/export/?format=csv" in page
    assert "Paris is <mark>" not in page  # the second pair is identical: nothing marked
    assert "The capital of France is Paris." in page
    assert "system: Answer in one sentence.\nuser: What is the capital of France?" in page
    assert "Stop shadowing" not in page and "Adjust" not in page

    counters = viewer.get(f"/shadow/runs/{run.pk}/", HTTP_HX_REQUEST="true",
                          HTTP_HX_TARGET="shadow-counters").content.decode()
    assert "<html" not in counters and 'id="shadow-counters"' in counters
    assert 'data-drop="dropped_rate"' in counters
    # Redis (50 received) merged with what the judge folded in (40): the live figure wins.
    assert '<span class="tile-value">50</span>' in counters
    assert '<span class="tile-value">1,234</span>' in counters
    judgement = viewer.get(f"/shadow/runs/{run.pk}/", HTTP_HX_REQUEST="true",
                           HTTP_HX_TARGET="shadow-judgement").content.decode()
    assert "<html" not in judgement and 'id="shadow-judgement"' in judgement
    assert "shadow-divergence-data" in judgement
    assert viewer.get("/shadow/runs/999999/").status_code == 404


def test_forged_copies_the_collector_refused_are_shown_with_the_counters_and_answered(
        world: World):  # noqa: F811
    run = seeded_run(world)
    live.count(run.pk, refused_unauthenticated=1200)
    viewer = signed_in(world.viewer)

    counters = viewer.get(f"/shadow/runs/{run.pk}/", HTTP_HX_REQUEST="true",
                          HTTP_HX_TARGET="shadow-counters").content.decode()

    tile = counters.split('data-counter="refused_unauthenticated"', 1)[1].split("</div>", 1)[0]
    assert '<span class="tile-value">1,200</span>' in tile
    assert "refused: not from a gateway of the route" in tile
    answer = viewer.get(f"/api/v1/shadow-runs/{run.pk}/").json()
    assert answer["counters"]["refused_unauthenticated"] == 1200


def test_a_stopped_run_stops_polling_and_says_why(world: World):  # noqa: F811
    run = seeded_run(world, status="stopped", stop_reason="candidate diverging <b>bad</b>")
    page = signed_in(world.lead).get(f"/shadow/runs/{run.pk}/").content.decode()
    assert "hx-trigger" not in page
    assert "candidate diverging &lt;b&gt;bad&lt;/b&gt;" in page
    assert "Stop shadowing" not in page  # nothing left to stop


def test_an_answer_holding_script_renders_inert(world: World):  # noqa: F811
    run = seeded_run(world, answer=f"The capital {XSS} is Paris.")
    ShadowPair.objects.filter(run=run).update(
        content={"prompt": XSS, "primary": "The capital of France is Paris.",
                 "secondary": XSS, "candidate": f"The capital {XSS}"},
        sides={"primary": {"endpoint": XSS, "error": XSS, "status": 500}})
    page = signed_in(world.lead).get(f"/shadow/runs/{run.pk}/").content.decode()
    assert "<script>window" not in page and "<img src=x" not in page
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page
    assert "The capital <mark>&lt;</mark>script&gt;" in page  # marked, still escaped


def test_content_off_says_so_and_haproxy_gateways_are_named(world: World):  # noqa: F811
    run = seeded_run(world, content="off", gateways_without_mirror=["haproxy-edge"])
    page = signed_in(world.viewer).get(f"/shadow/runs/{run.pk}/").content.decode()
    assert "Content storage is off: metrics and hashes only" in page
    assert "The capital of France" not in page
    assert ("HAProxy cannot mirror: these gateways&#x27; traffic is not sampled; use a "
            "replay run.") in page
    assert "<code>haproxy-edge</code>" in page


def test_the_run_page_shows_stop_and_adjust_to_people_with_jobs(world: World):  # noqa: F811
    run = seeded_run(world)
    for who in (world.oncall, world.lead):
        page = signed_in(who).get(f"/shadow/runs/{run.pk}/").content.decode()
        assert f'action="/shadow/runs/{run.pk}/stop/"' in page
        assert f'action="/shadow/runs/{run.pk}/adjust/"' in page


# ---- the forms: start, stop, adjust --------------------------------------------------------------

def start_data(world: World, **overrides: Any) -> dict[str, Any]:  # noqa: F811
    data = {"mode": "mirror", "route": world.route.name, "trace": "", "content": "redacted",
            "sample_percent": "10", "max_rps": "2", "max_tokens_per_day": "2000000",
            "retention_hours": "168", "min_pairs": "200"}
    data.update(overrides)
    return data


def test_starting_from_the_form_refuses_bad_input_on_the_form_and_stores_nothing(
        world: World):  # noqa: F811
    plan = world.plan()
    lead = signed_in(world.lead)
    form = lead.get(f"/shadow/plans/{plan.name}/start/")
    assert form.status_code == 200 and "Start shadowing" in form.content.decode()
    for data, message in [
        (start_data(world, sample_percent="0"), "greater than or equal to 0.01"),
        (start_data(world, sample_percent="abc"), "Enter a number."),
        (start_data(world, route="nope"), "Select a valid choice"),
        (start_data(world, max_tokens_per_day="10"), "greater than or equal to 1000"),
        (start_data(world, mode="replay", route=""), "trace"),
    ]:
        refused = lead.post(f"/shadow/plans/{plan.name}/start/", data)
        assert refused.status_code == 400, (data, refused.content.decode()[:300])
        assert message in refused.content.decode(), message
    assert not ShadowRun.objects.exists()
    assert lead.post("/shadow/plans/nope/start/", start_data(world)).status_code == 404


def test_a_viewer_is_refused_on_the_form_and_nothing_starts(world: World):  # noqa: F811
    plan = world.plan()
    refused = signed_in(world.viewer).post(f"/shadow/plans/{plan.name}/start/",
                                           start_data(world))
    assert refused.status_code == 403
    assert 'class="form-errors"' in refused.content.decode()
    assert not ShadowRun.objects.exists()


def test_start_then_a_second_start_is_refused_then_adjust_then_stop(
        world: World, django_capture_on_commit_callbacks: Any):  # noqa: F811
    plan = world.plan()
    lead = signed_in(world.lead)
    with django_capture_on_commit_callbacks(execute=True):  # the run is published on commit
        started = lead.post(f"/shadow/plans/{plan.name}/start/",
                            start_data(world, sample_percent="25", content="off"))
    run = ShadowRun.objects.get()
    assert started.status_code == 302 and started["Location"] == f"/shadow/runs/{run.pk}/"
    assert (run.status, run.sample_percent, run.content) == ("running", 25.0, "off")
    assert (run.candidate, run.primary, run.route) == (world.candidate, world.primary,
                                                       world.route)
    assert live.published()[world.route.name].run == run.pk

    again = lead.post(f"/shadow/plans/{plan.name}/start/", start_data(world))
    # One running run per plan: refused on the form, nothing stored.
    assert again.status_code == 409 and 'class="form-errors"' in again.content.decode()
    assert "is still running; stop it first." in again.content.decode()
    assert ShadowRun.objects.count() == 1

    bad = lead.post(f"/shadow/runs/{run.pk}/adjust/", {"sample_percent": "500"})
    assert bad.status_code == 400 and "less than or equal to 100" in bad.content.decode()
    nothing = lead.post(f"/shadow/runs/{run.pk}/adjust/", {})
    assert nothing.status_code == 400 and "Change at least one" in nothing.content.decode()
    refused = signed_in(world.viewer).post(f"/shadow/runs/{run.pk}/adjust/", {"max_rps": "9"})
    assert refused.status_code == 403
    run.refresh_from_db()
    assert (run.sample_percent, run.max_rps) == (25.0, 2.0)
    adjusted = lead.post(f"/shadow/runs/{run.pk}/adjust/", {"max_rps": "5"})
    assert adjusted.status_code == 302
    run.refresh_from_db()
    assert (run.sample_percent, run.max_rps) == (25.0, 5.0)

    no_reason = signed_in(world.oncall).post(f"/shadow/runs/{run.pk}/stop/", {"reason": " "})
    assert no_reason.status_code == 400 and "This field is required." in \
        no_reason.content.decode()
    viewer = signed_in(world.viewer).post(f"/shadow/runs/{run.pk}/stop/", {"reason": "x"})
    assert viewer.status_code == 403 and 'class="form-errors"' in viewer.content.decode()
    run.refresh_from_db()
    assert run.running and world.route.name in live.published()
    assert AuditEvent.objects.filter(outcome="denied", actor="vic").exists()

    stopped = signed_in(world.oncall).post(
        f"/shadow/runs/{run.pk}/stop/",
        {"reason": "candidate diverging", "next": "https://evil.example/"})
    # Only a local `next` is followed.
    assert stopped.status_code == 302 and stopped["Location"] == f"/shadow/runs/{run.pk}/"
    run.refresh_from_db()
    assert run.status == "stopped" and "candidate diverging" in run.stop_reason
    assert world.route.name not in live.published()
    twice = signed_in(world.oncall).post(f"/shadow/runs/{run.pk}/stop/", {"reason": "again"})
    assert twice.status_code == 409 and "already" in twice.content.decode()


# ---- the plan page -------------------------------------------------------------------------------

def test_the_plan_panel_and_the_stage_2_gate_action(world: World):  # noqa: F811
    plan = world.plan()
    viewer_page = signed_in(world.viewer).get(f"/plans/{plan.name}/").content.decode()
    assert 'id="shadow-title"' in viewer_page and "No shadow run for this plan yet" in \
        viewer_page
    assert f'action="/shadow/plans/{plan.name}/start/"' not in viewer_page
    lead_page = signed_in(world.lead).get(f"/plans/{plan.name}/").content.decode()
    assert f'action="/shadow/plans/{plan.name}/start/"' in lead_page
    gate = signed_in(world.lead).get(f"/plans/{plan.name}/?stage=2").content.decode()
    assert 'class="shadow-action small"' in gate
    assert f'href="/shadow/plans/{plan.name}/start/">Start shadowing</a>' in gate

    ShadowRun.objects.create(
        plan=plan, route=world.route, candidate=world.candidate, primary=world.primary,
        model_id="llama-3.1-8b-instruct", margin=0.02, created_by="alice", verdict="pass",
        counters={"received": 12, "sampled": 9, "pairs": 8})
    run = ShadowRun.objects.get()
    live.count(run.pk, received=20)
    oncall_page = signed_in(world.oncall).get(f"/plans/{plan.name}/").content.decode()
    assert f'action="/shadow/runs/{run.pk}/stop/"' in oncall_page
    assert f'href="/shadow/runs/{run.pk}/"' in oncall_page
    assert "<dt>received</dt><dd>20</dd>" in oncall_page
    assert f'action="/shadow/plans/{plan.name}/start/"' not in oncall_page  # one at a time
    gate = signed_in(world.oncall).get(f"/plans/{plan.name}/?stage=2").content.decode()
    assert f"Shadowing now: <a href=\"/shadow/runs/{run.pk}/\">run {run.pk}</a>" in gate
    viewer_page = signed_in(world.viewer).get(f"/plans/{plan.name}/").content.decode()
    assert f'action="/shadow/runs/{run.pk}/stop/"' not in viewer_page

    # Stop in one action from the panel: back on the plan page, which offers a new start.
    stopped = signed_in(world.oncall).post(
        f"/shadow/runs/{run.pk}/stop/", {"reason": "spend", "next": f"/plans/{plan.name}/"})
    assert stopped.status_code == 302 and stopped["Location"] == f"/plans/{plan.name}/"
    after = signed_in(world.oncall).get(f"/plans/{plan.name}/").content.decode()
    assert 'data-status="stopped"' in after
    assert f'action="/shadow/plans/{plan.name}/start/"' in after


# ---- the page over pairs the real pipeline made -----------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("content", ["full", "off"])
def test_the_run_page_over_real_pairs_marks_the_token_compare_found(
        shadow_world: World, shadow_sim: Any, content: str):  # noqa: F811
    """Pairs from services.pair_execute against simulated pools (a candidate that diverges
    on 60 % of prompts) and a judgement from services.run_judge: the page marks, in the
    candidate's answer, the very token compare() named as the first divergent one."""
    shadow_world.candidate = point(shadow_world.candidate, shadow_sim.url("regressed"))
    run = start(shadow_world, content=content, min_pairs=10)
    pairs = [execute(run, chat(i, max_tokens=24)) for i in range(10)]
    services.run_judge(run=run)
    page = signed_in(shadow_world.viewer).get(f"/shadow/runs/{run.pk}/").content.decode()
    assert 'data-plotly-figure="shadow-divergence-data"' in page
    assert 'data-metric="divergence"' in page and 'data-metric="diverged_any"' in page
    # The three sides' speed on the same requests, from the judge's summary of the pairs.
    latency = run.judgements.get().latency
    assert set(latency) == {"primary", "secondary", "candidate"}
    assert latency["candidate"]["latency_ms"]["n"] == 10
    for side in ("primary", "secondary", "candidate"):
        assert f'<tr data-side="{side}">' in page
    diverged = [p for p in pairs if p is not None and p.signal_diverged]
    assert diverged
    if content == "off":
        assert "Content storage is off: metrics and hashes only" in page
        assert "<mark>" not in page and "question 1" not in page
        return
    assert "user: question" in page
    tokens = [(p, p.signal["token_b"]) for p in diverged if p.signal.get("token_b")]
    assert tokens
    for pair, token in tokens:
        marked = mark_first_divergence(pair.content["candidate"], pair.content["primary"])
        assert f"<mark>{escape(token)}</mark>" in marked, (token, marked)
    top = max(diverged, key=lambda p: p.divergence_score)
    assert mark_first_divergence(top.content["candidate"], top.content["primary"]) in page
