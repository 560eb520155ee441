"""Shadow runs over REST: started by plan name (201, running, the route's gateways told to
mirror), refused with a 400 that names the field and says what to do (or a 409 while the plan
has a running run) with nothing stored; read with `read`, started, adjusted and stopped with
`jobs`; the pairs with their filters, the judgements and the CSV/JSON exports."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleetctl.bench import services as bench
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import region_create
from fleetctl.shadow import live, services
from fleetctl.shadow.api.exports import CSV_COLUMNS
from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Route
from migrations_plan import services as plans
from migrations_plan.models import Plan
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture
from tests.shadow import forget_shadow_keys

pytestmark = pytest.mark.django_db
RUNS = "/api/v1/shadow-runs/"


def fields(answer: Any) -> dict[str, list[str]]:
    return answer.json()["error"]["fields"]


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """Runs publish their route to Redis (the collector's kill switch) and count there; the
    test database rolls back, Redis does not."""
    yield
    forget_shadow_keys(live.client())


@pytest.fixture
def plan(world: World) -> Plan:  # noqa: F811
    return world.plan()


def _start(client: Any, **body: Any) -> Any:
    return client.post(RUNS, {"plan": "mi300x-llama", **body}, format="json")


def _route() -> Route:
    return Route.objects.get(name="llama")


def _haproxy(system: Any, route: Route) -> None:
    """An HAProxy gateway carrying the route, never reached (no commit, no worker)."""
    traffic.gateway_create(actor=system, name="haproxy-a", kind="haproxy",
                           admin_address="/nonexistent/haproxy.sock", routes=[route],
                           options={"bind": "127.0.0.1:1",
                                    "config_path": "/nonexistent/haproxy.cfg",
                                    "master_socket": "/nonexistent/master.sock"})


# --- start -----------------------------------------------------------------------------------

def test_a_run_is_started_for_a_plan_and_its_route_mirrors(
        plan: Plan, client_for, django_capture_on_commit_callbacks):
    lead = client_for("platform-lead")
    with django_capture_on_commit_callbacks(execute=True):  # published once committed
        answer = _start(lead, sample_percent=12.5, content="off", min_pairs=50)
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert (body["plan"], body["route"], body["candidate"], body["primary"], body["model"]) == (
        "mi300x-llama", "llama", "mi300x-us", "h200-us", MODEL)
    assert (body["mode"], body["status"], body["verdict"], body["trace"]) == (
        "mirror", "running", "", None)
    assert (body["sample_percent"], body["content"], body["min_pairs"]) == (12.5, "off", 50)
    assert (body["max_rps"], body["max_tokens_per_day"], body["retention_hours"]) == (
        2.0, 2_000_000, 168)
    assert body["url"] == f"/shadow/runs/{body['id']}/"
    assert set(live.COUNTER_FIELDS) <= set(body["counters"])
    assert not any(body["counters"].values())
    assert body["latest_judgement"] is None and body["evidence_url"] is None
    assert body["mirror_supported"] is True and body["mirror_note"] == ""
    assert body["gateways_without_mirror"] == []
    assert _route().mirror_percent == 12.5
    assert live.client().hget(live.ROUTES_KEY, "llama") is not None

    # A second one while it runs: 409, nothing stored, the first one untouched.
    again = _start(lead)
    assert again.status_code == 409, again.json()
    assert "running" in again.json()["error"]["message"]
    assert ShadowRun.objects.count() == 1
    assert _route().mirror_percent == 12.5


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"plan": "nope"}, "plan", "No plan named nope"),
    ({"route": "nope"}, "route", "No route named nope"),
    ({"mode": "sideways"}, "mode", "Give mode as mirror"),
    ({"trace": "nope"}, "trace", "No trace named nope"),
    ({"sample_percent": 0}, "sample_percent", "from 0.01 to 100"),
    ({"sample_percent": 101}, "sample_percent", "from 0.01 to 100"),
    ({"sample_percent": "ten"}, "sample_percent", "from 0.01 to 100"),
    ({"sample_percent": True}, "sample_percent", "from 0.01 to 100"),
    ({"max_rps": None}, "max_rps", "from 0.01 to 1000"),
    ({"max_rps": 0}, "max_rps", "from 0.01 to 1000"),
    ({"max_tokens_per_day": 10}, "max_tokens_per_day", "from 1000"),
    ({"content": "some"}, "content", "full, redacted"),
    ({"retention_hours": 0}, "retention_hours", "from 1 to 2160"),
    ({"min_pairs": 5}, "min_pairs", "from 10 to 1000000"),
    ({"confidence": 1.5}, "confidence", "from 0.5 to 0.999"),
])
def test_bad_values_are_400s_that_name_the_field_and_store_nothing(
        plan: Plan, client_for, body, field, says):
    answer = _start(client_for("platform-lead"), **body)
    assert answer.status_code == 400, answer.json()
    assert any(says in message for message in fields(answer)[field]), fields(answer)
    assert not ShadowRun.objects.exists()
    assert _route().mirror_percent == 0


def _refused(answer: Any, field: str, *says: str) -> str:
    assert answer.status_code == 400, answer.json()
    text = " ".join(fields(answer).get(field, []))
    assert text, fields(answer)
    for words in says:
        assert words in text, text
    assert not ShadowRun.objects.exists()
    return text


def test_a_route_not_of_the_plan_is_refused(plan: Plan, world: World, client_for, system):  # noqa: F811
    traffic.route_create(actor=system, name="other", model_id=MODEL, primary_pool=world.primary,
                         latency_class="batch")
    _refused(_start(client_for("platform-lead"), route="other"), "route", "other")
    assert Route.objects.get(name="other").mirror_percent == 0


def test_a_candidate_outside_the_routes_pin_is_refused_naming_it(plan: Plan, world: World,  # noqa: F811
                                                                  client_for, system):
    # The candidate moves to an EU region after the plan was made; the route is pinned to US.
    eu = region_create(actor=system, code="eu-west", name="EU West", jurisdiction="EU")
    Pool.objects.filter(pk=world.candidate.pk).update(region=eu)
    Route.objects.filter(pk=world.route.pk).update(residency="US")
    answer = _start(client_for("platform-lead"))
    assert answer.status_code == 400, answer.json()
    assert "mi300x-us" in answer.json()["error"]["message"]
    assert not ShadowRun.objects.exists()
    assert _route().mirror_percent == 0


def test_mirroring_a_route_only_haproxy_carries_is_refused_saying_replay(
        plan: Plan, world: World, client_for, system):  # noqa: F811
    envoy = world.route.gateways.get()
    traffic.gateway_update(actor=system, gateway=envoy, routes=[])
    _haproxy(system, world.route)
    answer = _start(client_for("platform-lead"))
    assert answer.status_code == 400, answer.json()
    assert "HAProxy cannot mirror; start a replay run instead" in answer.json()["error"]["message"]
    assert not ShadowRun.objects.exists()


def test_replay_needs_a_trace_with_prompt_texts(plan: Plan, client_for, system):
    lead = client_for("platform-lead")
    _refused(_start(lead, mode="replay"), "trace")
    bench.trace_generate(actor=system, name="no-texts", n=5, seed=1)
    _refused(_start(lead, mode="replay", trace="no-texts"), "trace", "prompt")


def test_a_closed_plan_is_refused(plan: Plan, world: World, client_for):  # noqa: F811
    plans.abandon(actor=world.actor("author"), plan=plan, reason="wrong candidate")
    answer = _start(client_for("platform-lead"))
    assert answer.status_code in (400, 409), answer.json()
    assert "abandoned" in answer.json()["error"]["message"]
    assert not ShadowRun.objects.exists()


def test_reading_needs_read_and_starting_needs_jobs(plan: Plan, client_for, token_client):
    viewer = client_for("viewer")
    assert _start(viewer).status_code == 403
    assert viewer.get(RUNS).status_code == 200
    reader = token_client(["read"], "platform-lead")  # the role may, the token may not
    assert _start(reader).status_code == 403
    assert not ShadowRun.objects.exists()
    assert client_for(username="nobody").get(RUNS).status_code == 403
    jobs = token_client(["jobs"], "on-call")
    assert jobs.get(RUNS).status_code == 403  # a token without `read` reads nothing
    started = _start(jobs)
    assert started.status_code == 201, started.json()


# --- read, adjust, stop ------------------------------------------------------------------------

@pytest.fixture
def run(plan: Plan, world: World, django_capture_on_commit_callbacks) -> ShadowRun:  # noqa: F811
    with django_capture_on_commit_callbacks(execute=True):
        return services.run_create(actor=world.actor("lead"), plan=plan, min_pairs=10)


def test_list_filters_and_detail(run: ShadowRun, client_for):
    viewer = client_for("viewer")
    for query, found in [({}, [run.pk]), ({"plan": "mi300x-llama"}, [run.pk]),
                         ({"plan": "other"}, []), ({"status": "running"}, [run.pk]),
                         ({"status": "stopped"}, []), ({"mode": "mirror"}, [run.pk]),
                         ({"mode": "replay"}, []), ({"candidate": "mi300x-us"}, [run.pk]),
                         ({"candidate": "h200-us"}, [])]:
        listed = viewer.get(RUNS, query)
        assert listed.status_code == 200, listed.json()
        assert [r["id"] for r in listed.json()["results"]] == found, query
    for bad in ({"status": "sideways"}, {"mode": "both"}):
        assert set(fields(viewer.get(RUNS, bad))) == set(bad)
    detail = viewer.get(f"{RUNS}{run.pk}/")
    assert detail.status_code == 200 and detail.json()["status"] == "running"
    assert viewer.get(f"{RUNS}999999/").status_code == 404
    assert viewer.get(f"{RUNS}abc/").status_code == 404


def test_live_counters_are_read_from_redis(run: ShadowRun, client_for):
    live.count(run.pk, received=40, sampled=7, dropped_rate=3)
    body = client_for("viewer").get(f"{RUNS}{run.pk}/").json()
    assert (body["counters"]["received"], body["counters"]["sampled"],
            body["counters"]["dropped_rate"], body["counters"]["pairs"]) == (40, 7, 3, 0)


def test_a_running_run_is_adjusted_with_jobs(run: ShadowRun, client_for):
    url = f"{RUNS}{run.pk}/"
    assert client_for("viewer").patch(url, {"sample_percent": 50}, format="json"
                                      ).status_code == 403
    oncall = client_for("on-call")
    answer = oncall.patch(url, {"sample_percent": 25, "max_rps": 5, "content": "off"},
                          format="json")
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert (body["sample_percent"], body["max_rps"], body["content"]) == (25, 5, "off")
    run.refresh_from_db()
    assert (run.sample_percent, run.max_rps, run.content) == (25, 5, "off")
    assert _route().mirror_percent == 25

    for bad, field, says in [({}, "non_field_errors", "Nothing to change"),
                             ({"plan": "other"}, "plan", "cannot change while the run"),
                             ({"mode": "replay"}, "mode", "stop it and start another"),
                             ({"min_pairs": 1}, "min_pairs", "from 10")]:
        refused = oncall.patch(url, bad, format="json")
        assert refused.status_code == 400, refused.json()
        assert says in " ".join(fields(refused)[field]), fields(refused)
    run.refresh_from_db()
    assert (run.sample_percent, run.min_pairs) == (25, 10)


def test_stop_is_one_call_with_a_reason_and_turns_the_mirror_off(run: ShadowRun, client_for):
    assert live.client().hget(live.ROUTES_KEY, "llama") is not None
    stop = f"{RUNS}{run.pk}/stop/"
    assert client_for("viewer").post(stop, {"reason": "x"}, format="json").status_code == 403
    oncall = client_for("on-call")
    for bad in ({}, {"reason": "   "}, {"reason": 7}):
        refused = oncall.post(stop, bad, format="json")
        assert refused.status_code == 400 and "reason" in fields(refused), refused.json()
    assert ShadowRun.objects.get(pk=run.pk).status == "running"

    answer = oncall.post(stop, {"reason": "candidate pages at night"}, format="json")
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert (body["status"], body["stop_reason"], body["stopped_by"]) == (
        "stopped", "candidate pages at night", "on-call")
    assert live.client().hget(live.ROUTES_KEY, "llama") is None  # the collector stops
    assert _route().mirror_percent == 0
    again = oncall.post(stop, {"reason": "again"}, format="json")
    assert again.status_code == 409, again.json()
    adjust = oncall.patch(f"{RUNS}{run.pk}/", {"sample_percent": 5}, format="json")
    assert adjust.status_code == 409, adjust.json()
    assert oncall.post(f"{RUNS}999999/stop/", {"reason": "x"}, format="json").status_code == 404
    # Stopped, the plan may start another.
    assert _start(oncall).status_code == 201


# --- pairs, judgements, exports ------------------------------------------------------------------

def _metrics(diverged: int, **more: int) -> dict[str, int]:
    return {"diverged": diverged, "finish_mismatch": 0, "error_mismatch": 0,
            "errored_a": 0, "errored_b": 0, "refusal_a": 0, "refusal_b": 0,
            "refusal_mismatch": 0, "exact_match": 1 - diverged, **more}


def _side(endpoint: str, **more: Any) -> dict[str, Any]:
    return {"endpoint": endpoint, "status": 200, "error": "", "finish": "stop",
            "prompt_tokens": 20, "completion_tokens": 30, "ttft_ms": 40.0, "tpot_ms": 5.0,
            "latency_ms": 190.0, "text_sha256": "0" * 64, **more}


def _pair(run: ShadowRun, n: int, *, diverged: bool = False, error: str = "",
          score: float = 0.0, content: dict[str, str] | None = None) -> ShadowPair:
    sides = {"primary": _side("http://10.0.0.1:8000"), "secondary": _side("http://10.0.0.2:8000"),
             "candidate": _side("http://10.0.1.1:8000", status=500 if error else 200,
                                error=error, finish="" if error else "stop")}
    return ShadowPair.objects.create(
        run=run, source="mirror", received_at=timezone.now() - timedelta(seconds=100 - n),
        request_hash=f"{n:064x}", greedy=True,
        params={"model": MODEL, "temperature": 0, "stream": False, "max_tokens": 64},
        sides=sides, content=content or {}, noise=_metrics(0),
        signal=_metrics(int(diverged), error_mismatch=int(bool(error))),
        noise_diverged=False, signal_diverged=diverged, candidate_error=bool(error),
        divergence_score=score)


@pytest.fixture
def pairs(run: ShadowRun) -> list[ShadowPair]:
    return [
        _pair(run, 1, content={"prompt": "hi", "primary": "hello", "secondary": "hello",
                               "candidate": "hello"}),
        _pair(run, 2, diverged=True, score=0.4),
        _pair(run, 3, diverged=True, score=1.0, error="=HYPERLINK(\"http://x\",\"boom\")"),
        _pair(run, 4, diverged=True, score=0.7),
    ]


def test_pairs_are_paginated_and_filtered(run: ShadowRun, pairs: list[ShadowPair], client_for):
    viewer = client_for("viewer")
    url = f"{RUNS}{run.pk}/pairs/"

    def ids(**query: Any) -> list[int]:
        answer = viewer.get(url, query)
        assert answer.status_code == 200, answer.json()
        return [p["id"] for p in answer.json()["results"]]

    p1, p2, p3, p4 = (p.pk for p in pairs)
    assert ids() == [p4, p3, p2, p1]  # newest first
    assert ids(diverged="true") == [p4, p3, p2]
    assert ids(diverged="false") == [p1]
    assert ids(candidate_error="true") == [p3]
    assert ids(order="-divergence_score") == [p3, p4, p2, p1]
    assert ids(diverged="true", order="divergence_score", page_size=2) == [p2, p4]
    for bad in ({"diverged": "yes"}, {"candidate_error": "1"}, {"order": "-ttft"}):
        refused = viewer.get(url, bad)
        assert refused.status_code == 400 and set(fields(refused)) == set(bad), refused.json()
    rows = {p["id"]: p for p in viewer.get(url).json()["results"]}
    assert rows[p1]["content"]["candidate"] == "hello"
    assert rows[p2]["content"] is None  # nothing stored for it
    assert rows[p3]["sides"]["candidate"]["status"] == 500 and rows[p3]["candidate_error"]
    assert viewer.get(f"{RUNS}999999/pairs/").status_code == 404


def test_exports_carry_metrics_never_text_and_csv_cells_cannot_run(
        run: ShadowRun, pairs: list[ShadowPair], client_for):
    viewer = client_for("viewer")
    url = f"{RUNS}{run.pk}/export/"
    answer = viewer.get(url, {"format": "csv"})
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/csv")
    assert f"shadow-run-{run.pk}.csv" in answer["Content-Disposition"]
    table = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))
    assert list(table[0]) == CSV_COLUMNS
    assert [int(r["pair"]) for r in table] == [p.pk for p in pairs]  # oldest first
    assert len(CSV_COLUMNS) == len(set(CSV_COLUMNS))
    errored = next(r for r in table if r["candidate_error"] == "1")
    assert int(errored["pair"]) == pairs[2].pk
    assert (errored["signal_error_mismatch"], errored["candidate_status"]) == ("1", "500")
    # The error text a pool sent back cannot run as a formula in a spreadsheet.
    assert errored["candidate_error_text"] == "'=HYPERLINK(\"http://x\",\"boom\")"
    assert errored["divergence_score"] == "1.0" and errored["model"] == MODEL
    assert "hello" not in json.dumps(table)

    as_json = viewer.get(url, {"format": "json"})
    assert as_json.status_code == 200 and as_json["Content-Type"] == "application/json"
    body = json.loads(b"".join(as_json.streaming_content))
    assert body["run"]["id"] == run.pk and len(body["pairs"]) == 4
    assert "content" not in body["pairs"][0] and "hello" not in json.dumps(body)
    assert json.loads(b"".join(viewer.get(url).streaming_content))["run"]["id"] == run.pk

    # ?format= decides, whatever the client's Accept header says.
    assert viewer.get(url, {"format": "csv"}, HTTP_ACCEPT="application/json"
                      )["Content-Type"].startswith("text/csv")
    refused = viewer.get(url, {"format": "xml"})
    assert refused.status_code == 400 and "format" in fields(refused), refused.content
    assert viewer.get(f"{RUNS}999999/export/", {"format": "csv"}).status_code == 404
    assert client_for(username="nobody").get(url, {"format": "csv"}).status_code == 403


def test_judgements_and_the_latest_per_metric(run: ShadowRun, pairs: list[ShadowPair],
                                              client_for):
    viewer = client_for("viewer")
    services.run_judge(run=run)
    judged = viewer.get(f"{RUNS}{run.pk}/").json()
    latest = judged["latest_judgement"]
    assert latest is not None and latest["pairs"] == 4
    metrics = {m["metric"]: m for m in latest["metrics"]}
    assert metrics["divergence"]["gated"] is True and metrics["diverged_any"]["gated"] is False
    assert metrics["divergence"]["n"] == 4
    assert metrics["divergence"]["signal_rate"] == pytest.approx(0.75)
    assert metrics["divergence"]["noise_rate"] == 0
    assert latest["metrics"][0]["gated"]  # gated metrics first
    assert judged["verdict"] == "insufficient"  # 4 pairs of the 10 needed
    series = viewer.get(f"{RUNS}{run.pk}/judgements/")
    assert series.status_code == 200
    assert [j["id"] for j in series.json()["results"]] == list(
        ShadowJudgement.objects.filter(run=run).values_list("pk", flat=True))


def test_the_detail_says_when_some_gateways_cannot_mirror(run: ShadowRun, world: World,  # noqa: F811
                                                          client_for, system):
    _haproxy(system, world.route)
    body = client_for("viewer").get(f"{RUNS}{run.pk}/").json()
    assert body["mirror_supported"] is True
    assert "haproxy-a cannot" in body["mirror_note"]
