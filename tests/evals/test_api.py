"""Eval suites and runs over REST: a suite uploaded as multipart JSONL (201 for a new version,
200 with the same version for identical content), its items, its canonical bytes (hashing to
its SHA-256), retired and bundled; bad files refused with a 400 naming the line and nothing
stored; runs started by suite reference and pool names (400 naming the field, nothing
stored), read with their pools, progress and statistics, cancelled; the results and the
side-by-side item diff with their filters, and the diff's CSV (formula-safe) and JSON exports.
`read` reads, `jobs` writes. No worker here: result rows are scored directly."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from fleetctl.evals import services
from fleetctl.evals.api.diff import CSV_COLUMNS
from fleetctl.evals.models import EvalItem, EvalResult, EvalRun, EvalSuite
from migrations_plan.models import Evidence, Plan
from tests.core.hostile import REVIEWED_DEPTHS, nested_schema, recording_server, with_nested
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db
SUITES = "/api/v1/eval-suites/"
RUNS = "/api/v1/eval-runs/"


def item(i: int, **overrides: Any) -> dict[str, Any]:
    line = {"id": f"sum-{i:03d}",
            "messages": [{"role": "user", "content": f"What is {i} + {i}? Reply with a number."}],
            "references": [str(2 * i)], "scorer": "numeric",
            "tags": ["arithmetic", "parity:even" if i % 2 == 0 else "parity:odd"]}
    line.update(overrides)
    return line


def suite_text(n: int = 4, *, description: str = "sums", spaced: bool = False) -> str:
    """A small suite as JSONL: a header, then n numeric items. `spaced`: the same content
    written another way (keys reversed, spaces), which is the same suite."""
    header = {"fleetctl_eval_suite": 1, "description": description,
              "decoding": {"temperature": 0, "seed": 7, "max_tokens": 32}}
    lines = [header, *(item(i) for i in range(n))]
    if spaced:
        return "\n".join(json.dumps(dict(reversed(list(line.items()))), indent=None,
                                    separators=(", ", ": ")) for line in lines) + "\n\n"
    return "".join(json.dumps(line) + "\n" for line in lines)


def upload(client: Any, name: str, text: str | bytes, **extra: Any) -> Any:
    data = text.encode() if isinstance(text, str) else text
    return client.post(SUITES, {"name": name, "file": SimpleUploadedFile(
        "suite.jsonl", data, content_type="application/x-ndjson"), **extra}, format="multipart")


def fields(answer: Any) -> dict[str, list[str]]:
    return answer.json()["error"]["fields"]


@pytest.fixture
def plan(world: World) -> Plan:  # noqa: F811
    return world.plan()


@pytest.fixture
def lead(client_for: Any) -> Any:
    return client_for("platform-lead")


@pytest.fixture
def suite(lead: Any) -> EvalSuite:
    answer = upload(lead, "sums", suite_text())
    assert answer.status_code == 201, answer.json()
    return EvalSuite.objects.get(pk=answer.json()["id"])


def score(run: EvalRun, pool: str, scores: dict[str, tuple[float, str]]) -> None:
    """Score `pool`'s rows of `run` directly (no worker): item id -> (score, answer text)."""
    now = timezone.now()
    for item_id, (value, text) in scores.items():
        EvalResult.objects.filter(run=run, run_pool__pool__name=pool,
                                  item__item_id=item_id).update(
            status=EvalResult.Status.DONE, score=value, text=text,
            reason="ok" if value else "wrong number", extracted=text[:20], scored_at=now,
            latency_ms=12.5, prompt_tokens=20, completion_tokens=3, http_status=200)
    EvalRun.objects.filter(pk=run.pk).update(
        done=EvalResult.objects.filter(run=run, status=EvalResult.Status.DONE).count())


