"""The batch pages: the jobs list, the new-job form, a job's page and its htmx blocks, the
downloads, a person's actions (always with a reason; refused for a viewer, nothing
changed), and the throughput series. Jobs are made through the services from real uploaded
files; progress is written as the checkpoint store writes it (tests/batch/web/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from fleetctl.batch import series
from fleetctl.batch.models import BatchFile, BatchJob, BatchJobEvent, BatchResend
from fleetctl.fleet.models import Pool
from tests.batch.factory import request_line
from tests.batch.web.conftest import World, finish, write_results

pytestmark = pytest.mark.django_db
LIVE = {"HX-Request": "true", "HX-Target": "batch-live"}
CHARTS = {"HX-Request": "true", "HX-Target": "batch-charts"}
ROWS = {"HX-Request": "true", "HX-Target": "batch-jobs"}
XSS = "<script>alert('batch')</script>"


def html(client: Client, url: str, status: int = 200, **headers: str) -> str:
    response = client.get(url, headers=headers)
    assert response.status_code == status, response.content[:800]
    return response.content.decode()


def jsonl(lines: list[dict] | list[str]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                   for line in lines).encode()


def good_file(n: int = 6, name: str = "good.jsonl") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, jsonl([request_line(i) for i in range(n)]),
                              content_type="application/x-ndjson")


def form_data(pool: Pool, **overrides: object) -> dict[str, object]:
    data: dict[str, object] = {"pool": pool.name, "concurrency": "4", "rate_limit_rps": "",
                               "completion_window": "2h", "drill": "", "drill_at_pct": "40",
                               "compare_sample": "5", "chunk_size": "3", "max_attempts": "3"}
    data.update(overrides)
    return data


# ---- list and job page -----------------------------------------------------------------------

def test_the_list_and_a_running_jobs_page_for_a_viewer(viewer: Client, job: BatchJob):
    write_results(job, range(0, 4))
    write_results(job, [4], status=503)
    listed = html(viewer, reverse("batch:list"))
    assert f'data-job="{job.pk}"' in listed and 'data-state="running"' in listed
    assert "5 / 12" in listed and 'hx-trigger="every 5s"' in listed
    assert "New job" not in listed  # a viewer has no jobs permission
    rows = html(viewer, reverse("batch:list"), **ROWS)
    assert rows.lstrip().startswith('<div id="batch-jobs"')

    page = html(viewer, reverse("batch:job-detail", args=[job.pk]))
    assert "<strong>5</strong> of 12 requests done" in page
    assert 'class="batch-succeeded">4<' in page
    assert 'hx-trigger="every 3s"' in page and 'hx-trigger="every 10s"' in page
    assert 'data-plotly-figure="batch-throughput-data"' in page
    assert "needs the <code>jobs</code> permission" in page
    assert 'class="batch-action-form"' not in page
    assert reverse("batch:job-output", args=[job.pk]) in page
    assert "<script>" not in page.split("</head>")[1].replace(
        '<script id="batch-throughput-data" type="application/json">', "")

    live = html(viewer, reverse("batch:job-detail", args=[job.pk]) + "?seen=running", **LIVE)
    assert live.lstrip().startswith('<div id="batch-live"')
    charts = html(viewer, reverse("batch:job-detail", args=[job.pk]), **CHARTS)
    assert charts.lstrip().startswith('<div id="batch-charts"')
    assert "batch-throughput-data" in charts


def test_a_poll_that_sees_the_state_changed_reloads_the_page_once(viewer: Client,
                                                                   job: BatchJob):
    finish(job, "cancelled")
    response = viewer.get(reverse("batch:job-detail", args=[job.pk]) + "?seen=running",
                          headers=LIVE)
    assert response["HX-Refresh"] == "true"
    assert 'hx-trigger' not in response.content.decode()  # ended: polling stops


def test_a_person_with_jobs_sees_the_forms_and_the_filters_work(oncall: Client, job: BatchJob,
                                                                world: World):
    page = html(oncall, reverse("batch:job-detail", args=[job.pk]))
    assert 'class="batch-action-form"' in page and 'value="pause"' in page
    assert 'value="cancel"' in page and 'class="batch-edit-form"' in page
    assert 'value="resume"' not in page
    assert "New job" in html(oncall, reverse("batch:list"))
    assert f'data-job="{job.pk}"' in html(oncall, reverse("batch:list") + "?state=active")
    assert f'data-job="{job.pk}"' not in html(oncall, reverse("batch:list")
                                              + "?state=completed")
    assert f'data-job="{job.pk}"' in html(oncall, reverse("batch:list")
                                          + f"?pool={world.primary.name}")
    assert "No batch job matches" in html(oncall, reverse("batch:list") + "?pool=nope")
    bad = html(oncall, reverse("batch:list") + "?state=bogus")
    assert "form-errors" in bad and f'data-job="{job.pk}"' not in bad


def test_the_downloads_stream_the_output_and_error_files(viewer: Client, job: BatchJob):
    write_results(job, range(0, 3))
    write_results(job, [3], status=429)
    out = viewer.get(reverse("batch:job-output", args=[job.pk]))
    assert out.status_code == 200 and out["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in b"".join(out.streaming_content).splitlines()]
    assert [line["custom_id"] for line in lines] == ["req-0", "req-1", "req-2"]
    assert lines[0]["response"]["status_code"] == 200
    errors = viewer.get(reverse("batch:job-errors", args=[job.pk]))
    [error] = [json.loads(line) for line in b"".join(errors.streaming_content).splitlines()]
    assert error["custom_id"] == "req-3" and error["error"]["code"] == "retries_exhausted"
    assert viewer.get(reverse("batch:job-output", args=[job.pk + 999])).status_code == 404


def test_a_drill_jobs_panel_events_and_resends(viewer: Client, world: World, tmp_path: Path):
    from tests.batch.factory import make_job
    job = make_job(world.actor("oncall"), world.primary, n=10, tmp_path=tmp_path,
                   chunk_size=5, drill="kill-worker", drill_at=0.3)
    write_results(job, range(0, 3), worker="w1")
    fired = timezone.now()
    BatchResend.objects.create(job=job, index=3, custom_id="req-3", previous_owner="w1",
                               new_owner="w2")
    BatchJobEvent.objects.create(job=job, kind="drill", actor="w1", message=XSS)
    BatchJobEvent.objects.create(job=job, kind="paused", actor="olga", manual=True,
                                 message="olga paused the job: checking")
    write_results(job, range(3, 10), worker="w2", start_offset_s=20)
    finish(job, drill_fired_at=fired, drill_worker="w1",
           drill_resumed_at=fired + timezone.timedelta(seconds=31.5), drill_verdict="pass",
           drill_summary="10 of 10 custom_ids have exactly one result; resumed after 31.5 s")
    page = html(viewer, reverse("batch:job-detail", args=[job.pk]))
    assert 'data-verdict="pass"' in page
    assert "31.5 s" in page and "resumed after 31.5 s" in page
    assert "Worker killed</dt><dd>w1" in page
    assert "<code>req-3</code>" in page and "may have been sent twice" in page
    assert XSS not in page and "&lt;script&gt;alert(&#x27;batch&#x27;)&lt;/script&gt;" in page
    assert 'class="badge manual-badge"' in page and "olga paused the job" in page
    assert 'hx-trigger' not in page  # ended


# ---- new job form ----------------------------------------------------------------------------

def test_the_new_job_form_renders_for_both_and_creates_a_job(viewer: Client, oncall: Client,
                                                             world: World):
    assert "needs the <code>jobs</code> permission" in html(viewer, reverse("batch:job-new"))
    form = html(oncall, reverse("batch:job-new"))
    assert 'enctype="multipart/form-data"' in form and 'name="file"' in form
    response = oncall.post(reverse("batch:job-new"),
                           form_data(world.primary, file=good_file(), drill="fault-pool",
                                     drill_at_pct="25"))
    assert response.status_code == 302, response.content[:2000]
    job = BatchJob.objects.get()
    assert response["Location"] == reverse("batch:job-detail", args=[job.pk])
    assert (job.total, job.concurrency, job.completion_window_s, job.chunk_size) == (
        6, 4, 7200, 3)
    assert job.drill == "fault-pool" and job.drill_at == 0.25 and job.compare_sample == 5
    assert job.created_by == "olga" and job.pool == world.primary
    # The uploaded file can be picked for the next job.
    again = oncall.post(reverse("batch:job-new"),
                        form_data(world.primary, input_file=str(job.input_file_id)))
    assert again.status_code == 302
    assert BatchJob.objects.count() == 2 and BatchFile.objects.count() == 1


@pytest.mark.parametrize("lines, said", [
    ([json.dumps(request_line(0)), "{not json", json.dumps(request_line(1))],
     ["line 2: is not valid JSON"]),
    ([json.dumps(request_line(0)), json.dumps(request_line(1)), json.dumps(request_line(0))],
     ["line 3: custom_id", "already on line 1"]),
    ([json.dumps(request_line(0, url="/v1/moderations"))], ["line 1:", "/v1/moderations"]),
])
def test_a_bad_upload_is_named_by_line_and_nothing_is_stored(oncall: Client, world: World,
                                                             lines: list[str],
                                                             said: list[str]):
    response = oncall.post(reverse("batch:job-new"), form_data(
        world.primary, file=SimpleUploadedFile("bad.jsonl", jsonl(lines))))
    assert response.status_code == 400
    errors = response.content.decode().split('id="id_file_error"')[1].split("</ul>")[0]
    for text in said:
        assert text in errors
    assert BatchFile.objects.count() == 0 and BatchJob.objects.count() == 0


@pytest.mark.parametrize("override, field, message", [
    ({"concurrency": "0"}, "concurrency", "greater than or equal to 1"),
    ({"completion_window": "a week"}, "completion_window", "is not a duration"),
    ({"completion_window": "8d"}, "completion_window", "outside 10s to 7d"),
    ({"drill": "nuke"}, "drill", "Select a valid choice"),
    ({"drill_at_pct": "99"}, "drill_at_pct", "less than or equal to 95"),
    ({"rate_limit_rps": "0"}, "rate_limit_rps", "greater than or equal to 0.01"),
    ({"pool": "nope"}, "pool", "Select a valid choice"),
])
def test_bad_options_are_refused_on_the_form_and_nothing_is_stored(
        oncall: Client, world: World, override: dict, field: str, message: str):
    data = {**form_data(world.primary, file=good_file()), **override}
    response = oncall.post(reverse("batch:job-new"), data)
    assert response.status_code == 400
    page = response.content.decode()
    assert message in page.split(f'id="id_{field}_error"')[1].split("</ul>")[0]
    assert BatchFile.objects.count() == 0 and BatchJob.objects.count() == 0


def test_no_file_and_nothing_picked_says_what_to_do(oncall: Client, world: World):
    response = oncall.post(reverse("batch:job-new"), form_data(world.primary))
    assert response.status_code == 400
    assert "Upload an input file, or pick one uploaded before." in response.content.decode()
    assert BatchJob.objects.count() == 0


def test_a_model_the_pool_does_not_serve_refuses_the_job_and_keeps_the_valid_file(
        oncall: Client, world: World, make_pool):
    other = make_pool(name="no-models")
    response = oncall.post(reverse("batch:job-new"), form_data(other, file=good_file()))
    assert response.status_code == 400
    page = response.content.decode()
    assert "line 1: model" in page and "is not served by pool no-models" in page
    assert BatchJob.objects.count() == 0
    kept = BatchFile.objects.get()
    assert f'<option value="{kept.pk}" selected>' in page and "is kept as" in page


def test_a_viewer_posting_anyway_is_refused_and_nothing_is_stored(viewer: Client,
                                                                  world: World):
    response = viewer.post(reverse("batch:job-new"), form_data(world.primary, file=good_file()))
    assert response.status_code == 403
    assert BatchFile.objects.count() == 0 and BatchJob.objects.count() == 0


# ---- actions ---------------------------------------------------------------------------------

def test_pause_needs_a_reason_then_pauses_as_a_manual_event(oncall: Client, job: BatchJob):
    url = reverse("batch:job-action", args=[job.pk])
    refused = oncall.post(url, {"action": "pause", "reason": "  "})
    assert refused.status_code == 400
    assert "Say why" in refused.content.decode()
    job.refresh_from_db()
    assert job.state == "queued"
    done = oncall.post(url, {"action": "pause", "reason": "the pool is being patched"})
    assert done.status_code == 302
    job.refresh_from_db()
    assert job.state == "paused"
    event = job.events.get(kind="paused")
    assert event.manual and event.actor == "olga"
    page = html(oncall, reverse("batch:job-detail", args=[job.pk]))
    assert 'value="resume"' in page and 'value="pause"' not in page
    # A pause of a paused job is a conflict shown on the page; nothing changes.
    again = oncall.post(url, {"action": "pause", "reason": "twice"})
    assert again.status_code == 409 and "only a queued or running" in again.content.decode()
    assert job.events.filter(kind="paused").count() == 1


def test_cancel_and_a_viewers_refusal(oncall: Client, viewer: Client, job: BatchJob):
    url = reverse("batch:job-action", args=[job.pk])
    refused = viewer.post(url, {"action": "cancel", "reason": "not mine"})
    assert refused.status_code == 403
    job.refresh_from_db()
    assert job.state == "queued"
    assert oncall.post(url, {"action": "cancel", "reason": "wrong file"}).status_code == 302
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert 'class="batch-action-form"' not in html(oncall, reverse("batch:job-detail",
                                                                   args=[job.pk]))


def test_edit_validates_then_changes_the_limits(oncall: Client, job: BatchJob):
    url = reverse("batch:job-edit", args=[job.pk])
    nothing = oncall.post(url, {"concurrency": "", "rate_limit_rps": "", "reason": "faster"})
    assert nothing.status_code == 400
    assert "Give a new concurrency or a new rate limit" in nothing.content.decode()
    bad = oncall.post(url, {"concurrency": "999", "reason": "faster"})
    assert bad.status_code == 400
    no_reason = oncall.post(url, {"concurrency": "16", "reason": ""})
    assert no_reason.status_code == 400
    job.refresh_from_db()
    assert job.concurrency == 8 and not job.events.filter(kind="edited").exists()
    done = oncall.post(url, {"concurrency": "16", "rate_limit_rps": "2.5", "reason": "faster"})
    assert done.status_code == 302
    job.refresh_from_db()
    assert (job.concurrency, job.rate_limit_rps) == (16, 2.5)
    assert job.events.get(kind="edited").manual


# ---- the throughput series -------------------------------------------------------------------

def test_throughput_buckets_count_each_result_once_in_one_query(job: BatchJob):
    write_results(job, range(0, 10), seconds_apart=3.0)
    write_results(job, [10], status=500, start_offset_s=31)
    finish(job)
    with CaptureQueriesContext(connection) as queries:
        buckets = series.throughput_buckets(job)
    assert len(queries) == 1
    assert len(buckets) <= series.MAX_BUCKETS
    assert sum(b.requests for b in buckets) == 11
    assert sum(b.errors for b in buckets) == 1
    assert sum(b.output_tokens for b in buckets) == 50
    assert series.throughput_buckets(BatchJob(total=1)) == []


@pytest.mark.parametrize("span, width", [(30, 1), (61, 2), (3600, 60), (7 * 86400, 10800)])
def test_bucket_width_keeps_the_chart_bounded(span: float, width: int):
    assert series.bucket_width(span) == width
    assert span / series.bucket_width(span) <= series.MAX_BUCKETS


def queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_the_list_and_the_job_page_read_a_bounded_number_of_queries(
        oncall: Client, world: World, job: BatchJob, tmp_path: Path):
    from tests.batch.factory import make_job
    write_results(job, range(0, 2))
    one_job = queries(oncall, reverse("batch:list"))
    few_rows = queries(oncall, reverse("batch:job-detail", args=[job.pk]))
    for _ in range(3):
        make_job(world.actor("oncall"), world.primary, n=4, tmp_path=tmp_path)
    write_results(job, range(2, 12), seconds_apart=7)
    for index in range(5):
        BatchResend.objects.create(job=job, index=index, custom_id=f"req-{index}",
                                   previous_owner="w1", new_owner="w2")
        BatchJobEvent.objects.create(job=job, kind="takeover", actor="w2")
    assert queries(oncall, reverse("batch:list")) == one_job
    assert queries(oncall, reverse("batch:job-detail", args=[job.pk])) == few_rows


def test_the_chart_marks_the_drill_firing_and_the_resume(job: BatchJob):
    write_results(job, range(0, 4))
    fired = timezone.now()
    finish(job, drill="kill-worker", drill_fired_at=fired,
           drill_resumed_at=fired + timezone.timedelta(seconds=30))
    figure = series.throughput_figure(series.throughput_buckets(job), series.job_marks(job))
    labels = [a.text for a in figure.layout.annotations]
    assert labels == ["drill fired (kill-worker)", "resumed"]
    assert [s.x0 for s in figure.layout.shapes] == [fired, fired + timezone.timedelta(seconds=30)]
