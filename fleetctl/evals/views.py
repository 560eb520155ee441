"""Evals dashboard: the runs, the suites (upload, items, download, retire), the form that
starts a run (prefilled from the plan page's "Run the stage's eval"), and the run page: its
progress while it runs, then each pool's score with its interval, candidate − primary with
its interval against the margin, the per-tag table, and the item diff side by side. Views
stay thin: selectors read, services write.

The run page's live block (progress, per-pool counts, and once finished the verdict, charts
and tags) is re-polled by htmx every 3 s while the run is queued or running; once it has
ended it renders without hx-trigger and polling stops. The item diff below it is a page-load
snapshot with its own filters and pages (the links reload the page); the poll that first
sees the run ended asks htmx to reload the page once, so the diff is complete.

Answers are model output and prompts are uploaded text: every one reaches the page through
the template's autoescape, never `|safe`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.charts import figure_data
from fleetctl.core.views import (
    Outcome,
    call_for_form,
    form_action,
    form_page,
    get_or_404,
    run_cancel_view,
)
from fleetctl.evals import charts, selectors, services
from fleetctl.evals.forms import (
    DEFAULT_SUITE,
    DiffFilterForm,
    RetireForm,
    RunFilterForm,
    RunForm,
    SuiteUploadForm,
)
from fleetctl.evals.models import EvalItem, EvalResult, EvalRun, EvalRunPool, EvalSuite
from fleetctl.inference.chat import prompt_text
from migrations_plan import selectors as plans

LIVE_ID = "eval-live"
PAGE_SIZE = 25
ITEMS_PAGE_SIZE = 50
DIFF_PAGE_SIZE = 20


# The service's argument names that the run form calls otherwise.
FORM_FIELDS = {"model_id": "model", "margin": "margin_pct"}


# ---- reads -----------------------------------------------------------------------------------

def _suite(suite_id: int) -> EvalSuite:
    return get_or_404(selectors.suite_get, suite_id, what=f"eval suite with id {suite_id}")


def _run(run_id: int) -> EvalRun:
    return get_or_404(selectors.run_get, run_id, what=f"eval run with id {run_id}")


def _suite_ref(ref: str) -> EvalSuite | None:
    """A suite from the new-run link's ?suite=: an id, "name" (the newest unretired
    version) or "name@version"; None when nothing matches (the form then shows no choice)."""
    try:
        return services.suite_lookup(ref)
    except ValidationError:
        return None


def _progress(run: EvalRun) -> dict[str, Any]:
    """selectors.progress, with each pool's item count (its share of the total)."""
    progress = selectors.progress(run)
    for pool in progress["pools"]:
        pool["items"] = run.suite.item_count
    return progress


@dataclass
class TagRow:
    tag: str
    n: int
    scores: list[dict[str, Any] | None]
    paired: dict[str, Any] | None
    regressed: bool


def _tag_rows(run: EvalRun, names: list[str]) -> list[TagRow]:
    """The per-tag table, regressed tags first, then the worst difference first."""
    rows = []
    for tag, info in ((run.stats or {}).get("tags") or {}).items():
        info = info or {}
        pools = info.get("pools") or {}
        paired = info.get("paired") or None
        rows.append(TagRow(tag=tag, n=int(info.get("n") or 0),
                           scores=[pools.get(name) for name in names], paired=paired,
                           regressed=bool(info.get("regressed"))))

    def order(row: TagRow) -> tuple[bool, float, str]:
        estimate = (row.paired or {}).get("estimate")
        return (not row.regressed, float(estimate) if estimate is not None else 0.0, row.tag)

    rows.sort(key=order)
    return rows


def _figures(run: EvalRun, run_pools: list[EvalRunPool]) -> dict[str, Any]:
    stats = run.stats or {}
    if not stats.get("pools"):
        return {"scores_figure": None, "difference_figure": None}
    roles = [(rp.pool.name, rp.role) for rp in run_pools]
    scores = figure_data(charts.scores_figure(stats["pools"], roles))
    difference = None
    if stats.get("paired"):
        difference = figure_data(charts.difference_figure(
            stats["paired"], margin=run.margin, tags=stats.get("tags")))
    return {"scores_figure": scores, "difference_figure": difference}


def item_prompt(item: EvalItem) -> str:
    """The item as a person reads it (chat messages one per line as "role: text")."""
    return prompt_text(item.messages if item.messages is not None else item.prompt)


@dataclass
class DiffRow:
    item: EvalItem
    candidate: EvalResult
    primary: EvalResult | None
    prompt: str

    @property
    def direction(self) -> str:
        theirs = self.primary.score if self.primary is not None else None
        if theirs is None or self.candidate.score is None:
            return ""
        return "regressed" if self.candidate.score < theirs else "improved"


