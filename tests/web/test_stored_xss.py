"""Stored text never runs as script, for any role, in a real browser (Debian's Chromium through
Playwright) against a live server.

Every free-text field the services accept (region, pool and model fields, labels, a probe's
error, route and ramp reasons, a gateway's address, drain and restore reasons, plan notes,
gate check titles, attestation notes, justifications, pause/resume/abandon/removal reasons,
evidence summaries, trace descriptions, run names and notes, token names, an eval suite's
description and items, an eval run's answers and reasons) holds a payload
that would run if it reached the page as markup; an evidence link holds `javascript:` (stored
as old data would be, around today's validator). Each role then opens every page that shows
them, plus two pages that echo the query string, and clicks every evidence link. Nothing may
set `window.__xss`, open a dialog, create the payload's elements, or trip the
Content-Security-Policy (a violation would mean markup got through escaping).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.utils import timezone
from playwright.sync_api import Browser, BrowserContext, Dialog, Page

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal, token_create_service
from fleetctl.audit.models import AuditEvent
from fleetctl.bench import services as bench
from fleetctl.bench.models import Level, Run
from fleetctl.evals import services as evals
from fleetctl.evals.models import EvalResult, EvalRun
from fleetctl.fleet import services as fleet
from fleetctl.fleet.models import Pool
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Drain
from migrations_plan import services as plans
from migrations_plan.models import Evidence, Plan
from tests.bench.helpers import finished_run
from tests.web.test_browser import Problems

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PASSWORD = "pw-for-tests-only"  # make_user's default (tests/conftest.py)
MODEL = "llama-3.1-8b-instruct"
SYSTEM = Actor.for_system("xss-test")
# Breaks out of a double- or single-quoted attribute, or lands in text, either way.
PAYLOAD = "'\"><img src=x onerror=\"window.__xss=1\"><script>window.__xss=1</script>"
SHORT = "'\"><img src=x onerror=__xss=1>"  # for fields of at most 32 characters
SCRIPT_URL = "javascript:window.__xss=1"
ROLES = {"viewer": "vic", "on-call": "olga", "platform-lead": "bob", "admin": "ada"}


def seed_fleet(people: dict[str, User]) -> None:
    region = fleet.region_create(actor=SYSTEM, code="eu-west", name=PAYLOAD, jurisdiction="EU")
    for name in ("h200-eu", "mi300x-eu", "gaudi-eu", "a100-eu"):
        pool = fleet.pool_create(
            actor=SYSTEM, name=name, runtime="cuda", accelerator=PAYLOAD[:64],
            runtime_version=PAYLOAD[:64], region=region,
            base_urls=[f"http://127.0.0.1:9/{name}"], max_context_tokens=8192,
            node_hourly_rate="9.50", labels={SHORT: PAYLOAD})
        fleet.pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, revision=PAYLOAD,
                                weight_format=SHORT, max_context_tokens=8192)
        for ok in (True, True, False):
            fleet.pool_health_record(pool_id=pool.pk, ok=ok, status_code=200 if ok else 500,
                                     latency_ms=1.0, error="" if ok else PAYLOAD)
        fleet.pool_set_cost(actor=SYSTEM, pool=pool, cost_per_1m=Decimal("1.5"),
                            measured_at=timezone.now())
    # A script URL is no nginx prefix directory: refused. A directory path carrying markup
    # is a valid one, so it is stored and must stay text on every page.
    with pytest.raises(ValidationError, match="not an absolute path"):
        traffic.gateway_create(actor=SYSTEM, name="edge-nginx", kind="nginx",
                               admin_address=SCRIPT_URL, options={"listen": "127.0.0.1:9"},
                               routes=[])
    traffic.gateway_create(actor=SYSTEM, name="edge-nginx", kind="nginx",
                           admin_address="/srv/'\"><img_src=x_onerror=__xss=1>",
                           options={"listen": "127.0.0.1:9"}, routes=[])
    for person in people.values():
        token_create_personal(actor=Actor(user=person), name=PAYLOAD, scopes=["read"])
    token_create_service(actor=SYSTEM, name=PAYLOAD, scopes=["read"])


def seed_traffic_and_plans(people: dict[str, User]) -> None:
    h200, mi300x, gaudi, a100 = (Pool.objects.get(name=n)
                                 for n in ("h200-eu", "mi300x-eu", "gaudi-eu", "a100-eu"))
    route = traffic.route_create(actor=SYSTEM, name="llama-eu", model_id=MODEL,
                                 primary_pool=h200, residency="EU", reason=PAYLOAD)
    lead, author, oncall = (Actor(user=people[n]) for n in ("platform-lead", "author", "on-call"))
    slo = {"slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60, "slo_error_rate": 0.01}
    closed = plans.plan_create(actor=author, name="a100-plan", candidate_pool=a100,
                               primary_pool=h200, routes=[route], notes=PAYLOAD, **slo)
    plans.abandon(actor=lead, plan=closed, reason=PAYLOAD)
    route.refresh_from_db()
    traffic.revision_create(actor=SYSTEM, route=route, weights={"h200-eu": 90, "gaudi-eu": 10},
                            base_revision=route.revision_number, reason=PAYLOAD)
    drain = traffic.drain_request(actor=SYSTEM, pool=gaudi, reason=PAYLOAD)
    traffic.drain_restore(actor=SYSTEM, drain=Drain.objects.get(pk=drain.pk), reason=PAYLOAD)

    plan = plans.plan_create(actor=author, name="mi300x-plan", candidate_pool=mi300x,
                             primary_pool=h200, routes=[route], notes=PAYLOAD, **slo)
    check = plans.check_add(actor=lead, plan=plan, stage=1, title=PAYLOAD,
                            attest_role="on-call")
    plans.attest(actor=oncall, check=check, note=PAYLOAD)
    for blocking in plan.checks.filter(stage=1, key__in=["only-through-route", "healthy"]):
        plans.check_remove(actor=lead, check=blocking, reason=PAYLOAD)
    plans.evidence_record(actor=SYSTEM, pool=mi300x, kind="conformance", verdict="pass",
                          summary=PAYLOAD)
    # As a row stored before links were validated would be: .update() skips full_clean.
    Evidence.objects.filter(kind="conformance").update(url=SCRIPT_URL)
    plans.evidence_record(actor=SYSTEM, pool=mi300x, kind="eval", verdict="pass",
                          summary=PAYLOAD, url="/pools/mi300x-eu/")
    plans.approve(actor=lead, plan=plan, justification=PAYLOAD)
    plans.pause(actor=oncall, plan=plan, reason=PAYLOAD)
    plans.resume(actor=lead, plan=plan, reason=PAYLOAD)
    # A metric source's last outcome quotes what the source answered (a stranger's text),
    # and the gate check that reads it carries a payload title.
    from fleetctl.prometheus import evidence as metric_evidence
    from fleetctl.prometheus import services as metric_sources
    from fleetctl.prometheus.query import Measurement

    admin = Actor(user=people["admin"])
    source = metric_sources.source_create(actor=admin, name="xss-src", kind="http-json",
                                          base_url="http://10.0.0.7:8080/a?b=<i>")
    metric_sources.remember(source, Measurement("insufficient", f"q: HTTP 500: {PAYLOAD}",
                                                "xss-src", PAYLOAD))
    plans.check_add(actor=lead, plan=plan, stage=4, title=PAYLOAD,
                    rule=metric_evidence.QUERY_RULE,
                    params={"source": "xss-src", "query": PAYLOAD, "failure": "result > 1"})


def seed_bench() -> int:
    trace = bench.trace_generate(actor=SYSTEM, name="xss-trace", description=PAYLOAD, n=20,
                                 seed=1, prompt_tokens=64, completion_tokens=16)
    h200, mi300x = Pool.objects.get(name="h200-eu"), Pool.objects.get(name="mi300x-eu")
    run = finished_run(trace, h200, mi300x)
    run.progress["notes"] = {h200.name: PAYLOAD, mi300x.name: PAYLOAD}
    Run.objects.filter(pk=run.pk).update(name=PAYLOAD[:100], error=PAYLOAD,
                                         progress=run.progress)
    Level.objects.filter(run=run).update(note=PAYLOAD)
    return run.pk


def seed_evals() -> dict[str, int]:
    """A suite whose description, item id, prompt and reference carry the payload, and a
    finished run of it for the MI300X plan whose answers, reasons and errors do (answers are
    model output: the run page must show them as text)."""
    item = {"id": PAYLOAD, "messages": [{"role": "user", "content": PAYLOAD}],
            "references": [PAYLOAD], "scorer": "contains", "tags": ["xss"]}
    suite, _ = evals.suite_upload(actor=SYSTEM, name="xss-suite", description=PAYLOAD,
                                  fileobj=io.BytesIO(json.dumps(item).encode() + b"\n"))
    plan = Plan.objects.get(name="mi300x-plan")
    run = evals.run_create(actor=SYSTEM, suite=suite, plan=plan, min_items=1)
    EvalRun.objects.filter(pk=run.pk).update(status=EvalRun.Status.RUNNING, done=run.total)
    for n, result in enumerate(EvalResult.objects.filter(run=run).order_by("position")):
        EvalResult.objects.filter(pk=result.pk).update(
            status=EvalResult.Status.DONE, score=float(n), text=PAYLOAD, reason=PAYLOAD,
            error=PAYLOAD, extracted=PAYLOAD, http_status=200, scored_at=timezone.now())
    evals.run_finish(EvalRun.objects.get(pk=run.pk))
    return {"eval_suite": suite.pk, "eval_run": run.pk}


@pytest.fixture
def stored_payloads(transactional_db: None, make_user: Callable[..., User]) -> dict[str, Any]:
    """Seeded before the browser starts (Playwright's loop would give the ORM a connection
    of its own)."""
    people = {role: make_user(username, role) for role, username in ROLES.items()}
    people["author"] = make_user("alice", "platform-lead")
    seed_fleet(people)
    seed_traffic_and_plans(people)
    run_id = seed_bench()
    eval_ids = seed_evals()
    drains = list(Drain.objects.order_by("pk").values_list("pk", flat=True))
    event = AuditEvent.objects.filter(message=PAYLOAD).order_by("pk").first()
    assert event is not None
    return {"run": run_id, "drains": drains, "event": event.pk, **eval_ids}


def pages_for(role: str, seeded: dict[str, Any]) -> list[str]:
    echo = quote(PAYLOAD)
    pages = [
        "/", f"/?q={echo}&accelerator={echo}", "/regions/",
        "/pools/h200-eu/",
        "/traffic/", "/traffic/routes/llama-eu/", "/traffic/drains/",
        *[f"/traffic/drains/{pk}/" for pk in seeded["drains"]],
        "/plans/", "/plans/mi300x-plan/", "/plans/a100-plan/",
        "/audit/", f"/audit/?actor={echo}&action={echo}", "/account/tokens/",
        "/bench/", "/bench/traces/xss-trace/", f"/bench/runs/{seeded['run']}/",
        "/evals/", "/evals/suites/", f"/evals/suites/{seeded['eval_suite']}/",
        f"/evals/runs/{seeded['eval_run']}/",
        f"/evals/runs/{seeded['eval_run']}/?direction=regressed&q={echo}",
        f"/evals/runs/new/?plan=mi300x-plan&candidate={echo}&suite={echo}",
        "/metric-sources/", "/metric-sources/xss-src/",
    ]
    if role in ("on-call", "platform-lead", "admin"):
        pages += ["/traffic/routes/llama-eu/drain/", "/traffic/pools/gaudi-eu/drain/"]
    if role in ("platform-lead", "admin"):
        pages += ["/pools/mi300x-eu/edit/", "/plans/new/"]
    if role == "admin":
        pages += ["/metric-sources/xss-src/edit/"]
        pages += ["/admin/audit/auditevent/", f"/admin/audit/auditevent/{seeded['event']}/change/"]
    return pages


WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""
INJECTED = """() => ({
  xss: window.__xss === undefined ? null : String(window.__xss),
  csp: window.__csp || [],
  elements: document.querySelectorAll('img[src="x"], script:not([src]):not([type])').length,
})"""


def watch_dialogs(context: BrowserContext) -> list[str]:
    """Every alert/confirm/prompt the context's pages open (a payload's usual proof)."""
    opened: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        opened.append(dialog.message)
        dialog.dismiss()

    context.on("dialog", on_dialog)
    return opened


def sign_in(context: BrowserContext, base_url: str, username: str) -> Page:
    page = context.new_page()
    page.goto(f"{base_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")
    return page


def inert(page: Page, where: str, dialogs: list[str]) -> None:
    seen = page.evaluate(INJECTED)
    assert seen["xss"] is None, f"script ran on {where}"
    assert not dialogs, f"a dialog opened on {where}: {dialogs}"
    assert seen["elements"] == 0, f"payload markup reached the DOM on {where}"
    assert seen["csp"] == [], f"CSP violations on {where}: {seen['csp']}"


def click_evidence_links(page: Page, base_url: str, dialogs: list[str]) -> int:
    """Click every evidence link on the plan's pages, as a curious lead would."""
    clicked = 0
    for url in ("/plans/mi300x-plan/", "/plans/mi300x-plan/?stage=2"):
        page.goto(base_url + url)
        inert(page, url, dialogs)
        hrefs = page.locator(".evidence-refs a").evaluate_all("els => els.map(a => a.href)")
        for index in range(len(hrefs)):
            page.goto(base_url + url)
            page.locator(".evidence-refs a").nth(index).click()
            page.wait_for_load_state()
            inert(page, f"after clicking evidence link {hrefs[index]}", dialogs)
            clicked += 1
    return clicked


