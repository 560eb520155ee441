"""The plans dashboard through Django's test client: the board, the plan page and every button
on it, posted the way a browser posts them. The services decide; these tests check that the
page says what they decided, before (disabled buttons with the reason) and after (messages,
errors on the field, nothing stored)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from migrations_plan import services
from migrations_plan.gates import DEFAULT_GATES
from migrations_plan.models import Approval, Attestation, GateCheck, Plan
from tests.migrations_plan.conftest import MODEL
from tests.migrations_plan.helpers import walk_to

DEFAULT_CHECKS = sum(len(checks) for checks in DEFAULT_GATES.values())

JUSTIFICATION = "conformance and cost signed off by hand"


@pytest.fixture
def client_as(world) -> Callable[[str], Client]:
    """A browser-like client signed in as one of the world's people ("lead", "viewer"...)."""

    def make(who: str) -> Client:
        client = Client()
        client.force_login(getattr(world, who))
        return client

    return make


@pytest.fixture
def another_candidate(world, make_pool, system) -> Callable[[str], Pool]:
    """More candidate pools serving the world's model: one open plan per candidate and
    route, so a board with several plans needs several candidates."""

    def make(name: str) -> Pool:
        pool = make_pool(name=name, runtime="rocm", accelerator="MI300X")
        pool_model_create(actor=system, pool=pool, model_id=MODEL, revision="abc123",
                          max_context_tokens=8192)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
        return Pool.objects.get(pk=pool.pk)

    return make


def page(client: Client, plan: Plan, **params: str) -> str:
    response = client.get(reverse("plans:detail", args=[plan.name]), params)
    assert response.status_code == 200
    return response.content.decode()


def board_column(html: str, state: str) -> str:
    """The markup of one board column, up to the next one."""
    start = html.index(f'<section class="board-column board-{state}"')
    end = html.find('<section class="board-column', start + 1)
    return html[start:end if end != -1 else None]


def badge(status: str, symbol: str, words: str) -> str:
    return f'<span class="badge gate-{status}"><span aria-hidden="true">{symbol}</span> {words}'


def approve_url(plan: Plan) -> str:
    return reverse("plans:approve", args=[plan.name])


# --- the board --------------------------------------------------------------------------------

def test_the_board_shows_every_open_plan_as_a_card_in_its_stages_column(
    world, client_as, another_candidate
):
    first = world.plan("mi300x-llama")
    second = walk_to(world, world.plan("mi325-llama",
                                       candidate_pool=another_candidate("mi325x-us")), 2)
    paused = world.plan("gaudi-llama", candidate_pool=another_candidate("gaudi3-us"))
    services.pause(actor=world.actor("oncall"), plan=paused, reason="capacity review")
    gone = world.plan("old-llama", candidate_pool=another_candidate("a100-us"))
    services.abandon(actor=world.actor("lead"), plan=gone, reason="the pool is retired")

    html = client_as("viewer").get(reverse("plans:board")).content.decode()

    assert 'data-plan="mi300x-llama"' in board_column(html, "stage-1")
    assert 'data-plan="mi325-llama"' in board_column(html, "stage-2")
    assert 'data-plan="gaudi-llama"' in board_column(html, "paused")
    assert "old-llama" not in html
    card = board_column(html, "stage-1")
    assert "mi300x-us</strong>" in card and "h200-us" in card and ">llama</span>" in card
    assert "1 of 5 checks pass" in card  # only the routing check passes on day one
    assert "approvals 0 of 1" in card
    assert "in this stage for" in card
    stage2 = board_column(html, "stage-2")
    assert "Blocked by" in stage2 and "Dashboards and alerts exist for the candidate" in stage2
    assert "Closed plans (1)" in html
    assert first.state == "stage-1" and second.state == "stage-2"


def test_the_closed_plans_list_shows_completed_and_abandoned_plans(world, client_as):
    plan = world.plan()
    services.abandon(actor=world.actor("lead"), plan=plan, reason="the pool is retired")
    html = client_as("viewer").get(reverse("plans:board"), {"closed": "1"}).content.decode()
    closed = html[html.index('id="closed"'):]
    assert "mi300x-llama" in closed and "✕ abandoned" in closed


def test_the_new_plan_button_is_only_for_people_who_may_open_plans(world, client_as):
    create = f'href="{reverse("plans:create")}"'
    assert create in client_as("lead").get(reverse("plans:board")).content.decode()
    assert create not in client_as("viewer").get(reverse("plans:board")).content.decode()
    assert create not in client_as("oncall").get(reverse("plans:board")).content.decode()