# Item -> (candidate, primary): 0 both right, 1 regressed (a formula-like answer), 2
# improved, 3 both wrong.
DIFF_SCORES = {"sum-000": ((1, "0"), (1, "0")),
               "sum-001": ((0, "=HYPERLINK(\"http://x\")"), (1, "2")),
               "sum-002": ((1, "4"), (0, "5")),
               "sum-003": ((0, "7"), (0, "8"))}


def scored_run(run: EvalRun, candidate: str, primary: str) -> EvalRun:
    score(run, candidate, {k: v[0] for k, v in DIFF_SCORES.items()})
    score(run, primary, {k: v[1] for k, v in DIFF_SCORES.items()})
    return EvalRun.objects.get(pk=run.pk)


# --- suites ----------------------------------------------------------------------------------

def test_a_suite_is_uploaded_read_downloaded_and_the_same_content_is_the_same_version(
        lead: Any, client_for: Any):
    answer = upload(lead, "sums", suite_text(), description="four sums")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert (body["name"], body["version"], body["item_count"], body["created"]) == (
        "sums", 1, 4, True)
    assert (body["source"], body["retired"], body["description"]) == (
        "uploaded", False, "four sums")
    assert body["tags"] == {"arithmetic": 4, "parity:even": 2, "parity:odd": 2}
    assert body["scorers"] == {"numeric": 4}
    assert body["decoding"]["seed"] == 7
    assert body["url"] == f"/evals/suites/{body['id']}/"
    assert "Stored sums v1" in body["message"]

    viewer = client_for("viewer")
    listed = viewer.get(SUITES, {"name": "sums"}).json()
    assert [s["id"] for s in listed["results"]] == [body["id"]]
    assert viewer.get(SUITES, {"source": "bundled"}).json()["count"] == 0
    assert viewer.get(f"{SUITES}{body['id']}/").json()["sha256"] == body["sha256"]

    items = viewer.get(f"{SUITES}{body['id']}/items/", {"page_size": 3}).json()
    assert items["count"] == 4 and len(items["results"]) == 3
    first = items["results"][0]
    assert (first["position"], first["item_id"], first["scorer"], first["references"]) == (
        0, "sum-000", "numeric", ["0"])
    assert first["messages"][0]["role"] == "user" and first["prompt"] == ""
    odd = viewer.get(f"{SUITES}{body['id']}/items/", {"tag": "parity:odd"}).json()
    assert [i["item_id"] for i in odd["results"]] == ["sum-001", "sum-003"]

    download = viewer.get(f"{SUITES}{body['id']}/download/")
    assert download.status_code == 200
    assert download["Content-Type"] == "application/x-ndjson"
    assert 'filename="sums-v1.jsonl"' in download["Content-Disposition"]
    data = download.content
    assert hashlib.sha256(data).hexdigest() == body["sha256"] == download["X-Suite-SHA256"]
    assert len(data.decode().splitlines()) == 5  # the header and four items
    # A client asking for JSON lines by its media type gets the same bytes.
    assert viewer.get(f"{SUITES}{body['id']}/download/",
                      HTTP_ACCEPT="application/x-ndjson").content == data

    # The same content, written another way, and the downloaded bytes: that version, 200.
    for again in (suite_text(spaced=True, description="four sums"), data):
        same = upload(lead, "sums", again)
        assert same.status_code == 200, same.json()
        assert (same.json()["id"], same.json()["version"], same.json()["created"]) == (
            body["id"], 1, False)
        assert "already stored as sums v1" in same.json()["message"]
    assert EvalSuite.objects.count() == 1 and EvalItem.objects.count() == 4

    changed = upload(lead, "sums", suite_text(5))
    assert changed.status_code == 201
    assert (changed.json()["version"], changed.json()["item_count"]) == (2, 5)
    assert changed.json()["sha256"] != body["sha256"]
    names = [(s["name"], s["version"]) for s in viewer.get(SUITES).json()["results"]]
    assert names == [("sums", 2), ("sums", 1)]


def _lines(*lines: Any) -> str:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)


