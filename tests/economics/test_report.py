"""The migration report (fleetctl/economics/report.py): a plan walked through its stages with
benchmark, conformance and eval evidence, approvals, a live step and a drain; the report
rendered as HTML and as a PDF by WeasyPrint, the PDF's text read back with pypdf and its
figures and evidence hashes checked against the rows; the same rows and generation time give
the same bytes and one changed row changes them; 404, 400 and 503 answers; who may read."""

from __future__ import annotations

import io
import sys
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from pypdf import PdfReader

from fleetctl.accounts.actor import Actor
from fleetctl.economics import report as reports
from fleetctl.economics.services import business_case_update
from migrations_plan import services as plans
from migrations_plan.models import Approval, Plan
from tests.bench.test_cost_rules import bench
from tests.migrations_plan.conftest import world  # noqa: F401
from tests.migrations_plan.helpers import walk_to
from tests.migrations_plan.test_services import _ramp

# A fixed generation time, a minute ahead (the business case takes evidence of the last 30
# days before it).
AT = (datetime.now(UTC) + timedelta(minutes=1)).replace(microsecond=0)
SYSTEM = Actor.for_system("conformance-probe")


def _pdf_text(body: bytes) -> str:
    return " ".join(page.extract_text() for page in PdfReader(io.BytesIO(body)).pages)


@pytest.fixture
def walked(world):  # noqa: F811
    """The plan at stage 4 after three approved gates, benchmarked on both pools (run 7, one
    trace), conformance- and eval-checked, 10 % live, then paused (a drain of the candidate)
    and resumed; a business case with an expected volume."""
    plan = world.plan()
    for pool in (world.candidate, world.primary):
        plans.evidence_record(actor=SYSTEM, pool=pool, kind="conformance", verdict="pass",
                              summary=f"OpenAI contract on {pool.name}: 42 of 42 probes pass")
    plans.evidence_record(actor=Actor.for_system("eval-runner"), pool=world.candidate,
                          kind="eval", verdict="pass", summary="412/420 eval cases")
    bench(world.candidate, run=7, cost="4.1234")
    bench(world.primary, run=7, cost="5.0000")
    business_case_update(actor=world.actor("lead"), plan=plan,
                         expected_mtokens_per_month="10000")
    plan = walk_to(world, plan, 4)
    _ramp(world, 10)
    plan = plans.pause(actor=world.actor("oncall"), plan=plan, reason="p95 regression")
    plan = plans.resume(actor=world.actor("lead"), plan=plan, reason="fixed")
    return world, Plan.objects.get(pk=plan.pk)


def test_the_report_writes_down_the_rows_and_the_pdf_says_the_same(walked):
    _w, plan = walked
    report = reports.build(plan, AT)
    html = reports.render_html(report, AT)
    pdf = reports.render_pdf(report, AT)
    assert pdf.startswith(b"%PDF-")
    text = " ".join(_pdf_text(pdf).split())
    approvals = list(Approval.objects.filter(plan=plan).order_by("at", "id"))
    assert len(approvals) == 3
    for approval in approvals:
        # Hashes may wrap across lines in the PDF: compare with whitespace removed.
        assert approval.snapshot_hash in html
        assert approval.snapshot_hash in text.replace(" ", ""), approval.snapshot_hash
    for figure in ("4.1234 USD", "5.0000 USD", "42 of 42 probes pass", "412/420 eval cases",
                   "p95 regression", "10000.000 M output tokens a month",
                   f"Generated {AT:%Y-%m-%d %H:%M:%S} UTC"):
        assert figure in html, figure
        assert figure in text, figure
    # The business case's arbitrage from the rows: 5.0000 − 4.1234 = 0.8766 per 1M.
    costs = next(s for s in report.sections if s.key == "costs")
    case = dict(costs.tables[2].rows)
    assert case["Arbitrage per 1M"] == "0.8766 USD"
    assert "0.8766 USD" in text
    # Cost per success and the tax: neither pool is interruptible, no request was logged.
    per_success = next(s for s in report.sections if s.key == "per-success")
    taxes = per_success.tables[0].rows
    assert [row[1] for row in taxes] == ["no", "no"], taxes
    live = next(s for s in report.sections if s.key == "costs").tables[1]
    assert live.caption == "Live cost per successful request"
    assert all(row[-1].startswith("not measured: the gateways logged no request")
               for row in live.rows), live.rows
    assert "Cost per successful task and the interruption tax" in text
    # The drain of the candidate the pause ran is in the ramps section, as it ended (the
    # world's gateway has no config directory: it failed, and the report says so).
    drains = next(s for s in report.sections if s.key == "ramps").tables[-1]
    assert len(drains.rows) == 1
    assert drains.rows[0][3].endswith("p95 regression") and drains.rows[0][4] == "failed"
    # Ordered by time then id: the approvals' rows follow their creation.
    listed = next(s for s in report.sections if s.key == "approvals").tables[0].rows
    assert [row[0] for row in listed] == [str(a.pk) for a in approvals]
    reader = PdfReader(io.BytesIO(pdf))
    assert reader.metadata.title == f"Migration report: {plan.name}"
    assert reader.metadata["/CreationDate"].startswith(f"D:{AT:%Y%m%d%H%M%S}")