def test_the_boards_query_count_grows_by_a_bounded_amount_per_plan(
    world, client_as, another_candidate
):
    client = client_as("viewer")
    world.plan("plan-0")

    def count() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("plans:board")).status_code == 200
        return len(captured.captured_queries)

    one = count()
    for i in range(1, 6):
        world.plan(f"plan-{i}", candidate_pool=another_candidate(f"cand-{i}"))
    six = count()
    # Each card evaluates its gate now (a few queries per rule); nothing else is per plan.
    per_plan = (six - one) / 5
    assert per_plan <= 10, (one, six)
    assert one <= 20, one


def test_a_full_column_shows_its_longest_waiting_plans_and_links_to_all_of_them(
    world, client_as, another_candidate, monkeypatch
):
    from migrations_plan import selectors, views

    monkeypatch.setattr(selectors, "BOARD_CARDS", 2)
    monkeypatch.setattr(views, "COLUMN_PAGE", 3)
    client = client_as("viewer")
    names = ["plan-0", "plan-1", "plan-2", "plan-3"]
    world.plan(names[0])
    for i, name in enumerate(names[1:], start=1):
        world.plan(name, candidate_pool=another_candidate(f"cand-{i}"))

    def board(**params: str) -> tuple[str, int]:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(reverse("plans:board"), params)
        return response.content.decode(), len(captured.captured_queries)

    html, queries = board()
    column = board_column(html, "stage-1")
    assert [n for n in names if f'data-plan="{n}"' in column] == ["plan-0", "plan-1"]
    assert "2 more: all 4 in this column" in column and "?column=stage-1" in column
    # The cards past the cap cost nothing: the board reads as many gates with 4 plans as
    # with 2 in the column.
    Plan.objects.filter(name__in=names[2:]).update(state="paused")
    _, two = board()
    Plan.objects.filter(name__in=names[2:]).update(state="stage-1")
    assert queries <= two + 2, (queries, two)

    first, _ = board(column="stage-1")
    assert [n for n in names if f'data-plan="{n}"' in first] == names[:3]
    assert "All 4 open plans in this column" in first and "page 1 of 2" in first
    second, _ = board(column="stage-1", page="2")
    assert [n for n in names if f'data-plan="{n}"' in second] == ["plan-3"]

    empty, _ = board(column="stage-4")
    assert "Migration plans: 4 · live" in empty and "board-empty" in empty

    missing = client.get(reverse("plans:board"), {"column": "stage-9"})
    assert missing.status_code == 404
    assert "No board column &#x27;stage-9&#x27;" in missing.content.decode()


# --- opening a plan ---------------------------------------------------------------------------

def plan_form(world, **overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "name": "mi300x-llama", "candidate_pool": world.candidate.name,
        "primary_pool": world.primary.name, "routes": [world.route.name],
        "slo_ttft_p95_ms": "800", "slo_tpot_p95_ms": "60", "slo_error_rate": "0.01",
        "latency_margin_pct": "10", "cost_margin_pct": "0", "quality_margin_pct": "2",
        "owner": "", "target_date": "2030-01-31", "required_approvals": "2", "notes": "",
    }
    data.update(overrides)
    return data


def test_a_platform_lead_opens_a_plan_from_the_form(world, client_as):
    response = client_as("author").post(reverse("plans:create"), plan_form(world))
    assert response.status_code == 302
    assert response["Location"] == reverse("plans:detail", args=["mi300x-llama"])
    plan = Plan.objects.get(name="mi300x-llama")
    assert (plan.created_by, plan.owner, plan.required_approvals) == (
        world.author, world.author, 2)
    assert plan.checks.count() == DEFAULT_CHECKS


def test_a_plan_the_service_refuses_shows_the_reason_on_the_field_and_stores_nothing(
    world, client_as, make_pool
):
    other = make_pool(name="a100-us")  # serves nothing
    response = client_as("author").post(reverse("plans:create"),
                                        plan_form(world, primary_pool=other.name))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Nothing was saved" in html
    assert "Primary a100-us does not serve model llama-3.1-8b-instruct" in html
    assert not Plan.objects.exists()


# --- the plan page ----------------------------------------------------------------------------