@pytest.mark.parametrize(("text", "says"), [
    (_lines(item(0), item(1), "{not json"), "line 3"),
    (_lines(item(0), item(1, scorer="vibes")), "line 2"),
    (_lines(item(0), item(0)), "line 2"),  # a duplicate id names both lines
    (_lines(item(0, scorer="regex", params={"pattern": "(unclosed"})), "line 1"),
    (_lines(item(0, scorer="json_schema", references=[],
                 params={"schema": {"type": "no-such-type"}})), "line 1"),
    (_lines(item(0, request={"logprobs": True})), "logprobs"),
    (_lines(item(0, tags=["has space"])), "line 1"),
    ("", "no items"),
    (b"\xff\xfe" + _lines(item(0)).encode(), "line 1"),
])
def test_a_bad_line_is_a_400_naming_it_and_nothing_is_stored(lead: Any, text: Any, says: str):
    answer = upload(lead, "broken", text)
    assert answer.status_code == 400, answer.json()
    messages = fields(answer)["file"]
    assert any(says in m for m in messages), messages
    assert not EvalSuite.objects.exists() and not EvalItem.objects.exists()


@pytest.mark.parametrize(("name", "says"), [("Not A Slug", "lowercase"),
                                            ("", "Name the suite"), ("-dash", "lowercase"),
                                            ("x" * 64, "1-63")])
def test_a_bad_name_is_a_400_naming_it(lead: Any, name: str, says: str):
    answer = upload(lead, name, suite_text())
    assert answer.status_code == 400, answer.json()
    assert says in fields(answer)["name"][0]
    assert not EvalSuite.objects.exists()


def test_a_missing_file_and_a_file_over_the_limit_are_400s(lead: Any, settings: Any):
    missing = lead.post(SUITES, {"name": "sums"}, format="multipart")
    assert missing.status_code == 400 and "file" in fields(missing)
    settings.EVAL_MAX_UPLOAD_BYTES = 200
    big = upload(lead, "sums", suite_text(10))
    assert big.status_code == 400, big.json()
    assert "EVAL_MAX_UPLOAD_BYTES" in fields(big)["file"][0]
    assert not EvalSuite.objects.exists()


OUTSIDE = "points outside the schema; only local references (#/…) are allowed"


def test_a_schema_that_points_outside_is_a_400_naming_the_line_and_nothing_is_fetched(
        lead: Any):
    with recording_server() as server:
        ref = {"$ref": f"{server.url}/schema.json"}
        text = _lines(
            item(0),
            item(1, scorer="json_schema", references=[], params={"schema": {
                "type": "object", "properties": {"n": ref}}}),
            item(2, request={"response_format": {"type": "json_schema", "json_schema": {
                "name": "answer", "schema": ref}}}),
            item(3, request={"tools": [{"type": "function", "function": {
                "name": "lookup", "parameters": {"$schema": f"{server.url}/meta.json"}}}]}))
        answer = upload(lead, "remote", text)
        assert answer.status_code == 400, answer.json()
        assert fields(answer)["file"] == [
            f"line 2: params.schema: $ref '{server.url}/schema.json' {OUTSIDE}",
            f"line 3: request.response_format.json_schema.schema: "
            f"$ref '{server.url}/schema.json' {OUTSIDE}",
            f"line 4: request.tools[0].function.parameters: $schema '{server.url}/meta.json' "
            f"is not a JSON Schema draft fleetctl knows (2020-12, 2019-09, 7, 6 or 4); leave it "
            f"out for 2020-12"]
        assert server.hits == []
    assert not EvalSuite.objects.exists() and not EvalItem.objects.exists()


