"""The read-only telemetry API: answers, scope, and 400s that name the parameter."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleetctl.telemetry.models import Cursor
from fleetctl.telemetry.services import window_add, window_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def windows(make_pool: Any) -> Any:
    make_pool("pa")
    make_pool("pb")
    now = window_start(timezone.now().timestamp(), 10)
    window_add(source="gateway", source_name="gw-a", route="chat", pool="pa", resolution_s=10,
               start=now, counts={"requests": 20, "errors": 2, "streamed": 20},
               histograms={"ttft": {"60": 20}})
    window_add(source="gateway", source_name="gw-a", route="code", pool="pa", resolution_s=10,
               start=now, counts={"requests": 5})
    return now


def test_summary_lists_pools_with_figures(token_client: Any, windows: Any) -> None:
    answer = token_client(["read"], "viewer").get("/api/v1/telemetry/pools/")
    assert answer.status_code == 200, answer.content
    rows = {row["pool"]: row for row in answer.json()}
    assert set(rows) == {"pa", "pb"}
    assert rows["pa"]["requests"] == 25 and rows["pa"]["error_rate"]["value"] == 0.08
    assert rows["pa"]["ttft_p95"]["n"] == 20
    assert "gw-a" in rows["pa"]["ttft_p95"]["source"]
    assert rows["pb"]["requests"] == 0 and rows["pb"]["ttft_p95"]["value"] is None
    only = token_client(["read"], "viewer").get("/api/v1/telemetry/pools/?pool=pb&window_s=30")
    assert [row["pool"] for row in only.json()] == ["pb"]


def test_detail_with_route_and_series(token_client: Any, windows: Any) -> None:
    client = token_client(["read"], "viewer")
    answer = client.get("/api/v1/telemetry/pools/pa/", {"route": "chat"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["stats"]["route"] == "chat" and body["stats"]["requests"] == 20
    assert [point["requests"] for point in body["series"]] == [20]
    since = (windows - timedelta(minutes=1)).isoformat()
    until = (windows + timedelta(seconds=10)).isoformat()
    ranged = client.get("/api/v1/telemetry/pools/pa/",
                        {"since": since, "until": until, "resolution_s": 60})
    assert ranged.status_code == 200 and ranged.json()["stats"]["requests"] == 25


def test_client_disconnects_are_answered_beside_the_error_rate_and_not_in_it(
        token_client: Any, windows: Any) -> None:
    window_add(source="gateway", source_name="gw-a", route="chat", pool="pa", resolution_s=10,
               start=windows, counts={"client_disconnects": 30})
    client = token_client(["read"], "viewer")
    row = {r["pool"]: r for r in client.get("/api/v1/telemetry/pools/").json()}["pa"]
    assert (row["requests"], row["errors"], row["client_disconnects"]) == (25, 2, 30)
    assert row["error_rate"]["value"] == 0.08 and row["error_rate"]["n"] == 25
    assert row["disconnect_rate"]["value"] == pytest.approx(30 / 55)
    assert row["disconnect_rate"]["n"] == 55
    detail = client.get("/api/v1/telemetry/pools/pa/", {"route": "chat"}).json()
    assert detail["stats"]["client_disconnects"] == 30
    assert [p["client_disconnects"] for p in detail["series"]] == [30]
    schema = client.get("/api/schema/?format=json").content.decode()
    assert "client_disconnects" in schema and "disconnect_rate" in schema


@pytest.mark.parametrize(("path", "params", "field"), [
    ("/api/v1/telemetry/pools/", {"window_s": "soon"}, "window_s"),
    ("/api/v1/telemetry/pools/", {"window_s": "0"}, "window_s"),
    ("/api/v1/telemetry/pools/", {"window_s": "999999"}, "window_s"),
    ("/api/v1/telemetry/pools/pa/", {"since": "yesterday"}, "since"),
    ("/api/v1/telemetry/pools/pa/", {"since": "2026-12-02T12:00:00Z",
                                     "until": "2026-12-02T11:00:00Z"}, "since"),
    ("/api/v1/telemetry/pools/pa/", {"since": "2026-01-01T00:00:00Z",
                                     "until": "2026-12-01T00:00:00Z"}, "since"),
    ("/api/v1/telemetry/pools/pa/", {"resolution_s": "7"}, "resolution_s"),
])
def test_bad_parameters_are_400_naming_them(token_client: Any, windows: Any, path: str,
                                            params: dict[str, str], field: str) -> None:
    answer = token_client(["read"], "viewer").get(path, params)
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert field in error["fields"] and error["message"]


def test_unknown_pool_is_404(token_client: Any, windows: Any) -> None:
    answer = token_client(["read"], "viewer").get("/api/v1/telemetry/pools/nope/")
    assert answer.status_code == 404 and "nope" in answer.json()["error"]["message"]


def test_ingest_status(token_client: Any, db: None) -> None:
    Cursor.objects.create(source_name="gw-a", path="/logs/a.log", lines=3, malformed=1,
                          last_read_at=timezone.now())
    answer = token_client(["read"], "viewer").get("/api/v1/telemetry/ingest/")
    assert answer.status_code == 200
    [row] = answer.json()
    assert (row["source"], row["lines"], row["malformed"]) == ("gw-a", 3, 1)
    assert row["lag_s"] >= 0


def test_needs_credentials_with_read(api: Any, token_client: Any, db: None) -> None:
    assert api.get("/api/v1/telemetry/pools/").status_code in (401, 403)
    assert token_client(["ramp"], "viewer").get("/api/v1/telemetry/ingest/").status_code == 403


def test_documented_in_the_schema(token_client: Any, db: None) -> None:
    schema = token_client(["read"], "viewer").get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/telemetry/pools/{name}/" in paths and "/api/v1/telemetry/ingest/" in paths
    names = {p["name"] for p in paths["/api/v1/telemetry/pools/"]["get"]["parameters"]}
    assert {"window_s", "pool"} <= names