def test_the_plan_page_shows_the_current_stages_checklist_with_numbers_and_evidence(
    world, client_as
):
    plan = world.plan(target_date="2030-01-31")
    html = page(client_as("viewer"), plan)
    for title in ("Passes the OpenAI-contract conformance probe",
                  "Callers reach the pool only through a route",
                  "Cost per 1M output tokens is reported", "Candidate healthy for 24 h"):
        assert title in html
    assert "Stage 1 · abstraction gate" in html
    assert badge("insufficient", "○", "insufficient data") in html
    assert badge("pass", "●", "pass") in html
    assert 'href="/traffic/routes/llama/"' in html  # the routing check's evidence
    assert "<summary>The numbers</summary>" in html and "required hours" in html
    assert "TTFT p95 ≤ <strong>800 ms</strong>" in html and "2030-01-31" in html
    assert "opened by alice" in html


def test_a_viewer_sees_no_approve_or_advance_button_and_no_gate_edits(world, client_as):
    plan = world.plan()
    html = page(client_as("viewer"), plan)
    assert approve_url(plan) not in html
    assert reverse("plans:advance", args=[plan.name]) not in html
    assert reverse("plans:check-add", args=[plan.name]) not in html
    assert "Edit…" not in html and "Plan actions" not in html
    assert "Approving and advancing need the <code>platform-lead</code> role" in html


def test_the_author_sees_approve_disabled_with_the_reason(world, client_as):
    plan = world.plan()
    html = page(client_as("author"), plan)
    form = html[html.index(f'action="{approve_url(plan)}"'):]
    form = form[:form.index("</form>")]
    assert "<fieldset disabled>" in form
    assert ("Cannot approve:</strong> You opened this plan; another platform lead must "
            "approve its gates.") in form
    assert ("Cannot advance:</strong> You opened this plan; another platform lead must "
            "advance it.") in html


def test_a_blocking_check_disables_approve_and_names_the_check(world, client_as):
    plan = walk_to(world, world.plan(), 2)
    html = page(client_as("lead2"), plan)
    assert ("Cannot approve:</strong> Blocked by: Dashboards and alerts exist for the "
            "candidate (awaiting attestation)") in html
    assert "Cannot advance:</strong> Blocked by: Dashboards and alerts" in html
    # The reason links to what resolves it: the check's row, where its attest form is.
    dashboards = plan.checks.get(stage=2, key="dashboards")
    assert (f'Resolve: <a href="#check-{dashboards.pk}">attest “Dashboards and alerts exist '
            f'for the candidate”</a>') in html
    assert f'id="check-{dashboards.pk}"' in html


def test_a_lead_approves_the_gate_and_sees_the_approval_and_the_timeline_entry(
    world, client_as
):
    plan = world.plan()
    client = client_as("lead")
    html = page(client, plan)
    assert "<fieldset disabled>" not in html.split(approve_url(plan))[1].split("</form>")[0]
    assert "not a clean pass" in html

    response = client.post(approve_url(plan), {"approve-justification": JUSTIFICATION})
    assert response.status_code == 302
    approval = Approval.objects.get(plan=plan)
    assert (approval.by, approval.justification) == (world.lead, JUSTIFICATION)

    html = client.get(response["Location"]).content.decode()
    assert "You approved the stage 1 (abstraction) gate of mi300x-llama." in html
    approvals = html[html.index('class="compact approvals"'):]
    assert "<strong>bob</strong>" in approvals and JUSTIFICATION in approvals
    assert "● counts" in approvals
    assert "approved the gate <code" in html
    assert "Cannot approve:</strong> You already approved this gate on this evidence." in html
    # One approval of one required: the advance button is live now.
    advance = html.split(f'action="{reverse("plans:advance", args=[plan.name])}"')[1]
    assert "<fieldset disabled>" not in advance.split("</form>")[0]


def test_an_approval_without_the_needed_justification_shows_the_error_and_stores_nothing(
    world, client_as
):
    plan = world.plan()
    response = client_as("lead").post(approve_url(plan), {"approve-justification": ""})
    assert response.status_code == 200
    html = response.content.decode()
    assert "write why you approve anyway (at least 15 characters)" in html
    assert 'class="field has-error"' in html
    assert not Approval.objects.exists()
    refused = AuditEvent.objects.get(action="plan.approve", outcome="denied")
    assert refused.actor == "bob"


def test_a_refused_approval_is_flashed_and_marked_on_the_timeline(world, client_as):
    plan = world.plan()
    client = client_as("author")
    response = client.post(approve_url(plan), {"approve-justification": JUSTIFICATION})
    assert response.status_code == 403
    html = response.content.decode()
    assert "separation of duties: another platform lead must approve its gates" in html
    assert not Approval.objects.exists()
    timeline = page(client, plan).split('id="timeline"')[1]
    assert 'class="timeline-denied"' in timeline and "✕ refused" in timeline