def test_a_file_reference_is_refused_alike_whether_the_file_exists_or_not(lead: Any,
                                                                          tmp_path: Path):
    secret = tmp_path / "demo-password"
    secret.write_text("7 correct horse\n")
    text = _lines(item(0, scorer="json_schema", references=[],
                       params={"schema": {"$ref": secret.as_uri()}}))
    present = upload(lead, "local-file", text)
    secret.unlink()
    absent = upload(lead, "local-file", text)
    assert present.status_code == absent.status_code == 400
    assert present.json() == absent.json()
    assert fields(present)["file"] == [f"line 1: params.schema: $ref '{secret.as_uri()}' {OUTSIDE}"]
    assert not EvalSuite.objects.exists()


DEPTH_REFUSED = ("is nested deeper than 64 levels (arrays and objects inside each other), the "
                 "depth limit")


@pytest.mark.parametrize("depth", REVIEWED_DEPTHS)
def test_a_line_nested_deeper_than_the_limit_is_a_400_naming_it_and_nothing_is_stored(
        lead: Any, depth: int):
    tools = {"tools": [{"type": "function", "function": {"name": "f",
                                                         "parameters": "@NESTED@"}}]}
    deep_item = with_nested(item(1, request=tools), depth)
    answer = upload(lead, "deep", _lines(item(0), deep_item, item(2)))
    assert answer.status_code == 400, answer.json()
    assert fields(answer)["file"] == [f"line 2: {DEPTH_REFUSED}"]
    assert not EvalSuite.objects.exists() and not EvalItem.objects.exists()


def test_a_json_schema_400_levels_deep_is_a_400_and_one_to_the_limit_uploads(lead: Any):
    def schema_item(depth: int) -> dict[str, Any]:
        return item(0, scorer="json_schema", references=[],
                    params={"schema": nested_schema(depth)})

    deep = upload(lead, "deep-schema", _lines(schema_item(400)))
    assert deep.status_code == 400, deep.json()
    assert fields(deep)["file"] == [f"line 1: {DEPTH_REFUSED}"]
    # The item holds the schema two levels down ({"params": {"schema": ...}}): a schema of
    # 61 levels makes a line of 63, the deepest nested_schema writes within the limit.
    fits = upload(lead, "deep-schema", _lines(schema_item(61)))
    assert fits.status_code == 201, fits.json()
    assert EvalItem.objects.get().params["schema"] == nested_schema(61)


@pytest.mark.parametrize("depth", REVIEWED_DEPTHS)
def test_a_json_body_nested_too_deeply_is_a_400_and_nothing_is_stored(lead: Any, depth: int):
    body = with_nested({"name": "deep", "file": "@NESTED@"}, depth)
    answer = lead.post(SUITES, body, content_type="application/json")
    assert answer.status_code == 400, answer.content[:300]
    assert answer.json()["error"]["code"] == "invalid"
    # Shallower bodies parse, and are refused for not being a file upload.
    assert depth < 5000 or "nested too deeply" in answer.json()["error"]["message"]
    assert not EvalSuite.objects.exists()


def test_reads_need_read_and_writes_need_jobs(token_client: Any, suite: EvalSuite,
                                              plan: Plan):
    reader = token_client(["read"], "platform-lead")
    assert reader.get(SUITES).status_code == 200
    assert reader.get(f"{SUITES}{suite.pk}/items/").status_code == 200
    assert reader.get(f"{SUITES}{suite.pk}/download/").status_code == 200
    assert reader.get(RUNS).status_code == 200
    refused = [
        upload(reader, "other", suite_text()),
        reader.post(f"{SUITES}{suite.pk}/retire/"),
        reader.post(f"{SUITES}bundled/", {"names": ["fleetctl-arithmetic"]}, format="json"),
        reader.post(RUNS, {"suite": "sums", "plan": plan.name}, format="json"),
    ]
    assert [a.status_code for a in refused] == [403] * 4, [a.json() for a in refused]
    assert EvalSuite.objects.count() == 1 and not EvalRun.objects.exists()
    assert not EvalSuite.objects.get().retired

    jobs = token_client(["read", "jobs"], "platform-lead")
    run = jobs.post(RUNS, {"suite": "sums", "plan": plan.name}, format="json")
    assert run.status_code == 201, run.json()
    assert reader.post(f"{RUNS}{run.json()['id']}/cancel/").status_code == 403
    assert EvalRun.objects.get().status == "queued"
    # A role without jobs, whatever the token's scopes.
    viewer = token_client(["read", "jobs"], "viewer")
    assert upload(viewer, "other", suite_text()).status_code == 403
    nobody = token_client(["jobs"], "platform-lead")
    assert nobody.get(SUITES).status_code == 403


