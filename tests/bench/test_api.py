"""Benchmarks over REST: traces uploaded (streamed, every bad line named, nothing kept) or
generated, runs started by name with bad input refused as a 400 that names the field,
results per pool, levels, samples and streamed exports. Reads need `read`; writes `jobs`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import UploadedFile

from fleetctl.bench import services
from fleetctl.bench.api.exports import CSV_COLUMNS
from fleetctl.bench.models import Run, Sample, Trace
from tests.bench.helpers import (
    BAD_LINE,
    GOOD_LINE,
    MODEL,
    SLO,
    finished_run,
    serving,
    small_trace,
)

pytestmark = pytest.mark.django_db
SAMPLES = Path(__file__).parent / "samples"
TRACES = "/api/v1/bench/traces/"
RUNS = "/api/v1/bench/runs/"


@pytest.fixture(autouse=True)
def trace_files(settings, tmp_path):
    """Trace files go to a folder of this test's own."""
    settings.DATA_DIR = tmp_path
    return tmp_path / "traces"


@pytest.fixture
def pools(make_pool):
    return {"paced": serving(make_pool, "paced"), "faulty": serving(make_pool, "faulty", "31.20")}


def new_run(trace: str = "short-chat", pools=("paced",), **extra):
    return {"trace": trace, "pools": list(pools), "model_id": MODEL, "mode": "levels",
            "levels": [1, 4], **SLO, **extra}


def upload(client, name: str, body: bytes, **fields):
    return client.post(TRACES, {"name": name, "file": io.BytesIO(body), **fields},
                       format="multipart")


# --- traces ----------------------------------------------------------------------------------

def test_an_uploaded_trace_is_stored_summarised_and_downloadable(client_for, trace_files):
    oncall = client_for("on-call")
    with (SAMPLES / "fleetctl_sample.jsonl").open("rb") as fp:
        answer = oncall.post(TRACES, {"name": "support", "description": "sample", "file": fp},
                             format="multipart")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert body["source"] == "fleetctl" and body["requests"] == 29
    assert body["summary"]["request_count"] == 29 and body["created_by"] == "on-call"

    listed = oncall.get(TRACES).json()
    assert [t["name"] for t in listed["results"]] == ["support"]
    detail = oncall.get(f"{TRACES}support/").json()
    assert detail["summary"]["prompt_tokens_max"] > 0

    download = oncall.get(f"{TRACES}support/download/")
    assert download.status_code == 200 and download.streaming
    text = b"".join(download.streaming_content).decode()
    assert len([line for line in text.splitlines() if '"arrival_s"' in line]) == 29
    assert 'filename="support.jsonl"' in download["Content-Disposition"]


def test_the_upload_hands_the_service_the_uploaded_file_object_unread(client_for, monkeypatch):
    seen = []
    original = services.trace_upload

    def spy(**kwargs):
        seen.append((type(kwargs["fileobj"]), kwargs["fileobj"].tell()))
        return original(**kwargs)

    monkeypatch.setattr(services, "trace_upload", spy)
    answer = upload(client_for("on-call"), "streamed", GOOD_LINE * 5)
    assert answer.status_code == 201, answer.json()
    (kind, position), = seen
    assert issubclass(kind, UploadedFile) and position == 0


def test_mooncake_and_azure_files_are_detected(client_for):
    oncall = client_for("on-call")
    for name, sample in (("moon", "mooncake_sample.jsonl"), ("azure", "azure_code_sample.csv")):
        with (SAMPLES / sample).open("rb") as fp:
            answer = oncall.post(TRACES, {"name": name, "file": fp}, format="multipart")
        assert answer.status_code == 201, answer.json()
    assert dict(Trace.objects.values_list("name", "source")) == {"moon": "mooncake",
                                                                  "azure": "azure-csv"}


def test_an_upload_with_a_bad_line_names_it_and_stores_nothing(client_for, trace_files):
    answer = upload(client_for("on-call"), "bad", GOOD_LINE + BAD_LINE)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["fields"]["file"] == [
        "line 2: prompt_tokens must be a positive integer, got -1"]
    assert "line 2" in error["message"]
    assert not Trace.objects.exists()
    assert list(trace_files.glob("*")) == []  # not even a partial file