def test_the_same_rows_give_the_same_bytes_and_one_changed_row_changes_them(walked):
    w, plan = walked
    first = reports.build(plan, AT)
    html, pdf = reports.render_html(first, AT), reports.render_pdf(first, AT)
    again = reports.build(plan, AT)
    assert reports.render_html(again, AT) == html
    assert reports.render_pdf(again, AT) == pdf
    assert again.rows_sha256 == first.rows_sha256
    # Another generation time: other bytes, the same rows hash.
    later = AT + timedelta(seconds=1)
    other = reports.build(plan, later)
    assert other.rows_sha256 == first.rows_sha256
    assert reports.render_pdf(other, later) != pdf
    # One more row: other bytes and another hash.
    plans.evidence_record(actor=SYSTEM, pool=w.candidate, kind="conformance",
                          verdict="pass", summary="OpenAI contract: 43 of 43 probes pass")
    changed = reports.build(plan, AT)
    assert changed.rows_sha256 != first.rows_sha256
    assert reports.render_html(changed, AT) != html
    assert reports.render_pdf(changed, AT) != pdf


def test_a_pdf_asked_again_while_its_rows_hold_is_the_one_made(walked):
    # Making one takes seconds for a month of history: the same rows give the PDF made
    # before (it says when it was generated), a changed row a new one.
    from django.core.cache import cache

    w, plan = walked
    cache.clear()
    viewer = Client()
    viewer.force_login(w.viewer)
    first = viewer.get(f"/plans/{plan.name}/report.pdf")
    again = viewer.get(f"/plans/{plan.name}/report.pdf")
    assert first.status_code == again.status_code == 200
    assert again.content == first.content
    assert again["Content-Disposition"] == first["Content-Disposition"]
    plans.evidence_record(actor=SYSTEM, pool=w.candidate, kind="conformance",
                          verdict="pass", summary="OpenAI contract: 44 of 44 probes pass")
    changed = viewer.get(f"/plans/{plan.name}/report.pdf")
    assert changed.content != first.content
    assert "44 of 44 probes pass" in " ".join(_pdf_text(changed.content).split())


def test_pages_links_and_who_may_read(walked, make_user):
    w, plan = walked
    viewer = Client()
    viewer.force_login(w.viewer)
    page = viewer.get(f"/plans/{plan.name}/report/")
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    assert b"Approvals and the evidence each saw" in page.content
    assert f'href="/plans/{plan.name}/report.pdf"'.encode() in page.content
    pdf = viewer.get(f"/plans/{plan.name}/report.pdf")
    assert pdf.status_code == 200 and pdf["Content-Type"] == "application/pdf"
    assert pdf.content.startswith(b"%PDF-")
    for where in (f"/plans/{plan.name}/", f"/plans/{plan.name}/business-case/"):
        assert f'href="/plans/{plan.name}/report.pdf"'.encode() in viewer.get(where).content
    assert viewer.get("/plans/no-such-plan/report/").status_code == 404
    assert viewer.get("/plans/no-such-plan/report.pdf").status_code == 404
    # No role: nothing to read. Signed out: to the login page.
    nobody = Client()
    nobody.force_login(make_user("nobody"))
    assert nobody.get(f"/plans/{plan.name}/report.pdf").status_code == 403
    assert Client().get(f"/plans/{plan.name}/report/").status_code == 302


def test_the_api_answers_each_format_and_refuses_what_it_does_not_know(walked, client_for,
                                                                       token_client):
    _w, plan = walked
    api = client_for("viewer")
    url = f"/api/v1/plans/{plan.name}/report/"
    body = api.get(url)
    assert body.status_code == 200 and body["Content-Type"] == "application/pdf"
    assert body.content.startswith(b"%PDF-")
    html = api.get(url, {"format": "html"})
    assert html.status_code == 200 and html["Content-Type"].startswith("text/html")
    data = api.get(url, {"format": "json"}).json()
    assert [s["key"] for s in data["sections"]] == [
        "plan", "method", "conformance", "evals", "soak", "ramps", "costs", "per-success",
        "approvals", "other"]
    assert len(data["rows_sha256"]) == 64
    bad = api.get(url, {"format": "docx"})
    assert bad.status_code == 400 and "use pdf, html or json" in bad.json()["error"]["message"]
    assert api.get("/api/v1/plans/no-such-plan/report/").status_code == 404
    assert token_client(["read"], "viewer").get(url, {"format": "json"}).status_code == 200
    assert client_for().get(url).status_code == 403


def test_without_weasyprint_the_pdf_is_503_naming_the_packages_and_the_html_works(
        walked, client_for, monkeypatch):
    w, plan = walked
    monkeypatch.setitem(sys.modules, "weasyprint", None)  # import weasyprint → ImportError
    page = Client()
    page.force_login(w.viewer)
    pdf = page.get(f"/plans/{plan.name}/report.pdf")
    assert pdf.status_code == 503
    assert b"libpango-1.0-0 libpangoft2-1.0-0" in pdf.content
    assert page.get(f"/plans/{plan.name}/report/").status_code == 200
    api = client_for("viewer").get(f"/api/v1/plans/{plan.name}/report/")
    assert api.status_code == 503
    assert "libpango-1.0-0" in api.json()["error"]["message"]