def _diff(request: HttpRequest, run: EvalRun) -> dict[str, Any]:
    tags = sorted((run.suite.tags or {}).keys())
    form = DiffFilterForm(request.GET or None, tags=tags)
    filters = form.filters()
    rows_qs = (selectors.diff(run, **{k: v or None for k, v in filters.items()})
               if filters is not None else selectors.results_none())
    page = Paginator(rows_qs, DIFF_PAGE_SIZE).get_page(
        request.GET.get("page"))
    candidate, primary = selectors.role_pool(run, "candidate"), selectors.role_pool(run, "primary")
    theirs = selectors.primary_results(primary, [r.item_id for r in page.object_list]
                                       ) if primary else {}
    rows = [DiffRow(item=r.item, candidate=r, primary=theirs.get(r.item_id),
                    prompt=item_prompt(r.item)) for r in page.object_list]
    counts = selectors.diff_counts(run) if primary else {}
    export = {k: v for k, v in (filters or {}).items() if v}
    return {"diff_form": form, "diff_page": page, "diff_rows": rows, "diff_counts": counts,
            "has_primary": primary is not None,
            "candidate_name": candidate.pool.name if candidate else "",
            "primary_name": primary.pool.name if primary else "",
            "export_json": f"/api/v1/eval-runs/{run.pk}/export/?"
                           + urlencode({"format": "json", **export}),
            "export_csv": f"/api/v1/eval-runs/{run.pk}/export/?"
                          + urlencode({"format": "csv", **export})}


def _live(run: EvalRun) -> dict[str, Any]:
    run_pools = selectors.run_pools(run)
    names = [rp.pool.name for rp in run_pools]
    stats = run.stats or {}
    pool_rows = [{"rp": rp, "stats": (stats.get("pools") or {}).get(rp.pool.name)}
                 for rp in run_pools]
    return {"run": run, "live_id": LIVE_ID, "polling": run.active,
            "progress": _progress(run), "run_pools": run_pools, "pool_rows": pool_rows,
            "task_costs": selectors.run_task_costs(run),
            "pool_names": names, "paired": stats.get("paired"),
            "tag_rows": _tag_rows(run, names), "margin_points": run.margin * 100,
            "confidence_pct": run.confidence * 100, **_figures(run, run_pools)}


def evidence_url(run: EvalRun) -> str:
    """Where the run's evidence is read: the plan's stage-2 gate (the eval check that cites
    it), else the candidate pool's page."""
    if run.plan is not None:  # stage 2's eval check reads it, whatever stage it was made in
        return f"{reverse('plans:detail', args=[run.plan.name])}?stage=2#gate"
    candidate = selectors.role_pool(run, "candidate")
    return reverse("fleet:pool-detail", args=[candidate.pool.name]) if candidate else ""


# ---- pages -----------------------------------------------------------------------------------

@dashboard_view
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    form = RunFilterForm(request.GET or None)
    runs = selectors.runs()
    if form.is_bound and form.is_valid():
        runs = selectors.runs(plan=form.cleaned_data.get("plan") or None,
                              status=form.cleaned_data.get("status") or None)
    elif form.is_bound:  # a filter it cannot read answers nothing, and says why
        runs = runs.none()
    page = Paginator(runs, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "evals/home.html", {"filter_form": form, "page": page})


@dashboard_view
@require_http_methods(["GET", "POST"])
def suite_list(request: HttpRequest) -> HttpResponse:
    """The suites, and the upload form (a bad line is named on the form; nothing stored)."""
    posted = request.method == "POST"
    form = SuiteUploadForm(request.POST if posted else None, request.FILES if posted else None)
    done: Outcome[Any] = Outcome(status=400 if posted else 200)
    if posted and form.is_valid():
        data = form.cleaned_data
        # Not form_action: an upload of a version already stored says so, as news, not success.
        done = call_for_form(lambda: services.suite_upload(
            actor=actor_from_request(request), name=data["name"], fileobj=data["file"],
            description=data.get("description") or ""), form)
        if done.result is not None:
            suite, created = done.result
            if created:
                messages.success(request, f"Stored suite {suite.name} v{suite.version}: "
                                          f"{suite.item_count:,} items, sha256 "
                                          f"{suite.sha256[:12]}.")
            else:
                messages.info(request, f"{suite.name} v{suite.version} already has exactly "
                                       "this content; nothing new stored.")
            return redirect("evals:suite-detail", suite_id=suite.pk)
    return render(request, "evals/suites.html", {"suites": selectors.suites(), "form": form},
                  status=done.status)