def test_an_empty_upload_or_an_unknown_format_is_refused(client_for):
    oncall = client_for("on-call")
    empty = upload(oncall, "empty", b"")
    assert empty.status_code == 400
    assert "the trace has no requests" in empty.json()["error"]["fields"]["file"][0]
    wrong = upload(oncall, "wrong", GOOD_LINE, source="parquet")
    assert wrong.status_code == 400 and "source" in wrong.json()["error"]["fields"]
    assert not Trace.objects.exists()


def test_a_synthetic_trace_is_generated_and_bad_parameters_are_named(client_for):
    oncall = client_for("on-call")
    made = oncall.post(f"{TRACES}generate/", {
        "name": "poisson-chat", "n": 120, "seed": 3,
        "prompt_tokens": {"kind": "uniform", "lo": 64, "hi": 256}, "completion_tokens": 32,
        "arrival": {"kind": "poisson", "rate": 5}, "shared_prefix_groups": 2,
        "shared_prefix_tokens": 100, "latency_class": "interactive"}, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["requests"] == 120 and made.json()["source"] == "synthetic"
    assert made.json()["generator"]["seed"] == 3

    bad = oncall.post(f"{TRACES}generate/", {
        "name": "bad-gen", "arrival": {"kind": "tidal"}}, format="json")
    assert bad.status_code == 400
    assert "arrival: unknown kind 'tidal'" in bad.json()["error"]["fields"]["generator"][0]
    assert not Trace.objects.filter(name="bad-gen").exists()


# --- runs ------------------------------------------------------------------------------------

def test_a_run_is_started_by_pool_and_trace_name(client_for, pools,
                                                 django_capture_on_commit_callbacks):
    small_trace()
    oncall = client_for("on-call")
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        answer = oncall.post(RUNS, new_run(pools=("paced", "faulty"), window_s=2, warmup_s=0.5,
                                           min_samples=8, lag_limit_ms=500), format="json")
    assert answer.status_code == 202, answer.json()
    body = answer.json()
    assert body["status"] == "queued" and sorted(body["pools"]) == ["faulty", "paced"]
    assert body["levels"] == [1, 4] and body["url"] == f"/bench/runs/{body['id']}/"
    assert body["progress"] == {"status": "queued", "levels_done": 0, "levels_planned": 4,
                                "percent": 0, "doing": "waiting for a worker on the bench queue"}
    assert [r["pool"] for r in body["results"]] == ["faulty", "paced"]
    assert len(enqueued) == 1  # the run task, sent once the row is committed


@pytest.mark.parametrize(("change", "field", "says"), [
    ({"pools": ["paced", "nope"]}, "pools", "No pool named nope"),
    ({"trace": "missing"}, "trace", "No trace named missing"),
    ({"pools": []}, "pools", "Name at least one pool."),
    ({"slo_ttft_p95_ms": -5}, "slo_ttft_p95_ms", "greater than or equal to 1"),
    ({"slo_error_rate": 0.9}, "slo_error_rate", "less than or equal to 0.5"),
    ({"levels": [1, 2.5]}, "levels", "2.5 is not one"),
    ({"levels": ["4"]}, "levels", '"4" is not one'),
    ({"levels": [0, 4]}, "levels", "0 is not one"),
    ({"model_id": "other-model"}, "pools", "paced do(es) not serve other-model"),
    ({"shards": 0}, "shards", "greater than or equal to 1"),
])
def test_bad_run_requests_are_400s_that_name_the_field(client_for, pools, change, field, says):
    small_trace()
    answer = client_for("on-call").post(RUNS, new_run(**change), format="json")
    assert answer.status_code == 400, answer.json()
    messages = answer.json()["error"]["fields"][field]
    assert any(says in message for message in messages), messages
    assert not Run.objects.exists()


def test_reads_need_read_and_starting_a_run_needs_jobs(client_for, token_client, pools):
    small_trace()
    viewer = client_for("viewer")
    assert viewer.get(RUNS).status_code == 200
    assert viewer.get(TRACES).status_code == 200
    refused = viewer.post(RUNS, new_run(), format="json")
    assert refused.status_code == 403
    assert upload(viewer, "nope", GOOD_LINE).status_code == 403
    assert client_for(username="nobody").get(RUNS).status_code == 403  # no role at all
    jobs_only = token_client(["jobs"], service=True)
    assert jobs_only.get(RUNS).status_code == 403  # a token without `read` reads nothing
    assert jobs_only.post(RUNS, new_run(), format="json").status_code == 202
    assert not Trace.objects.filter(name="nope").exists()


def test_the_run_detail_gives_each_pools_best_level_and_its_cost(client_for, pools):
    run = finished_run(small_trace(), pools["paced"], pools["faulty"])
    viewer = client_for("viewer")
    body = viewer.get(f"{RUNS}{run.pk}/").json()
    results = {r["pool"]: r for r in body["results"]}
    assert results["paced"]["best_concurrency"] == 4
    assert results["paced"]["output_tokens_per_s"] == 400.0
    assert results["paced"]["binding"] == "ttft_p95"
    # 39.80 / 400 × 1e6 / 3600
    assert results["paced"]["cost_per_1m"] == "27.638900"
    assert results["paced"]["currency"] == "USD" and results["paced"]["client_bound"] is False
    assert "39.8000 USD/h ÷ 400.0 tok/s × 1e6 ÷ 3600" in results["paced"]["cost_formula"]
    assert results["faulty"]["best_concurrency"] == 1
    verdicts = [(lv["pool"], lv["concurrency"], lv["verdict"]) for lv in body["level_rows"]]
    assert verdicts == [("faulty", 1, "pass"), ("faulty", 4, "fail"), ("faulty", 16, "invalid"),
                        ("paced", 1, "pass"), ("paced", 4, "pass")]
    assert body["progress"]["levels_done"] == 5 and body["progress"]["doing"] == ""


def test_levels_and_samples_are_paginated(client_for, pools):
    run = finished_run(small_trace(), pools["paced"], pools["faulty"])
    viewer = client_for("viewer")
    levels = viewer.get(f"{RUNS}{run.pk}/levels/").json()
    assert levels["count"] == 5 and levels["results"][0]["summary"]["n_ok"] == 10
    samples = viewer.get(f"{RUNS}{run.pk}/samples/", {"page_size": 4}).json()
    assert samples["count"] == 15 and len(samples["results"]) == 4 and samples["next"]
    first = samples["results"][0]
    assert first["pool"] == "faulty" and first["concurrency"] == 1 and first["warmup"] is True


def test_exports_stream_every_request_as_csv_and_json(client_for, pools):
    run = finished_run(small_trace(), pools["paced"], pools["faulty"])
    # Which stream sent a request and which endpoint it went to are in every per-request form.
    marked = Sample.objects.filter(level__run=run).order_by("pk").last()
    Sample.objects.filter(pk=marked.pk).update(stream=3, endpoint=1)
    viewer = client_for("viewer")
    pages = viewer.get(f"{RUNS}{run.pk}/samples/", {"page_size": 500}).json()["results"]
    assert [(r["stream"], r["endpoint"]) for r in pages].count((3, 1)) == 1
    as_csv = viewer.get(f"{RUNS}{run.pk}/export.csv")
    assert as_csv.status_code == 200 and as_csv.streaming
    assert as_csv["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(as_csv.streaming_content).decode())))
    assert len(rows) == 15 and list(rows[0]) == CSV_COLUMNS
    row = next(r for r in rows if r["pool"] == "paced" and r["concurrency"] == "4")
    assert row["verdict"] == "pass" and row["itl_count"] == "3" and row["itl_max_s"] == "0.03"
    assert row["ttft_s"] == "0.9" and row["tokens_source"] == "usage"
    assert [(r["stream"], r["endpoint"]) for r in rows].count(("3", "1")) == 1

    as_json = viewer.get(f"{RUNS}{run.pk}/export.json")
    assert as_json.status_code == 200 and as_json.streaming
    body = json.loads(b"".join(as_json.streaming_content))
    assert body["id"] == run.pk and len(body["samples"]) == 15 and len(body["level_rows"]) == 5
    assert body["samples"][0]["itl_s"] == [0.02, 0.03, 0.02]
    assert [(r["stream"], r["endpoint"]) for r in body["samples"]].count((3, 1)) == 1


def test_cancelling_a_run_and_cancelling_it_again(client_for, pools):
    small_trace()
    oncall = client_for("on-call")
    run_id = oncall.post(RUNS, new_run(), format="json").json()["id"]
    assert client_for("viewer").post(f"{RUNS}{run_id}/cancel/").status_code == 403
    cancelled = oncall.post(f"{RUNS}{run_id}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = oncall.post(f"{RUNS}{run_id}/cancel/")
    assert again.status_code == 409 and "only a queued or running run" in again.json()[
        "error"]["message"]


def test_runs_filter_by_status_pool_and_trace(client_for, pools):
    finished_run(small_trace(), pools["paced"], pools["faulty"])
    viewer = client_for("viewer")
    assert viewer.get(RUNS, {"status": "complete"}).json()["count"] == 1
    assert viewer.get(RUNS, {"status": "running"}).json()["count"] == 0
    assert viewer.get(RUNS, {"pool": "paced"}).json()["count"] == 1
    assert viewer.get(RUNS, {"pool": "elsewhere"}).json()["count"] == 0
    assert viewer.get(RUNS, {"trace": "short-chat"}).json()["count"] == 1
    assert viewer.get(RUNS, {"trace": "other"}).json()["count"] == 0


# --- trace timing ----------------------------------------------------------------------------

def test_a_trace_timing_run_is_started_with_speeds(client_for, pools,
                                                   django_capture_on_commit_callbacks):
    small_trace()
    with django_capture_on_commit_callbacks(execute=False):
        answer = client_for("on-call").post(
            RUNS, new_run(pools=("paced", "faulty"), timing="trace", speeds=[2, 0.5, 1],
                          levels=[]), format="json")
    assert answer.status_code == 202, answer.json()
    body = answer.json()
    assert body["timing"] == "trace" and body["speeds"] == [0.5, 1.0, 2.0]
    assert body["mode"] == "levels" and body["levels"] == []
    assert body["progress"]["levels_planned"] == 6  # three speeds × two pools
    assert all(r["best_speed"] is None for r in body["results"])


@pytest.mark.parametrize(("speeds", "says"), [
    ([], "Give trace speeds"),
    ([1, -2], "-2 is not one"),
    ([0], "0 is not one"),
    (["2"], '"2" is not one'),
    (["fast"], '"fast" is not one'),
    ([True], "true is not one"),
    ([1500], "1500 is not one"),
    ("1, 2", "Expected a list"),
])
def test_bad_speeds_are_400s_that_name_speeds(client_for, pools, speeds, says):
    small_trace()
    answer = client_for("on-call").post(RUNS, new_run(timing="trace", speeds=speeds),
                                        format="json")
    assert answer.status_code == 400, answer.json()
    messages = answer.json()["error"]["fields"]["speeds"]
    assert any(says in message for message in messages), messages
    assert not Run.objects.exists()


def test_trace_timing_levels_and_samples_carry_their_speed(client_for, pools):
    from fleetctl.bench.models import Level

    run = finished_run(small_trace(), pools["paced"], pools["faulty"])
    Run.objects.filter(pk=run.pk).update(timing="trace", speeds=[1.0, 4.0], levels=[],
                                         progress={**run.progress,
                                                   "best": {"paced": 4.0, "faulty": 1.0}})
    for level in Level.objects.filter(run=run):
        level.speed, level.concurrency = float(level.concurrency), 0
        level.save()
    viewer = client_for("viewer")
    body = viewer.get(f"{RUNS}{run.pk}/").json()
    results = {r["pool"]: r for r in body["results"]}
    assert results["paced"]["best_speed"] == 4.0 and results["paced"]["best_concurrency"] is None
    assert results["faulty"]["best_speed"] == 1.0
    assert {lv["speed"] for lv in body["level_rows"]} == {1.0, 4.0, 16.0}
    rows = list(csv.DictReader(io.StringIO(
        b"".join(viewer.get(f"{RUNS}{run.pk}/export.csv").streaming_content)
        .decode())))
    assert {r["speed"] for r in rows} == {"1.0", "4.0", "16.0"}
    assert {r["concurrency"] for r in rows} == {"0"}


def test_an_error_text_a_spreadsheet_would_run_is_exported_as_text(client_for, pools):
    from fleetctl.bench.models import Sample

    run = finished_run(small_trace(), pools["paced"], pools["faulty"])
    # The error text is whatever the measured server answered.
    Sample.objects.filter(level__run=run).update(error='=HYPERLINK("http://evil.example")')
    body = b"".join(client_for("viewer").get(f"{RUNS}{run.pk}/export.csv").streaming_content)
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert {r["error"] for r in rows} == {"'=HYPERLINK(\"http://evil.example\")"}
