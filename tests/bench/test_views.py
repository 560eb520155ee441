"""The benchmarks dashboard through Django's test client, posted the way a browser posts:
lists, trace upload and generation (errors with line numbers, nothing stored), the new-run
form (bad input on the field, nothing stored), and the run page (results side by side, the
charts' data, the level table, the live block htmx polls, cancelling)."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from fleetctl.bench.models import Run, Trace
from tests.bench.helpers import BAD_LINE, GOOD_LINE, MODEL, finished_run, serving, small_trace

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def trace_files(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    return tmp_path / "traces"


@pytest.fixture
def login_as(make_user):
    def make(role: str, username: str | None = None) -> Client:
        client = Client()
        client.force_login(make_user(username or f"{role}-person", role))
        return client

    return make


@pytest.fixture
def pools(make_pool):
    return {"paced": serving(make_pool, "paced"), "faulty": serving(make_pool, "faulty", "31.20")}


def run_form(**change) -> dict:
    data = {"trace": "short-chat", "pools": ["paced", "faulty"], "model_id": MODEL,
            "slo_ttft_p95_ms": "2000", "slo_tpot_p95_ms": "200", "slo_error_rate": "0.05",
            "mode": "levels", "levels": "1, 4", "max_concurrency": "256", "warmup_s": "0.5",
            "window_s": "2", "min_samples": "8", "shards": "1", "lag_limit_ms": "500"}
    data.update(change)
    return data


def live(client: Client, run: Run):
    return client.get(reverse("bench:run-detail", args=[run.pk]),
                      headers={"HX-Request": "true", "HX-Target": "run-live"})


def test_the_list_shows_runs_and_traces_and_the_nav_marks_the_section(login_as, pools):
    run = finished_run(small_trace(), pools["paced"], pools["faulty"])
    html = login_as("viewer").get(reverse("bench:home")).content.decode()
    assert '<a href="/bench/" aria-current="page">Benchmarks</a>' in html
    assert f'href="/bench/runs/{run.pk}/"' in html
    assert '<span class="badge run-complete"><span aria-hidden="true">●</span> complete' in html
    assert 'href="/bench/traces/short-chat/"' in html
    assert "New run" not in html  # a viewer may not start one
    oncall = login_as("on-call").get(reverse("bench:home")).content.decode()
    assert 'href="/bench/runs/new/"' in oncall and 'href="/bench/traces/upload/"' in oncall


def test_the_run_list_filters_by_status(login_as, pools):
    finished_run(small_trace(), pools["paced"], pools["faulty"])
    viewer = login_as("viewer")
    assert "bench/runs/" in viewer.get(reverse("bench:home"), {"status": "complete"}
                                       ).content.decode()
    empty = viewer.get(reverse("bench:home"), {"status": "running"}).content.decode()
    assert "No run matches these filters" in empty


def test_an_upload_with_a_bad_line_shows_the_line_and_stores_nothing(login_as, trace_files):
    oncall = login_as("on-call")
    answer = oncall.post(reverse("bench:trace-upload"), {
        "name": "bad", "source": "auto",
        "file": SimpleUploadedFile("bad.jsonl", GOOD_LINE + BAD_LINE)})
    assert answer.status_code == 200
    html = answer.content.decode()
    assert "line 2: prompt_tokens must be a positive integer, got -1" in html
    assert "Nothing was stored" in html
    assert not Trace.objects.exists() and list(trace_files.glob("*")) == []


def test_an_upload_is_stored_and_its_summary_shown(login_as):
    oncall = login_as("on-call")
    answer = oncall.post(reverse("bench:trace-upload"), {
        "name": "tiny", "source": "fleetctl", "description": "five requests",
        "file": SimpleUploadedFile("tiny.jsonl", GOOD_LINE * 5)})
    assert answer.status_code == 302 and answer["Location"] == "/bench/traces/tiny/"
    page = oncall.get(answer["Location"]).content.decode()
    assert "Stored trace tiny: 5 requests." in page
    assert re.search(r"<th scope=\"row\">Requests</th><td>5</td>", page)
    assert 'href="/api/v1/bench/traces/tiny/download/"' in page
    assert 'href="/bench/runs/new/?trace=tiny"' in page


def test_a_viewer_cannot_upload(login_as):
    viewer = login_as("viewer")
    form = viewer.get(reverse("bench:trace-upload")).content.decode()
    assert "needs the <code>on-call</code>" in form and "disabled" in form
    answer = viewer.post(reverse("bench:trace-upload"), {
        "name": "nope", "source": "auto", "file": SimpleUploadedFile("a.jsonl", GOOD_LINE)})
    assert answer.status_code == 403
    assert not Trace.objects.exists()


def test_a_trace_is_generated_from_the_form(login_as):
    oncall = login_as("on-call")
    answer = oncall.post(reverse("bench:trace-generate"), {
        "name": "gen", "n": "40", "seed": "1", "prompt_tokens": "64-256",
        "completion_tokens": "32", "arrival": "bursty", "rate": "5", "burstiness": "0.5",
        "shared_prefix_groups": "0", "shared_prefix_tokens": "0", "latency_class": ""})
    assert answer.status_code == 302, answer.content.decode()
    trace = Trace.objects.get(name="gen")
    assert trace.requests == 40 and trace.generator["arrival"] == {
        "kind": "bursty", "rate": 5.0, "burstiness": 0.5}
    bad = oncall.post(reverse("bench:trace-generate"), {
        "name": "gen2", "n": "40", "seed": "1", "prompt_tokens": "lots",
        "completion_tokens": "32", "arrival": "poisson", "rate": "5",
        "shared_prefix_groups": "0", "shared_prefix_tokens": "0"})
    assert "&#x27;lots&#x27;: give a number, a range like 64-512" in bad.content.decode()
    assert not Trace.objects.filter(name="gen2").exists()


def test_the_run_form_starts_a_run_and_redirects_to_its_page(login_as, pools):
    small_trace()
    answer = login_as("on-call").post(reverse("bench:run-create"), run_form())
    run = Run.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/bench/runs/{run.pk}/"
    assert run.levels == [1, 4] and run.window_s == 2.0 and run.lag_limit_ms == 500
    assert sorted(run.pools.values_list("name", flat=True)) == ["faulty", "paced"]


@pytest.mark.parametrize(("change", "says"), [
    ({"pools": ["paced", "nope"]}, "Select a valid choice. nope is not one of the available"),
    ({"slo_ttft_p95_ms": "0"}, "greater than or equal to 1"),
    ({"slo_error_rate": "0.7"}, "less than or equal to 0.5"),
    ({"levels": "1, four"}, "&#x27;four&#x27; is not one"),
    ({"levels": "1, 2.5"}, "&#x27;2.5&#x27; is not one"),
    ({"levels": ""}, "A fixed list needs at least one level"),
    ({"model_id": "other-model"}, "do(es) not serve other-model"),
])
def test_bad_run_input_is_shown_on_the_form_and_nothing_is_stored(login_as, pools, change,
                                                                  says):
    small_trace()
    answer = login_as("on-call").post(reverse("bench:run-create"), run_form(**change))
    assert answer.status_code == 200
    html = answer.content.decode()
    assert says in html and "Nothing was stored" in html
    assert not Run.objects.exists()


def test_the_run_page_shows_pools_side_by_side_with_charts_and_levels(login_as, pools):
    run = finished_run(small_trace(), pools["paced"], pools["faulty"])
    html = login_as("viewer").get(reverse("bench:run-detail", args=[run.pk])).content.decode()
    cards = re.findall(r'<article class="pool-result[^"]*" data-pool="([a-z-]+)"', html)
    assert cards == ["faulty", "paced"]
    paced = html[html.index('data-pool="paced"'):]
    assert re.search(r'class="best-concurrency">4<', paced)
    assert "27.6389 USD" in paced and "= 39.8000 USD/h ÷ 400.0 tok/s × 1e6 ÷ 3600" in paced
    assert "ttft_p95" in paced
    # Four charts, each with one trace per pool (plus the invalid level of faulty, apart).
    for chart in ("throughput-chart", "ttft-chart", "tpot-chart", "cost-chart"):
        figure = json.loads(re.search(
            rf'<script id="{chart}-data" type="application/json">(.*?)</script>', html,
            re.S)[1])
        names = [trace["name"] for trace in figure["data"]]
        assert names == ["faulty", "faulty: not counted", "paced"], (chart, names)
        assert figure["data"][1]["marker"]["symbol"] == ["diamond-open"]
    ttft = json.loads(re.search(r'<script id="ttft-chart-data" type="application/json">'
                                r'(.*?)</script>', html, re.S)[1])
    assert [s["y0"] for s in ttft["layout"]["shapes"]] == [2000.0]  # the SLO line
    assert 'class="level-row verdict-row-invalid"' in html
    assert '<span class="badge verdict-invalid"><span aria-hidden="true">◇</span> invalid' in html
    assert f'href="/api/v1/bench/runs/{run.pk}/export.csv"' in html
    assert f'href="/api/v1/bench/runs/{run.pk}/export.json"' in html
    assert "Metric definitions" in html and "(E2E − TTFT) / (N − 1)" in html
    assert "hx-trigger" not in html  # finished: nothing left to poll
    assert "Cancel run" not in html


def test_an_active_run_polls_its_live_block_and_offers_cancel(login_as, pools):
    small_trace()
    oncall = login_as("on-call")
    oncall.post(reverse("bench:run-create"), run_form())
    run = Run.objects.get()
    page = oncall.get(reverse("bench:run-detail", args=[run.pk])).content.decode()
    assert 'hx-trigger="every 2s"' in page
    assert "waiting for a worker on the bench queue" in page and "0 of 4" in page
    assert "The charts fill in as levels finish." in page
    block = live(oncall, run)
    text = block.content.decode()
    assert 'id="run-live"' in text
    assert "<html" not in text and "Metric definitions" not in text
    assert "Cancel run" in text

    viewer = login_as("viewer")
    assert "Cancel run" not in live(viewer, run).content.decode()
    assert viewer.post(reverse("bench:run-cancel", args=[run.pk])).status_code == 302
    assert Run.objects.get().status == "queued"  # refused: a viewer has no `jobs`

    answer = oncall.post(reverse("bench:run-cancel", args=[run.pk]), follow=True)
    assert "Cancelled run" in answer.content.decode()
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert "hx-trigger" not in live(oncall, run).content.decode()


def test_unknown_runs_and_traces_are_404(login_as):
    viewer = login_as("viewer")
    assert viewer.get(reverse("bench:run-detail", args=[999])).status_code == 404
    assert viewer.get(reverse("bench:trace-detail", args=["nope"])).status_code == 404


def test_a_person_without_a_role_sees_no_benchmark_page(login_as, make_user):
    client = Client()
    client.force_login(make_user("nobody"))
    assert client.get(reverse("bench:home")).status_code == 403
    assert Client().get(reverse("bench:home")).status_code == 302  # to the login page


def test_the_upload_reads_a_multi_megabyte_file_from_disk(login_as, settings):
    """Beyond Django's in-memory limit the upload is a temporary file, read line by line."""
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = GOOD_LINE * 2000
    answer = login_as("on-call").post(reverse("bench:trace-upload"), {
        "name": "big", "source": "auto", "file": io.BytesIO(body)})
    assert answer.status_code == 302
    assert Trace.objects.get(name="big").requests == 2000