def test_a_retired_suite_starts_no_run(lead: Any, suite: EvalSuite, plan: Plan):
    retired = lead.post(f"{SUITES}{suite.pk}/retire/")
    assert retired.status_code == 200, retired.json()
    assert retired.json()["retired"] is True and retired.json()["retired_by"]
    assert lead.post(f"{SUITES}{suite.pk}/retire/").status_code == 200  # idempotent
    assert lead.get(SUITES, {"retired": "false"}).json()["count"] == 0
    assert lead.get(SUITES, {"retired": "true"}).json()["count"] == 1
    assert lead.get(SUITES, {"retired": "maybe"}).status_code == 400
    by_id = lead.post(RUNS, {"suite": str(suite.pk), "plan": plan.name}, format="json")
    assert by_id.status_code == 400 and "retired" in fields(by_id)["suite"][0]
    by_name = lead.post(RUNS, {"suite": "sums", "plan": plan.name}, format="json")
    assert by_name.status_code == 400 and "suite" in fields(by_name)
    assert not EvalRun.objects.exists()
    # The download stays: a run that used it still names these bytes.
    assert lead.get(f"{SUITES}{suite.pk}/download/").status_code == 200


def test_the_bundled_suites_install_once(lead: Any):
    first = lead.post(f"{SUITES}bundled/", {"names": ["fleetctl-arithmetic"]}, format="json")
    assert first.status_code == 200, first.json()
    [bundled] = first.json()
    assert (bundled["name"], bundled["source"], bundled["item_count"]) == (
        "fleetctl-arithmetic", "bundled", 300)
    assert bundled["generator"]["family"] == "arithmetic"
    again = lead.post(f"{SUITES}bundled/", {"names": ["fleetctl-arithmetic"]}, format="json")
    assert [s["id"] for s in again.json()] == [bundled["id"]]
    unknown = lead.post(f"{SUITES}bundled/", {"names": ["mmlu"]}, format="json")
    assert unknown.status_code == 400 and "mmlu" in fields(unknown)["names"][0]
    assert EvalSuite.objects.count() == 1


# --- runs ------------------------------------------------------------------------------------