def test_the_author_sees_why_they_cannot_advance_and_is_refused_if_they_try(world, client_as):
    plan = world.plan()
    services.approve(actor=world.actor("lead"), plan=plan, justification=JUSTIFICATION)
    client = client_as("author")
    assert ("Cannot advance:</strong> You opened this plan; another platform lead must "
            "advance it.") in page(client, plan)
    response = client.post(reverse("plans:advance", args=[plan.name]),
                           {"advance-reason": "approved, so I ship it"})
    assert response.status_code == 403
    plan.refresh_from_db()
    assert plan.state == "stage-1"


def test_advance_needs_the_required_number_of_approvals(world, client_as):
    plan = world.plan(required_approvals=2)
    services.approve(actor=world.actor("lead"), plan=plan, justification=JUSTIFICATION)
    client = client_as("lead2")
    assert "Needs 2 approvals on the current evidence, has 1." in page(client, plan)
    response = client.post(reverse("plans:advance", args=[plan.name]), {"advance-reason": ""})
    assert response.status_code == 409
    plan.refresh_from_db()
    assert plan.state == "stage-1"

    client.post(approve_url(plan), {"approve-justification": JUSTIFICATION})
    response = client.post(reverse("plans:advance", args=[plan.name]),
                           {"advance-reason": "both leads signed"})
    assert response.status_code == 302
    plan.refresh_from_db()
    assert plan.state == "stage-2"
    assert "Plan mi300x-llama advanced: now at stage 2 (shadow)." in client.get(
        response["Location"]).content.decode()


def test_a_platform_lead_attests_a_check_on_the_page(world, client_as):
    plan = walk_to(world, world.plan(), 2)
    check = plan.checks.get(stage=2, key="dashboards")
    client = client_as("lead2")
    field = f"attest-{check.pk}-note"
    assert f'name="{field}"' in page(client, plan)
    assert f'name="{field}"' not in page(client_as("oncall"), plan)  # not their role
    response = client.post(reverse("plans:check-attest", args=[plan.name, check.pk]),
                           {field: "Grafana board and paging alert exist"})
    assert response.status_code == 302
    assert Attestation.objects.get(check_item=check).by == world.lead2
    assert "Attested by <strong>carol</strong>" in page(client, plan)


def test_gate_checks_are_added_edited_and_removed_from_the_page(world, client_as):
    plan = world.plan()
    client = client_as("lead")
    html = page(client, plan, stage="3")
    assert "Add a check to the stage 3 gate" in html
    response = client.post(reverse("plans:check-add", args=[plan.name]), {
        "stage": "3", "add-kind": "evidence", "add-rule": "pool.healthy_for",
        "add-params": '{"hours": 48}', "add-title": "", "add-attest_role": "",
    })
    assert response.status_code == 302
    assert response["Location"].endswith("?stage=3#add-check")
    check = plan.checks.get(stage=3, rule="pool.healthy_for")
    assert (check.title, check.params) == ("Candidate healthy for 48 h", {"hours": 48.0})

    bad = client.post(reverse("plans:check-edit", args=[plan.name, check.pk]),
                      {f"edit-{check.pk}-title": check.title, f"edit-{check.pk}-params": "{"})
    assert bad.status_code == 200 and "Not JSON" in bad.content.decode()
    client.post(reverse("plans:check-edit", args=[plan.name, check.pk]),
                {f"edit-{check.pk}-title": check.title,
                 f"edit-{check.pk}-params": '{"hours": 72}'})
    check.refresh_from_db()
    assert check.params == {"hours": 72.0}

    response = client.post(reverse("plans:check-remove", args=[plan.name, check.pk]),
                           {f"remove-{check.pk}-reason": "the soak covers it"})
    assert response.status_code == 302
    check.refresh_from_db()
    assert check.removed_reason == "the soak covers it"
    html = page(client, plan, stage="3")
    assert "removed from the stage 3 gate" in html and "the soak covers it" in html


def test_a_passed_stages_gate_is_shown_without_edit_controls(world, client_as):
    plan = walk_to(world, world.plan(), 2)
    html = page(client_as("lead"), plan, stage="1")
    assert "The plan has left this stage" in html
    assert "Edit…" not in html and "Add a check" not in html
    assert approve_url(plan) not in html