def _suite_page(request: HttpRequest, suite: EvalSuite, *, tag: str, page_number: Any,
                retire_form: RetireForm, status: int = 200) -> HttpResponse:
    page = Paginator(selectors.suite_items(suite, tag=tag or None),
                     ITEMS_PAGE_SIZE).get_page(page_number)
    return render(request, "evals/suite_detail.html", {
        "suite": suite, "page": page, "tag": tag,
        "rows": [{"item": item, "prompt": item_prompt(item)} for item in page.object_list],
        "tags": sorted((suite.tags or {}).items()),
        "scorers": sorted((suite.scorers or {}).items()),
        "runs": selectors.suite_runs(suite, limit=10),
        "retire_form": retire_form}, status=status)


@dashboard_view
@require_GET
def suite_detail(request: HttpRequest, suite_id: int) -> HttpResponse:
    return _suite_page(request, _suite(suite_id), tag=request.GET.get("tag", ""),
                       page_number=request.GET.get("page"), retire_form=RetireForm())


@dashboard_view
@require_GET
def suite_download(request: HttpRequest, suite_id: int) -> HttpResponse:
    """The canonical JSONL: the bytes whose sha256 is the suite's pin."""
    suite = _suite(suite_id)
    response = HttpResponse(services.suite_jsonl(suite), content_type="application/x-ndjson")
    response["Content-Disposition"] = (
        f'attachment; filename="{suite.name}-v{suite.version}.jsonl"')
    return response


@dashboard_view
@require_POST
def suite_retire(request: HttpRequest, suite_id: int) -> HttpResponseBase:
    suite = _suite(suite_id)
    form = RetireForm(request.POST)

    def page(done: Outcome[EvalSuite]) -> HttpResponse:
        suite.refresh_from_db()
        return _suite_page(request, suite, tag="", page_number=1, retire_form=form,
                           status=done.status)

    return form_action(
        request, form, lambda data: services.suite_retire(actor=actor_from_request(request),
                                                          suite=suite),
        success=lambda _: f"Retired {suite.name} v{suite.version}: no new run can use it.",
        then=lambda _: reverse("evals:suite-detail", kwargs={"suite_id": suite.pk}),
        invalid=page)


def _initial(request: HttpRequest) -> dict[str, Any]:
    """The form's prefill from the link (?plan=&candidate=&primary=&suite=&model=): a plan's
    pools when only the plan is named, and suite fleetctl-core's newest version unless
    another is named."""
    initial: dict[str, Any] = {k: request.GET[k] for k in ("plan", "candidate", "primary",
                                                             "model") if request.GET.get(k)}
    plan = plans.plan_get(name=initial["plan"]) if "plan" in initial else None
    if plan is not None:
        initial.setdefault("candidate", plan.candidate_pool.name)
        initial.setdefault("primary", plan.primary_pool.name)
        initial["margin_pct"] = plan.quality_margin_pct
    suite = _suite_ref(request.GET.get("suite") or DEFAULT_SUITE)
    if suite is not None:
        initial["suite"] = suite.pk
    return initial


@dashboard_view
@require_http_methods(["GET", "POST"])
def run_create(request: HttpRequest) -> HttpResponseBase:
    form = RunForm(request.POST if request.method == "POST" else None, initial=_initial(request))
    return form_page(
        request, form, lambda data: services.run_create(actor=actor_from_request(request),
                                                        **form.service_kwargs()),
        success=lambda run: (f"Started eval run {run.pk}: {run.suite.label} on "
                             f"{', '.join(rp.pool.name for rp in selectors.run_pools(run))}."),
        then=lambda run: reverse("evals:run-detail", kwargs={"run_id": run.pk}),
        template="evals/run_new.html", context=lambda: {"pool_models": selectors.pool_models()},
        renamed=FORM_FIELDS)


@dashboard_view
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(run_id)
    if request.htmx.target == LIVE_ID:  # type: ignore[attr-defined]
        response = render(request, "evals/_run_live.html", _live(run))
        if not run.active:
            # The run ended while the page watched it: load the page once more, so the item
            # diff below (a page-load snapshot) shows every item that changed. (Not
            # refresh_if_changed: the block polls only while the run is active, so any
            # answer that finds it ended is a change.)
            response["HX-Refresh"] = "true"
        return response
    return render(request, "evals/run_detail.html", {
        **_live(run), **_diff(request, run), "evidence_url": evidence_url(run)})


run_cancel = dashboard_view(run_cancel_view(
    _run, lambda request, run: services.run_cancel(actor=actor_from_request(request), run=run),
    detail="evals:run-detail",
    said=lambda run: f"Cancelled eval run {run.pk}; the items scored so far are kept."))