# --- trace timing ----------------------------------------------------------------------------

def test_the_run_form_starts_a_trace_timing_run(login_as, pools):
    small_trace()
    answer = login_as("on-call").post(reverse("bench:run-create"), run_form(
        timing="trace", speeds="2, 0.5 1", mode="", levels=""))
    run = Run.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/bench/runs/{run.pk}/"
    assert run.timing == "trace" and run.speeds == [0.5, 1.0, 2.0] and run.levels == []


@pytest.mark.parametrize(("speeds", "says"), [
    ("", "Trace timing needs at least one speed"),
    ("1, -2", "&#x27;-2&#x27; is not one"),
    ("0", "&#x27;0&#x27; is not one"),
    ("1, fast", "&#x27;fast&#x27; is not one"),
])
def test_bad_trace_speeds_are_shown_on_the_form(login_as, pools, speeds, says):
    small_trace()
    answer = login_as("on-call").post(reverse("bench:run-create"),
                                      run_form(timing="trace", speeds=speeds))
    assert answer.status_code == 200
    html = answer.content.decode()
    assert says in html and "Nothing was stored" in html
    assert not Run.objects.exists()


def test_a_trace_timing_run_page_plots_against_trace_speed(login_as, pools):
    from fleetctl.bench.models import Level

    run = finished_run(small_trace(), pools["paced"], pools["faulty"])
    Run.objects.filter(pk=run.pk).update(timing="trace", speeds=[1.0, 4.0, 16.0], levels=[],
                                         progress={**run.progress,
                                                   "best": {"paced": 4.0, "faulty": 1.0}})
    for level in Level.objects.filter(run=run):
        level.speed, level.concurrency = float(level.concurrency), 0
        level.save()
    html = login_as("viewer").get(reverse("bench:run-detail", args=[run.pk])).content.decode()
    paced = html[html.index('data-pool="paced"'):]
    assert re.search(r'class="best-speed">4×<', paced)
    assert "Highest SLO-passing trace speed" in paced
    assert '<th scope="col" class="num">Trace speed</th>' in html
    assert 'data-speed="16"' in html and ">16×" in html
    assert "trace timing (open loop" in html and "1×, 4×, 16×" in html
    figure = json.loads(re.search(
        r'<script id="throughput-chart-data" type="application/json">(.*?)</script>', html,
        re.S)[1])
    assert figure["layout"]["xaxis"]["title"]["text"].startswith("trace speed")
    assert figure["layout"]["xaxis"]["ticktext"] == ["1×", "4×", "16×"]
    assert figure["layout"]["title"]["text"] == "Output tokens/s vs trace speed"
    paced_trace = next(t for t in figure["data"] if t["name"] == "paced")
    assert paced_trace["x"] == [1.0, 4.0]