def test_a_run_is_started_for_a_plan_and_read_with_its_pools_and_progress(
        lead: Any, suite: EvalSuite, plan: Plan, world: World):  # noqa: F811
    answer = lead.post(RUNS, {"suite": "sums@1", "plan": plan.name, "concurrency": 4,
                              "max_rps": 5, "decoding": {"seed": 11}, "min_items": 2},
                       format="json")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert (body["plan"], body["candidate"], body["primary"], body["model"]) == (
        "mi300x-llama", "mi300x-us", "h200-us", MODEL)
    assert body["suite"] == {"id": suite.pk, "name": "sums", "version": 1,
                             "sha256": suite.sha256}
    assert (body["status"], body["verdict"], body["plan_stage"]) == ("queued", "", 1)
    assert body["progress"] == {"done": 0, "total": 8, "percent": 0.0}
    assert (body["concurrency"], body["max_rps"], body["min_items"]) == (4, 5.0, 2)
    assert body["decoding"]["seed"] == 11 and body["decoding"]["max_tokens"] == 32
    assert body["margin_pct"] == plan.quality_margin_pct
    assert [(p["name"], p["role"], p["position"]) for p in body["pools"]] == [
        ("mi300x-us", "candidate", 0), ("h200-us", "primary", 1)]
    assert body["pools"][0]["fingerprint"] and body["pools"][0]["endpoints"]
    assert body["stats"] == {} and body["evidence_url"] is None
    assert body["url"] == f"/evals/runs/{body['id']}/"

    run = EvalRun.objects.get()
    EvalRun.objects.filter(pk=run.pk).update(status="running")
    scored_run(run, "mi300x-us", "h200-us")
    halfway = lead.get(f"{RUNS}{run.pk}/").json()
    assert halfway["progress"] == {"done": 8, "total": 8, "percent": 100.0}
    services.run_finish(EvalRun.objects.get(pk=run.pk))
    done = lead.get(f"{RUNS}{run.pk}/").json()
    assert done["status"] == "complete" and done["verdict"] in ("pass", "warn", "fail")
    assert set(done["stats"]["pools"]) == {"mi300x-us", "h200-us"}
    assert done["stats"]["pools"]["h200-us"]["n"] == 4
    assert done["stats"]["paired"]["n"] == 4
    assert done["summary"]
    evidence = Evidence.objects.get(pk=done["evidence_id"])
    assert (evidence.kind, evidence.pool.name) == ("eval", "mi300x-us")
    assert done["evidence_url"] == f"/api/v1/evidence/{evidence.pk}/"
    assert done["live_evidence_id"] is None  # made in stage 1, never live-quality

    for params, count in (({"plan": plan.name}, 1), ({"plan": "other"}, 0),
                          ({"status": "complete"}, 1), ({"status": "queued"}, 0),
                          ({"suite": "sums"}, 1), ({"pool": "h200-us"}, 1),
                          ({"pool": "nope"}, 0), ({"verdict": done["verdict"]}, 1)):
        assert lead.get(RUNS, params).json()["count"] == count, params
    assert lead.get(RUNS, {"status": "sideways"}).status_code == 400


def test_a_run_without_a_plan_names_its_pools(lead: Any, suite: EvalSuite,
                                              world: World):  # noqa: F811
    answer = lead.post(RUNS, {"suite": str(suite.pk), "candidate": "mi300x-us",
                              "margin_pct": 5}, format="json")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert (body["plan"], body["candidate"], body["primary"], body["margin_pct"]) == (
        None, "mi300x-us", None, 5)
    assert body["progress"]["total"] == 4
    # Nothing to diff against.
    diff = lead.get(f"{RUNS}{body['id']}/diff/")
    assert diff.status_code == 400 and "no primary" in diff.json()["error"]["message"]


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"suite": "nope"}, "suite", "No suite 'nope'"),
    ({"suite": "sums@9"}, "suite", "No suite"),
    ({"suite": 3}, "suite", "text"),
    ({"plan": "nope"}, "plan", "No plan named nope"),
    ({"plan": None, "candidate": None}, "candidate", "Name the candidate"),
    ({"plan": None, "candidate": "nope"}, "candidate", "No pool named nope"),
    ({"plan": None, "candidate": "mi300x-us", "primary": "mi300x-us"}, "primary",
     "named twice"),
    ({"plan": None, "candidate": "mi300x-us", "others": ["h200-us", "h200-us"]}, "others",
     "named twice"),
    ({"plan": None, "candidate": "mi300x-us", "model": "other-model"}, "candidate",
     "does not serve other-model"),
    ({"candidate": "h200-us"}, "candidate", "migrates to mi300x-us"),
    ({"concurrency": 0}, "concurrency", "from 1 to 256"),
    ({"concurrency": 4.5}, "concurrency", "from 1 to 256"),
    ({"concurrency": True}, "concurrency", "from 1 to 256"),
    ({"max_rps": 0}, "max_rps", "from 0.01 to 10000"),
    ({"timeout_s": 0}, "timeout_s", "from 1 to 3600"),
    ({"max_attempts": 11}, "max_attempts", "from 1 to 10"),
    ({"confidence": 1.5}, "confidence", "from 0.5 to 0.999"),
    ({"min_items": 0}, "min_items", "from 1 to 1000000"),
    ({"margin_pct": 101}, "margin_pct", "from 0"),
    ({"margin_pct": 7}, "margin_pct", "quality margin is 2 points"),
    ({"decoding": {"top_k": 5}}, "decoding", "top_k"),
    ({"decoding": {"temperature": 9}}, "decoding", "temperature"),
    ({"decoding": "hot"}, "decoding", ""),
])
def test_bad_run_values_are_400s_naming_the_field_and_storing_nothing(
        lead: Any, suite: EvalSuite, plan: Plan, body: dict[str, Any], field: str, says: str):
    answer = lead.post(RUNS, {"suite": "sums", "plan": plan.name, **body}, format="json")
    assert answer.status_code == 400, answer.json()
    messages = fields(answer)
    assert field in messages, messages
    assert says in " ".join(messages[field]), messages
    assert not EvalRun.objects.exists() and not EvalResult.objects.exists()


