"""The Evals dashboard: the runs list, the suites (upload with line-numbered errors on the
form and nothing stored, items by tag, download, retire with a confirmation), the new-run
form (prefilled from the plan page's link; refusals on the form, nothing stored), the run
page (progress while it runs, each pool's score and the paired difference with their
intervals and the margin, the per-tag table with regressed tags marked, the item diff side by
side with its filters and export links, every answer escaped), and the plan page's Evals
panel and gate actions — for a viewer (no buttons, refused writes) and people with `jobs`.

Runs here are made by the real services and finished by the real run_finish (statistics,
evidence); only the worker's answers are written directly, as the runner would write them.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.evals import charts, selectors, services
from fleetctl.evals.models import EvalResult, EvalRun, EvalSuite
from migrations_plan.models import Evidence, Plan
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db

XSS = "<script>window.__xss=1</script><img src=x onerror=alert(1)>"
SYSTEM = Actor.for_system("eval-pages-test")


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def suite_lines(n: int, *, tags: Sequence[str] = ("arithmetic", "format")) -> bytes:
    header = {"fleetctl_eval_suite": 1, "description": "pages test",
              "decoding": {"temperature": 0, "seed": 1, "max_tokens": 32}}
    lines = [json.dumps(header)]
    for i in range(n):
        tag = tags[i % len(tags)]
        lines.append(json.dumps({
            "id": f"item-{i:04d}", "messages": [{"role": "user", "content": f"What is {i}+1?"}],
            "references": [str(i + 1)], "scorer": "numeric", "tags": [tag, f"n:{i % 3}"]}))
    return ("\n".join(lines) + "\n").encode()


def make_suite(name: str = "pages-suite", n: int = 120) -> EvalSuite:
    suite, created = services.suite_upload(actor=SYSTEM, name=name,
                                           fileobj=io.BytesIO(suite_lines(n)))
    assert created
    return suite


def finished_run(world: World, plan: Plan | None = None, *,  # noqa: F811
                 candidate_wrong: Sequence[int] = range(0, 120, 4),
                 primary_wrong: Sequence[int] = (1, 2), answer: str = "",
                 finish: bool = True, suite: EvalSuite | None = None) -> EvalRun:
    """A run of the suite on the world's candidate and primary, every row answered as the
    runner would write it (the candidate wrong on `candidate_wrong`, the primary on
    `primary_wrong`), then finished by the service."""
    suite = suite or make_suite()
    lead = world.actor("lead")
    run = services.run_create(actor=lead, suite=suite, candidate=world.candidate,
                              primary=world.primary, plan=plan, min_items=20)
    EvalRun.objects.filter(pk=run.pk).update(status=EvalRun.Status.RUNNING,
                                             started_at=timezone.now())
    now = timezone.now()
    for result in EvalResult.objects.filter(run=run).select_related("run_pool", "item"):
        index = result.item.position
        wrong = index in (candidate_wrong if result.run_pool.role == "candidate"
                          else primary_wrong)
        result.status = EvalResult.Status.DONE
        result.text = answer or (f"The answer is {index + 7}." if wrong
                                 else f"The answer is {index + 1}.")
        result.score = 0.0 if wrong else 1.0
        result.reason = (f"{index + 7} is not {index + 1}" if wrong else "matches")
        result.http_status = 200
        result.scored_at = now
        result.save()
    EvalRun.objects.filter(pk=run.pk).update(done=run.total)
    run = EvalRun.objects.get(pk=run.pk)
    return services.run_finish(run) if finish else run


# ---- pure pieces ---------------------------------------------------------------------------------

def test_the_charts_draw_each_pool_with_its_interval_and_the_margin():
    pools = {"a": {"n": 100, "score": 0.9, "lower": 0.82, "upper": 0.95, "method": "wilson"},
             "b": {"n": 100, "score": 0.8, "lower": 0.71, "upper": 0.87, "method": "wilson"}}
    fig = charts.scores_figure(pools, [("a", "candidate"), ("b", "primary"), ("c", "other")])
    [bars] = fig.data
    assert list(bars.x) == [90.0, 80.0]  # the pool without a score is left out
    assert [round(v, 3) for v in bars.error_x.array] == [5.0, 7.0]
    assert [round(v, 3) for v in bars.error_x.arrayminus] == [8.0, 9.0]
    paired = {"n": 100, "estimate": -0.03, "lower": -0.05, "upper": -0.01, "verdict": "warn"}
    tags = {"y": {"paired": {"estimate": 0.0, "lower": -0.01, "upper": 0.01}},
            "x": {"paired": {"estimate": -0.1, "lower": -0.2, "upper": -0.05},
                  "regressed": True}}
    fig = charts.difference_figure(paired, margin=0.02, tags=tags)
    [points] = fig.data
    assert list(points.y) == ["all items", "tag x", "tag y"]  # worst tag first
    red, blue = charts.MARGIN_COLOUR, charts.CANDIDATE_COLOUR
    assert list(points.marker.color) == [blue, red, blue]  # warn run; regressed tag
    assert [s.x0 for s in fig.layout.shapes if s.line.color == charts.MARGIN_COLOUR] == [-2.0]


# ---- pages render ------------------------------------------------------------------------------

def test_every_page_renders_for_a_viewer_without_buttons(world: World):  # noqa: F811
    plan = world.plan()
    run = finished_run(world, plan)
    viewer = signed_in(world.viewer)
    home = viewer.get("/evals/").content.decode()
    assert f'href="/evals/runs/{run.pk}/"' in home and 'href="/evals/suites/"' in home
    assert "New run" not in home
    suites = viewer.get("/evals/suites/").content.decode()
    assert "pages-suite" in suites and run.suite.sha256[:12] in suites
    assert "Uploading a suite needs the <code>jobs</code> permission" in suites
    detail = viewer.get(f"/evals/suites/{run.suite.pk}/").content.decode()
    assert "item-0000" in detail and "Retire" not in detail
    page = viewer.get(f"/evals/runs/{run.pk}/").content.decode()
    assert "Cancel run" not in page
    new = viewer.get("/evals/runs/new/").content.decode()
    assert "Starting a run needs the <code>jobs</code> permission" in new
    plan_page = viewer.get(f"/plans/{plan.name}/?stage=2").content.decode()
    assert 'id="evals"' in plan_page and "Run the stage&#x27;s eval" not in plan_page
    nav = viewer.get("/").content.decode()
    assert 'href="/evals/"' in nav
    assert viewer.get("/evals/runs/999999/").status_code == 404
    assert viewer.get("/evals/suites/999999/").status_code == 404


def test_the_runs_list_filters_by_plan_and_status(world: World):  # noqa: F811
    plan = world.plan()
    run = finished_run(world, plan)
    viewer = signed_in(world.viewer)
    assert f'data-run="{run.pk}"' in viewer.get(f"/evals/?plan={plan.name}").content.decode()
    assert f'data-run="{run.pk}"' not in viewer.get("/evals/?plan=other").content.decode()
    assert f'data-run="{run.pk}"' in viewer.get("/evals/?status=complete").content.decode()
    assert f'data-run="{run.pk}"' not in viewer.get("/evals/?status=running").content.decode()
    bad = viewer.get("/evals/?status=nope").content.decode()
    assert "Select a valid choice" in bad and f'data-run="{run.pk}"' not in bad


def test_the_run_page_shows_scores_the_difference_the_tags_and_the_pins(
        world: World):  # noqa: F811
    plan = world.plan()
    run = finished_run(world, plan)
    assert run.status == "complete" and run.verdict and run.stats["pools"]
    page = signed_in(world.viewer).get(f"/evals/runs/{run.pk}/").content.decode()
    assert "hx-trigger" not in page  # finished: no polling
    assert 'data-plotly-figure="eval-scores-data"' in page
    assert 'data-plotly-figure="eval-difference-data"' in page
    assert f'data-verdict="{run.verdict}"' in page
    assert run.suite_sha256 in page and run.suite.label in page
    assert "Pools' fingerprints and endpoints" in page
    # Candidate wrong on every 4th item (30), primary on 2: a clear drop, tag by tag.
    paired = run.stats["paired"]
    assert paired["n"] == 120
    assert 'class="eval-estimate"' in page
    regressed = [t for t, info in run.stats["tags"].items() if info.get("regressed")]
    for tag in regressed:
        assert f'data-tag="{tag}" class="check-fail eval-regressed" data-regressed="true"' in page
    # The evidence it recorded, linked to the gate that reads it.
    assert run.evidence_id and Evidence.objects.filter(pk=run.evidence_id).exists()
    assert f'href="/plans/{plan.name}/?stage=2#gate"' in page
    # The diff: 30 items the candidate lost, 2 it won (the primary lost), side by side.
    assert "30 regressed · 2 improved" in page
    assert page.count('class="eval-diff-item"') == 20  # one page
    assert f"/api/v1/eval-runs/{run.pk}/export/?format=json" in page
    assert f"/api/v1/eval-runs/{run.pk}/export/?format=csv" in page


def test_the_item_diff_filters_by_direction_tag_and_text(world: World):  # noqa: F811
    run = finished_run(world)
    client = signed_in(world.viewer)
    assert selectors.diff(run).count() == 32
    assert selectors.diff(run, direction="regressed").count() == 30
    improved = client.get(f"/evals/runs/{run.pk}/?direction=improved").content.decode()
    assert improved.count('class="eval-diff-item"') == 2
    assert 'data-item="item-0001" data-direction="improved"' in improved
    assert "candidate right, primary wrong" in improved
    tagged = client.get(f"/evals/runs/{run.pk}/?direction=regressed&tag=arithmetic"
                        ).content.decode()
    assert tagged.count('class="eval-diff-item"') == 20  # 30 regressions (even items), page 1
    fmt = client.get(f"/evals/runs/{run.pk}/?tag=format").content.decode()
    assert fmt.count('class="eval-diff-item"') == 1 and 'data-item="item-0001"' in fmt
    assert "export/?format=csv&amp;direction=regressed&amp;tag=arithmetic" in tagged
    found = client.get(f"/evals/runs/{run.pk}/?q=What+is+8%2B1").content.decode()
    assert found.count('class="eval-diff-item"') == 1 and 'data-item="item-0008"' in found
    assert client.get(f"/evals/runs/{run.pk}/?direction=regressed&page=2").content.decode(
        ).count('class="eval-diff-item"') == 10
    # The export links answer with the same items (the REST export, same filters).
    exported = client.get(f"/api/v1/eval-runs/{run.pk}/export/?format=csv"
                          "&direction=regressed&tag=arithmetic")
    assert exported.status_code == 200
    body = b"".join(exported.streaming_content) if exported.streaming else exported.content
    assert len(body.decode().strip().splitlines()) == 1 + 30  # every page, not only one
    assert client.get(f"/api/v1/eval-runs/{run.pk}/export/?format=json").status_code == 200
    bad = client.get(f"/evals/runs/{run.pk}/?tag=nope").content.decode()
    assert "Select a valid choice" in bad and 'class="eval-diff-item"' not in bad


def test_a_running_run_polls_shows_progress_and_offers_cancel(world: World):  # noqa: F811
    run = finished_run(world, finish=False)
    EvalResult.objects.filter(run=run, item__position__gte=60).update(
        status=EvalResult.Status.PENDING, score=None, text="")
    EvalRun.objects.filter(pk=run.pk).update(done=120)
    oncall = signed_in(world.oncall)
    page = oncall.get(f"/evals/runs/{run.pk}/").content.decode()
    assert 'hx-trigger="every 3s"' in page
    assert 'role="progressbar"' in page and "120 / 240 (50 %)" in page
    assert "Cancel run" in page and "eval-scores-data" not in page
    live = oncall.get(f"/evals/runs/{run.pk}/", HTTP_HX_REQUEST="true",
                      HTTP_HX_TARGET="eval-live").content.decode()
    assert live.startswith('<div id="eval-live"') or 'id="eval-live"' in live[:200]
    assert "<html" not in live
    assert not oncall.get(f"/evals/runs/{run.pk}/", HTTP_HX_REQUEST="true",
                          HTTP_HX_TARGET="eval-live").has_header("HX-Refresh")
    # A viewer cannot cancel: refused, and the run goes on.
    signed_in(world.viewer).post(f"/evals/runs/{run.pk}/cancel/")
    assert EvalRun.objects.get(pk=run.pk).status == "running"
    response = oncall.post(f"/evals/runs/{run.pk}/cancel/", follow=True)
    assert EvalRun.objects.get(pk=run.pk).status == "cancelled"
    assert f"Cancelled eval run {run.pk}" in response.content.decode()
    ended = oncall.get(f"/evals/runs/{run.pk}/", HTTP_HX_REQUEST="true",
                       HTTP_HX_TARGET="eval-live")
    assert ended["HX-Refresh"] == "true"  # the page reloads once, with the whole diff
    after = oncall.get(f"/evals/runs/{run.pk}/").content.decode()
    assert "hx-trigger" not in after and "Cancel run" not in after


def test_every_answer_and_prompt_is_escaped(world: World):  # noqa: F811
    suite, _ = services.suite_upload(actor=SYSTEM, name="xss-suite", fileobj=io.BytesIO(
        (json.dumps({"id": "x-1", "prompt": XSS, "references": ["1"], "scorer": "numeric",
                     "tags": ["t"]}) + "\n").encode()), description=XSS)
    run = finished_run(world, suite=suite, candidate_wrong=[0], primary_wrong=[],
                       answer=XSS)
    EvalResult.objects.filter(run=run).update(reason=XSS[:300], error=XSS[:300])
    for url in (f"/evals/runs/{run.pk}/", f"/evals/suites/{suite.pk}/", "/evals/suites/",
                "/evals/"):
        page = signed_in(world.lead).get(url).content.decode()
        assert "<script>window" not in page and "<img src=x" not in page, url
    page = signed_in(world.lead).get(f"/evals/runs/{run.pk}/").content.decode()
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page


# ---- suites: upload, download, retire ------------------------------------------------------------

def test_a_suite_upload_with_bad_lines_names_them_on_the_form_and_stores_nothing(
        world: World):  # noqa: F811
    lead = signed_in(world.lead)
    good = json.dumps({"id": "a", "prompt": "1+1?", "references": ["2"], "scorer": "numeric"})
    bad = "\n".join([good, "{not json", json.dumps({"id": "b", "prompt": "x",
                                                   "references": ["2"], "scorer": "nope"}),
                     json.dumps({"id": "a", "prompt": "again", "references": ["2"],
                                 "scorer": "numeric"})]).encode()
    response = lead.post("/evals/suites/", {
        "name": "bad-suite", "file": io.BytesIO(bad)}, format="multipart")
    page = response.content.decode()
    assert response.status_code == 400
    for line in ("line 2", "line 3", "line 4"):
        assert line in page, line
    response = lead.post("/evals/suites/", {"name": "Bad Name!",
                                            "file": io.BytesIO(good.encode())})
    assert response.status_code == 400 and "slug" in response.content.decode().lower()
    response = lead.post("/evals/suites/", {"name": "no-file"})
    assert response.status_code == 400 and "This field is required" in response.content.decode()
    assert not EvalSuite.objects.exists()


def test_uploading_downloading_and_uploading_again(world: World):  # noqa: F811
    lead = signed_in(world.lead)
    upload = io.BytesIO(suite_lines(10))
    upload.name = "suite.jsonl"
    response = lead.post("/evals/suites/", {"name": "mine", "description": "d", "file": upload},
                         follow=True)
    suite = EvalSuite.objects.get(name="mine")
    assert response.redirect_chain[-1][0] == f"/evals/suites/{suite.pk}/"
    assert "Stored suite mine v1: 10 items" in response.content.decode()
    download = lead.get(f"/evals/suites/{suite.pk}/download/")
    body = b"".join(download.streaming_content) if download.streaming else download.content
    assert download["Content-Type"].startswith("application/x-ndjson")
    import hashlib
    assert hashlib.sha256(body).hexdigest() == suite.sha256
    again = io.BytesIO(body)
    again.name = "again.jsonl"
    response = lead.post("/evals/suites/", {"name": "mine", "file": again}, follow=True)
    assert "already has exactly this content" in response.content.decode()
    assert EvalSuite.objects.filter(name="mine").count() == 1
    tagged = lead.get(f"/evals/suites/{suite.pk}/?tag=format").content.decode()
    assert tagged.count('data-item="item-') == 5


def test_retiring_asks_for_confirmation_and_a_viewer_cannot(world: World):  # noqa: F811
    suite = make_suite()
    viewer = signed_in(world.viewer)
    assert viewer.post(f"/evals/suites/{suite.pk}/retire/", {"confirm": "on"}).status_code \
        == 403
    lead = signed_in(world.lead)
    unconfirmed = lead.post(f"/evals/suites/{suite.pk}/retire/", {})
    assert unconfirmed.status_code == 400
    assert "Tick the box to confirm" in unconfirmed.content.decode()
    assert not EvalSuite.objects.get(pk=suite.pk).retired
    response = lead.post(f"/evals/suites/{suite.pk}/retire/", {"confirm": "on"}, follow=True)
    assert EvalSuite.objects.get(pk=suite.pk).retired
    assert "Retired pages-suite v1" in response.content.decode()
    viewer_upload = viewer.post("/evals/suites/", {"name": "v", "file": io.BytesIO(
        suite_lines(2))})
    assert viewer_upload.status_code == 403 and not EvalSuite.objects.filter(name="v").exists()


# ---- starting a run ----------------------------------------------------------------------------

def test_the_new_run_form_is_prefilled_from_the_plan_link(world: World):  # noqa: F811
    plan = world.plan(quality_margin_pct=3)
    core = make_suite("fleetctl-core")
    make_suite("other")
    page = signed_in(world.lead).get(
        f"/evals/runs/new/?plan={plan.name}&candidate={world.candidate.name}"
        f"&primary={world.primary.name}&suite=fleetctl-core").content.decode()
    assert f'<option value="{core.pk}" selected>' in page
    assert f'<option value="{plan.name}" selected>' in page
    assert f'<option value="{world.candidate.name}" selected>' in page
    assert f'<option value="{world.primary.name}" selected>' in page
    assert 'name="margin_pct" value="3' in page


def test_starting_a_run_from_the_form_and_its_refusals(world: World):  # noqa: F811
    plan = world.plan()
    suite = make_suite("fleetctl-core")
    lead = signed_in(world.lead)
    base = {"suite": suite.pk, "plan": plan.name, "candidate": world.candidate.name,
            "primary": world.primary.name, "model": "", "concurrency": 16, "max_rps": "",
            "timeout_s": 120, "max_attempts": 3, "confidence": 0.95, "min_items": 100,
            "margin_pct": ""}
    for data, message in [
        ({**base, "concurrency": 0}, "greater than or equal to 1"),
        ({**base, "candidate": "nope"}, "Select a valid choice"),
        ({**base, "plan": "", "candidate": ""}, "Choose the candidate pool"),
        ({**base, "model": "not-served-model"}, world.candidate.name),
        ({**base, "primary": world.candidate.name}, ""),
        ({**base, "margin_pct": "5"}, "a run for the plan is judged with it"),
    ]:
        refused = lead.post("/evals/runs/new/", data)
        assert refused.status_code == 400, (data, refused.content.decode()[:300])
        assert message in refused.content.decode(), message
        assert 'class="form-errors"' in refused.content.decode() or "errorlist" in \
            refused.content.decode()
    assert not EvalRun.objects.exists()
    assert signed_in(world.viewer).post("/evals/runs/new/", base).status_code == 403
    assert not EvalRun.objects.exists()
    response = lead.post("/evals/runs/new/", base, follow=True)
    run = EvalRun.objects.get()
    assert response.redirect_chain[-1][0] == f"/evals/runs/{run.pk}/"
    assert f"Started eval run {run.pk}" in response.content.decode()
    assert run.plan == plan and run.suite == suite and run.total == 2 * suite.item_count
    suite.retired_at = timezone.now()
    suite.save()
    refused = lead.post("/evals/runs/new/", base)
    assert refused.status_code == 400 and EvalRun.objects.count() == 1


# ---- the plan page -------------------------------------------------------------------------------

def test_the_plan_page_offers_the_stages_eval_and_links_the_run_that_fed_the_check(
        world: World):  # noqa: F811
    plan = world.plan()
    lead = signed_in(world.lead)
    page = lead.get(f"/plans/{plan.name}/?stage=2").content.decode()
    new_url = (f"/evals/runs/new/?plan={plan.name}&amp;candidate={world.candidate.name}"
               f"&amp;primary={world.primary.name}&amp;suite=fleetctl-core")
    assert page.count(f'href="{new_url}"') == 2  # the panel and the eval check
    assert "No eval run for this plan yet" in page
    run = finished_run(world, plan)
    page = lead.get(f"/plans/{plan.name}/?stage=2").content.decode()
    assert f'class="eval-fed" href="/evals/runs/{run.pk}/"' in page
    assert f'data-run="{run.pk}"' in page  # the panel's list, with its verdict
    # Stage 4's quality check reads live traffic (a stage-4 shadow run), never an eval run:
    # no eval panel and no eval button on it.
    stage4 = lead.get(f"/plans/{plan.name}/?stage=4").content.decode()
    quality = stage4[stage4.index('data-check="quality"'):]
    quality = quality[:quality.index("</tr>")]
    assert 'class="eval-fed"' not in quality and "eval-run-stage" not in quality
    assert "Quality unchanged on live traffic (shadow of live requests)" in quality