def test_pause_and_resume_need_a_reason_and_land_on_the_timeline(world, client_as):
    plan = world.plan()
    oncall = client_as("oncall")
    response = oncall.post(reverse("plans:pause", args=[plan.name]), {"pause-reason": ""})
    assert response.status_code == 200 and "This field is required." in response.content.decode()
    response = oncall.post(reverse("plans:pause", args=[plan.name]),
                           {"pause-reason": "capacity review"})
    assert response.status_code == 302
    plan.refresh_from_db()
    assert plan.state == "paused"
    lead = client_as("lead")
    html = page(lead, plan)
    assert "Cannot approve:</strong> Plan is paused at stage 1; resume it first." in html
    lead.post(reverse("plans:resume", args=[plan.name]), {"resume-reason": "review done"})
    plan.refresh_from_db()
    assert plan.state == "stage-1"
    html = page(lead, plan)
    assert "capacity review" in html and "review done" in html


def test_a_viewers_post_is_refused_with_the_reason_and_changes_nothing(world, client_as):
    plan = world.plan()
    response = client_as("viewer").post(approve_url(plan),
                                        {"approve-justification": JUSTIFICATION})
    assert response.status_code == 403
    assert "needs a role that grants it; you have viewer" in response.content.decode()
    assert not Approval.objects.exists()


def test_the_gate_block_polls_only_while_the_tab_is_visible_and_comes_alone(world, client_as):
    plan = world.plan()
    client = client_as("viewer")
    html = page(client, plan)
    # The hidden-tab and busy checks live in static/js (app.js, plans.js): no eval under CSP.
    assert 'hx-trigger="every 10s"' in html
    block = client.get(reverse("plans:detail", args=[plan.name]), {"stage": "1"},
                       headers={"HX-Request": "true", "HX-Target": "plan-gate"})
    text = block.content.decode()
    assert text.lstrip().startswith('<section id="plan-gate"')
    assert "<header" not in text and 'id="timeline"' not in text

    services.abandon(actor=world.actor("lead"), plan=plan, reason="the pool is retired")
    assert "hx-trigger" not in page(client, plan)


def test_an_unknown_plan_is_a_404(world, client_as):
    assert client_as("viewer").get(reverse("plans:detail", args=["nope"])).status_code == 404


def test_the_navigation_links_to_plans(world, client_as):
    html = client_as("viewer").get(reverse("plans:board")).content.decode()
    assert f'<a href="{reverse("plans:board")}" aria-current="page">Plans</a>' in html


def test_check_rows_carry_their_key(world, client_as):
    plan = world.plan()
    html = page(client_as("viewer"), plan)
    for key in GateCheck.objects.filter(plan=plan, stage=1).values_list("key", flat=True):
        assert f'data-check="{key}"' in html


def test_a_check_for_a_stage_that_does_not_exist_is_refused_without_a_crash(world, client_as):
    plan = world.plan()
    response = client_as("lead").post(reverse("plans:check-add", args=[plan.name]), {
        "stage": "9", "add-kind": "attested", "add-attest_role": "on-call", "add-title": "x"})
    assert response.status_code == 302
    assert plan.checks.count() == DEFAULT_CHECKS


def test_a_passed_stage_still_shows_the_approvals_that_moved_it(world, client_as):
    plan = walk_to(world, world.plan(), 2)
    html = page(client_as("viewer"), plan, stage="1")
    approvals = html[html.index('class="compact approvals"'):]
    assert "<strong>bob</strong>" in approvals and "used for the stage move of" in approvals


def test_the_rehearse_button_is_for_stage_4_and_a_refusal_is_flashed(world, client):
    from tests.migrations_plan.helpers import walk_to

    plan = world.plan()
    client.force_login(world.oncall)
    page = client.get(f"/plans/{plan.name}/").content.decode()
    assert "Rehearse a drain" not in page
    walk_to(world, plan, 4)
    page = client.get(f"/plans/{plan.name}/").content.decode()
    assert "Rehearse a drain" in page
    # No live weight yet: nothing to rehearse; the reason is shown, nothing is drained.
    response = client.post(f"/plans/{plan.name}/rehearse-drain/", follow=True)
    assert "Nothing to rehearse" in response.content.decode()
    from fleetctl.traffic.models import Drain
    assert not Drain.objects.exists()


def test_the_form_chooses_the_cost_unit_and_refuses_an_unknown_one(world, client_as):
    refused = client_as("author").post(reverse("plans:create"),
                                       plan_form(world, cost_unit="per_request"))
    assert refused.status_code == 200 and "Nothing was saved" in refused.content.decode()
    assert not Plan.objects.exists()
    response = client_as("author").post(reverse("plans:create"),
                                        plan_form(world, cost_unit="per_successful_task"))
    assert response.status_code == 302
    plan = Plan.objects.get(name="mi300x-llama")
    assert plan.cost_unit == "per_successful_task"
    assert "(per successful task)" in page(client_as("viewer"), plan)