def test_cancel_stops_an_active_run_once(lead: Any, suite: EvalSuite, plan: Plan):
    run = lead.post(RUNS, {"suite": "sums", "plan": plan.name}, format="json").json()
    cancelled = lead.post(f"{RUNS}{run['id']}/cancel/")
    assert cancelled.status_code == 200, cancelled.json()
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["cancelled_by"]
    again = lead.post(f"{RUNS}{run['id']}/cancel/")
    assert again.status_code == 409 and "cancelled" in again.json()["error"]["message"]
    assert lead.post(f"{RUNS}999999/cancel/").status_code == 404


# --- results, diff, export -------------------------------------------------------------------

@pytest.fixture
def diffed(lead: Any, suite: EvalSuite, plan: Plan) -> EvalRun:
    answer = lead.post(RUNS, {"suite": "sums", "plan": plan.name}, format="json")
    return scored_run(EvalRun.objects.get(pk=answer.json()["id"]), "mi300x-us", "h200-us")


def test_results_are_read_with_their_filters(client_for: Any, diffed: EvalRun):
    viewer = client_for("viewer")
    url = f"{RUNS}{diffed.pk}/results/"
    every = viewer.get(url).json()
    assert every["count"] == 8
    assert [(r["item"], r["pool"], r["role"]) for r in every["results"][:2]] == [
        ("sum-000", "mi300x-us", "candidate"), ("sum-000", "h200-us", "primary")]
    first = every["results"][0]
    assert (first["status"], first["score"], first["text"], first["latency_ms"]) == (
        "done", 1.0, "0", 12.5)
    assert first["tags"] == ["arithmetic", "parity:even"]
    for params, count in (({"pool": "mi300x-us"}, 4), ({"status": "done"}, 8),
                          ({"status": "pending"}, 0), ({"tag": "parity:odd"}, 4),
                          ({"score": 0}, 4), ({"max_score": 0.5, "pool": "h200-us"}, 2),
                          ({"min_score": 1}, 4), ({"item": "sum-002"}, 2)):
        assert viewer.get(url, params).json()["count"] == count, params
    assert viewer.get(url, {"status": "lost"}).status_code == 400
    assert viewer.get(url, {"score": "high"}).status_code == 400