def test_no_stored_text_runs_as_script_for_any_role(
    live_server: Any, stored_payloads: dict[str, Any], browser: Browser
):
    base_url = live_server.url
    for role, username in ROLES.items():
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.add_init_script(WATCH)
        dialogs = watch_dialogs(context)
        page = sign_in(context, base_url, username)
        problems = Problems(page)
        for url in pages_for(role, stored_payloads):
            response = page.goto(base_url + url)
            assert response is not None and response.status == 200, (role, url)
            inert(page, f"{url} as {role}", dialogs)
        assert click_evidence_links(page, base_url, dialogs) >= 1
        # The script-URL evidence is plain text; the site-path one was a link that worked.
        page.goto(f"{base_url}/plans/mi300x-plan/")
        conformance = page.locator('tr[data-check="conformance"] .evidence-refs li')
        assert conformance.locator("a").count() == 0
        assert "window.__xss" in conformance.inner_text()
        # Django's admin names no icon, so Chromium asks for /favicon.ico.
        errors = [item for item in problems.items if "/favicon.ico" not in item]
        assert errors == [], (role, errors)
        context.close()


def test_the_api_docs_work_under_the_content_security_policy(
    live_server: Any, transactional_db: None, make_user: Callable[..., User], browser: Browser
):
    make_user("vic", "viewer")
    context = browser.new_context()
    context.add_init_script(WATCH)
    page = sign_in(context, live_server.url, "vic")
    problems = Problems(page)
    page.goto(f"{live_server.url}/api/docs/")
    # Swagger UI draws the schema's operations only if its start-up script ran. It draws them
    # as they scroll into view, so wait for the first one (the schema's paths are sorted).
    page.locator(".swagger-ui .opblock-summary-path",
                 has_text="/api/v1/audit-events/").first.wait_for()
    assert page.evaluate("window.__csp") == []
    assert problems.items == []
    context.close()