def test_the_diff_shows_the_items_scored_differently_side_by_side(client_for: Any,
                                                                   diffed: EvalRun):
    viewer = client_for("viewer")
    url = f"{RUNS}{diffed.pk}/diff/"
    diff = viewer.get(url).json()
    assert diff["count"] == 2
    regressed, improved = diff["results"]
    assert (regressed["item"], regressed["direction"], regressed["delta"]) == (
        "sum-001", "regressed", -1.0)
    assert regressed["candidate"] == {
        "pool": "mi300x-us", "score": 0.0, "reason": "wrong number",
        "extracted": "=HYPERLINK(\"http://x", "text": "=HYPERLINK(\"http://x\")", "error": "",
        "endpoint": ""}
    assert (regressed["primary"]["pool"], regressed["primary"]["score"],
            regressed["primary"]["text"]) == ("h200-us", 1.0, "2")
    assert regressed["prompt"] == "What is 1 + 1? Reply with a number."
    assert regressed["references"] == ["2"] and regressed["scorer"] == "numeric"
    assert (improved["item"], improved["direction"], improved["delta"]) == (
        "sum-002", "improved", 1.0)
    for params, items in (({"direction": "regressed"}, ["sum-001"]),
                          ({"direction": "improved"}, ["sum-002"]),
                          ({"tag": "parity:odd"}, ["sum-001"]),
                          ({"tag": "arithmetic"}, ["sum-001", "sum-002"]),
                          ({"q": "hyperlink"}, ["sum-001"]),  # the candidate's answer
                          ({"q": "5"}, ["sum-002"]),  # the primary's answer
                          ({"q": "2 + 2"}, ["sum-002"]),  # the prompt
                          ({"q": "sum-00"}, ["sum-001", "sum-002"])):  # the id
        assert [r["item"] for r in viewer.get(url, params).json()["results"]] == items, params
    bad = viewer.get(url, {"direction": "sideways"})
    assert bad.status_code == 400 and "direction" in fields(bad)


def test_the_diff_exports_as_formula_safe_csv_and_as_json(client_for: Any, diffed: EvalRun):
    viewer = client_for("viewer")
    url = f"{RUNS}{diffed.pk}/export/"
    answer = viewer.get(url, {"format": "csv"})
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/csv")
    assert f'eval-run-{diffed.pk}-diff.csv' in answer["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))
    assert list(rows[0]) == CSV_COLUMNS
    assert [(r["item"], r["direction"], r["delta"]) for r in rows] == [
        ("sum-001", "regressed", "-1.0"), ("sum-002", "improved", "1.0")]
    # An answer that reads as a formula is text in a spreadsheet; numbers stay numbers.
    assert rows[0]["candidate_text"] == "'=HYPERLINK(\"http://x\")"
    assert rows[0]["candidate_extracted"].startswith("'=")
    assert rows[0]["primary_text"] == "2" and rows[0]["candidate_score"] == "0.0"
    assert rows[0]["tags"] == "arithmetic parity:odd"
    only = viewer.get(url, {"format": "csv", "direction": "improved"})
    assert len(list(csv.DictReader(io.StringIO(
        b"".join(only.streaming_content).decode())))) == 1

    as_json = viewer.get(url, {"format": "json"}, HTTP_ACCEPT="text/csv")
    assert as_json["Content-Type"] == "application/json"
    data = json.loads(b"".join(as_json.streaming_content))
    assert data["run"]["id"] == diffed.pk and data["run"]["suite"]["sha256"]
    assert [r["item"] for r in data["diff"]] == ["sum-001", "sum-002"]
    assert data["diff"][0]["candidate"]["text"] == "=HYPERLINK(\"http://x\")"  # JSON: as is

    bad = viewer.get(url, {"format": "xml"})
    assert bad.status_code == 400 and "format" in fields(bad)
    missing = viewer.get(f"{RUNS}999999/export/", {"format": "csv"})
    assert missing.status_code == 404 and missing["Content-Type"] == "application/json"


def test_unknown_ids_are_404s(client_for: Any):
    viewer = client_for("viewer")
    for url in (f"{SUITES}999999/", f"{SUITES}999999/items/", f"{SUITES}999999/download/",
                f"{RUNS}999999/", f"{RUNS}999999/results/", f"{RUNS}999999/diff/",
                f"{SUITES}abc/", f"{RUNS}abc/diff/"):
        answer = viewer.get(url)
        assert answer.status_code == 404, url
        assert answer["Content-Type"] == "application/json", url
