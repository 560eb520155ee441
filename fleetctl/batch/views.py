"""Batch dashboard: the jobs list, the new-job form (upload or pick an input file), a job's
page (progress, throughput over time, the drill's verdict, the output comparison with the
primary, the events and resends, downloads, and a person's pause/resume/cancel/edit), a
soak's page (its jobs as a timeline, the interventions, the verdict, the cost arbitrage, stop
and edit), and "Start a soak" posted from the plan page's stage-3 panel
(fleetctl/batch/templatetags/batch.py).

Views stay thin: selectors and the summaries of soak.py / cost.py / compare.py read,
services write (every write is audited there). A job page's live block and a soak page's
live block are re-polled by htmx every 3 s while they run, the throughput chart every 10 s,
the jobs list every 5 s while a job on the page is active. A poll that sees the state
changed since the page loaded asks htmx to reload the page once, so the forms offered match
the state (the forms sit outside the polled blocks, so a reason being typed is not wiped).

Input lines, answers, reasons and messages are free text: every one reaches the page through
the template's autoescape or `json_script`, never `|safe`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.batch import compare, cost, outputs, selectors, series, services, soak
from fleetctl.batch.forms import (
    JobActionForm,
    JobEditForm,
    JobFilterForm,
    JobForm,
    SoakEditForm,
    SoakStartForm,
    SoakStopForm,
    duration_text,
)
from fleetctl.batch.models import ACTIVE_STATES, BatchFile, BatchJob, Soak
from fleetctl.core.charts import figure_data
from fleetctl.core.views import (
    Outcome,
    call_for_form,
    form_action,
    get_or_404,
    refresh_if_changed,
)
from fleetctl.fleet import selectors as fleet
from fleetctl.fleet.models import Pool
from migrations_plan import selectors as plans

LIVE_ID = "batch-live"
CHARTS_ID = "batch-charts"
LIST_ID = "batch-jobs"
SOAK_LIVE_ID = "soak-live"
NON_FIELD = "__all__"
PAGE_SIZE = 50
EVENTS_SHOWN = 200
RESENDS_SHOWN = 200
# The service's argument names the forms call otherwise.
FORM_FIELDS = {"completion_window_s": "completion_window", "drill_at": "drill_at_pct",
               "every_s": "every", "duration_s": "duration"}
ACTIONS: dict[str, Callable[..., BatchJob]] = {
    "pause": services.job_pause, "resume": services.job_resume, "cancel": services.job_cancel}
ACTION_DONE = {"pause": "Paused", "resume": "Resumed", "cancel": "Cancelled"}
# Which state each action is offered in (the service decides; this only hides buttons).
ACTION_STATES = {"pause": ("queued", "running"), "resume": ("paused",),
                 "cancel": ACTIVE_STATES, "edit": ACTIVE_STATES}

T = TypeVar("T")


def _job(job_id: int) -> BatchJob:
    return get_or_404(selectors.job_get, job_id, what=f"batch job with id {job_id}")


def _soak(soak_id: int) -> Soak:
    return get_or_404(selectors.soak_get, soak_id, what=f"soak with id {soak_id}")


def _pool(name: str) -> Pool:
    return get_or_404(fleet.pool_get, name=name, what=f"pool named {name!r}")


def _htmx_target(request: HttpRequest) -> str:
    return str(getattr(getattr(request, "htmx", None), "target", "") or "")


def job_url(job: BatchJob) -> str:
    return reverse("batch:job-detail", args=[job.pk])


def soak_url(soak_row: Soak) -> str:
    return reverse("batch:soak-detail", args=[soak_row.pk])


# ---- list ------------------------------------------------------------------------------------

def _list_rows(jobs: list[BatchJob]) -> list[dict[str, Any]]:
    sums = selectors.chunk_sums([job.pk for job in jobs])
    rows = []
    for job in jobs:
        counts = sums.get(job.pk, {"succeeded": 0, "failed": 0, "retries": 0})
        done = counts["succeeded"] + counts["failed"]
        rows.append({"job": job, "done": done, "failed": counts["failed"],
                     "retries": counts["retries"],
                     "percent": round(100 * done / job.total, 1) if job.total else 100.0})
    return rows


@dashboard_view
@require_GET
def job_list(request: HttpRequest) -> HttpResponse:
    form = JobFilterForm(request.GET or None)
    jobs = selectors.jobs_filtered(form.filters())
    page = Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = _list_rows(list(page.object_list))
    context = {"filter_form": form, "page": page, "rows": rows, "list_id": LIST_ID,
               "polling": any(row["job"].is_active for row in rows)}
    if _htmx_target(request) == LIST_ID:
        return render(request, "batch/_job_rows.html", context)
    return render(request, "batch/list.html", context)


# ---- an input file, then a job or a soak -----------------------------------------------------

def _upload(request: HttpRequest, form: JobForm | SoakStartForm) -> Outcome[BatchFile]:
    """The form's input file: a new upload through the service (a bad line refuses the whole
    file, the errors named by line on the form's file field; nothing stored), or the file
    picked."""
    data = form.cleaned_data
    if data.get("input_file"):
        picked = selectors.file_get(data["input_file"])
        if picked is None:
            form.add_error("input_file", "That input file no longer exists; pick another.")
            return Outcome(status=400)
        return Outcome(result=picked, ok=True)
    actor = actor_from_request(request)
    upload = data["file"]
    done: Outcome[BatchFile] = call_for_form(
        lambda: services.file_upload(actor=actor, name=upload.name, stream=upload),
        form, renamed={"stream": "file", "name": "file", NON_FIELD: "file"})
    return done


def _kept_file(request: HttpRequest, form: Any, batch_file: BatchFile) -> None:
    """The upload was valid but the job (or soak) was refused: the file is kept, so the form
    offers it picked, and says so."""
    data = form.data.copy()
    data["input_file"] = str(batch_file.pk)
    form.data = data
    form.fields["input_file"].choices = [  # the new file is not in the choices built before
        (str(batch_file.pk), f"#{batch_file.pk} {batch_file.name} · "
                             f"{batch_file.requests:,} requests (just uploaded)"),
        *[c for c in form.fields["input_file"].choices if c[0] != str(batch_file.pk)]]
    messages.info(request, f"The input file {batch_file.name} was valid and is kept as "
                           f"#{batch_file.pk} ({batch_file.requests:,} requests): it is picked "
                           "below, so you need not upload it again.")


def _with_input_file(request: HttpRequest, form: JobForm | SoakStartForm,
                    create: Callable[[BatchFile], T], *, success: Callable[[T], str],
                    then: Callable[[T], str], page: Callable[[int], HttpResponse]
                    ) -> HttpResponse:
    """A new job or soak: the input file (uploaded through the service, or picked), then the
    create; a message and the new row's page, or `page(status)` again with what was wrong.
    (Not form_action: two service calls, and a refused create keeps a fresh upload.)"""
    if request.method != "POST":
        return page(200)
    if not form.is_valid():
        return page(400)
    uploaded = _upload(request, form)
    if uploaded.result is None:
        return page(uploaded.status)
    batch_file = uploaded.result
    done = call_for_form(lambda: create(batch_file), form, renamed=FORM_FIELDS)
    if done.ok:
        result: T = done.result  # type: ignore[assignment]
        messages.success(request, success(result))
        return redirect(then(result))
    if form.cleaned_data.get("file"):
        _kept_file(request, form, batch_file)
    return page(done.status)


@dashboard_view
@require_http_methods(["GET", "POST"])
def job_new(request: HttpRequest) -> HttpResponse:
    posted = request.method == "POST"
    initial: dict[str, Any] = {}
    if request.GET.get("pool"):
        initial["pool"] = request.GET["pool"]
    if request.GET.get("input_file", "").isdigit():
        initial["input_file"] = int(request.GET["input_file"])
    form = JobForm(request.POST if posted else None, request.FILES if posted else None,
                   pools=selectors.pool_names(), initial=initial)
    return _with_input_file(
        request, form, lambda batch_file: services.job_create(
            actor=actor_from_request(request), input_file=batch_file,
            pool=_pool(form.cleaned_data["pool"]), **form.service_kwargs()),
        success=lambda job: (f"Created batch job {job.pk}: {job.total:,} requests of "
                             f"{job.input_file.name} on {job.pool.name}."),
        then=job_url,
        page=lambda status: render(request, "batch/job_new.html", {"form": form},
                                   status=status))


# ---- the job page ----------------------------------------------------------------------------

def _drill(job: BatchJob, progress: selectors.Progress) -> dict[str, Any] | None:
    """The drill's panel: its times from the job row, the resume time, and, once verified,
    how many requests have no result (the verdict's own reading is job.drill_summary)."""
    if not job.drill:
        return None
    resume_s = None
    if job.drill_fired_at and job.drill_resumed_at:
        resume_s = (job.drill_resumed_at - job.drill_fired_at).total_seconds()
    return {"resume_s": resume_s,
            "missing": max(0, job.total - progress.done) if job.drill_verdict else None,
            "resends": progress.resends, "evidence": job.evidence}


def _live(job: BatchJob) -> dict[str, Any]:
    progress = selectors.job_progress(job)
    return {"job": job, "live_id": LIVE_ID, "polling": job.is_active, "p": progress,
            "task_cost": selectors.job_task_cost(job, progress),
            "percent": round(100 * progress.fraction, 1), "drill": _drill(job, progress)}


def _charts(job: BatchJob) -> dict[str, Any]:
    buckets = series.throughput_buckets(job)
    has_data = any(b.requests for b in buckets)
    return {"job": job, "charts_id": CHARTS_ID, "polling": job.is_active,
            "bucket_s": ((buckets[1].start - buckets[0].start).total_seconds()
                         if len(buckets) > 1 else buckets[0].seconds if buckets else 0),
            "throughput_figure": figure_data(series.throughput_figure(
                buckets, series.job_marks(job)))
            if has_data else None}


def _now_shown(form: Any, now: dict[str, Any]) -> Any:
    """An edit form shows the current values as placeholders, not as values: a field left
    empty is not changed (a value sent again unchanged would still be a person's edit)."""
    for name, value in now.items():
        form.fields[name].widget.attrs["placeholder"] = f"now {value}"
    return form


def _offered(job: BatchJob) -> list[str]:
    return [action for action, states in ACTION_STATES.items() if job.state in states]


def _render_job(request: HttpRequest, job: BatchJob, *, action_form: JobActionForm | None = None,
                edit_form: JobEditForm | None = None, status: int = 200) -> HttpResponse:
    resends = selectors.job_resends(job)
    return render(request, "batch/job_detail.html", {
        **_live(job), **_charts(job),
        "comparison": compare.comparison_summary(job),
        "events": list(selectors.job_events(job, newest_first=True)[:EVENTS_SHOWN]),
        "events_shown": EVENTS_SHOWN,
        "resends": list(resends[:RESENDS_SHOWN]), "resends_count": resends.count(),
        "resends_shown": RESENDS_SHOWN,
        "window_text": duration_text(job.completion_window_s),
        "action_form": action_form,
        "edit_form": _now_shown(edit_form or JobEditForm(), {
            "concurrency": job.concurrency, "rate_limit_rps": job.rate_limit_rps or "none"}),
        "offered": _offered(job),
    }, status=status)


@dashboard_view
@require_GET
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job(job_id)
    blocks = {LIVE_ID: ("batch/_job_live.html", _live),
              CHARTS_ID: ("batch/_job_charts.html", _charts)}
    target = _htmx_target(request)
    if target in blocks:
        name, context = blocks[target]
        return refresh_if_changed(request, render(request, name, context(job)), job.state)
    return _render_job(request, job)


@dashboard_view
@require_POST
def job_action(request: HttpRequest, job_id: int) -> HttpResponseBase:
    """Pause, resume or cancel, always with a reason (audited, and a manual intervention on
    the job's timeline). A refusal is shown on the page with its status; nothing changed."""
    job = _job(job_id)
    form = JobActionForm(request.POST)
    return form_action(
        request, form, lambda data: ACTIONS[data["action"]](
            actor=actor_from_request(request), job=job, reason=data["reason"]),
        success=lambda _: f"{ACTION_DONE[form.cleaned_data['action']]} batch job {job.pk}.",
        then=lambda _: job_url(job), renamed=FORM_FIELDS,
        invalid=lambda done: _render_job(request, _job(job_id), action_form=form,
                                         status=done.status))


def _edit_values(form: JobEditForm) -> dict[str, Any]:
    data = form.cleaned_data
    return {"concurrency": data.get("concurrency"), "rate_limit_rps": data.get("rate_limit_rps"),
            "reason": data["reason"]}


@dashboard_view
@require_POST
def job_edit(request: HttpRequest, job_id: int) -> HttpResponseBase:
    job = _job(job_id)
    form = JobEditForm(request.POST)
    return form_action(
        request, form, lambda data: services.job_edit(
            actor=actor_from_request(request), job=job, **_edit_values(form)),
        success=lambda changed: (f"Changed batch job {job.pk}: concurrency "
                                 f"{changed.concurrency}, rate limit "
                                 f"{changed.rate_limit_rps or 'none'}."),
        then=lambda _: job_url(job), renamed=FORM_FIELDS,
        invalid=lambda done: _render_job(request, _job(job_id), edit_form=form,
                                         status=done.status))


def _stream(lines: Iterator[bytes], filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@dashboard_view
@require_GET
def job_output(request: HttpRequest, job_id: int) -> StreamingHttpResponse:
    """The output file (OpenAI Batch output format), streamed: what exists so far, also for
    an expired or cancelled job."""
    job = _job(job_id)
    return _stream(outputs.blocks(outputs.output_lines(job)), f"{job.public_id}_output.jsonl")


@dashboard_view
@require_GET
def job_errors(request: HttpRequest, job_id: int) -> StreamingHttpResponse:
    job = _job(job_id)
    return _stream(outputs.blocks(outputs.error_lines(job)), f"{job.public_id}_errors.jsonl")


# ---- soaks -----------------------------------------------------------------------------------

def _soak_live(soak_row: Soak) -> dict[str, Any]:
    return {"soak": soak_row, "soak_live_id": SOAK_LIVE_ID,
            "polling": soak_row.state == Soak.State.RUNNING,
            "summary": soak.soak_summary(soak_row),
            "every_text": duration_text(soak_row.every_s),
            "duration_text": duration_text(soak_row.duration_s)}


def _render_soak(request: HttpRequest, soak_row: Soak, *, stop_form: SoakStopForm | None = None,
                 edit_form: SoakEditForm | None = None, status: int = 200) -> HttpResponse:
    return render(request, "batch/soak_detail.html", {
        **_soak_live(soak_row),
        "arbitrage": cost.plan_arbitrage(soak_row.plan, soak_row),
        "events": selectors.soak_events(soak_row, limit=EVENTS_SHOWN),
        "stop_form": stop_form or SoakStopForm(),
        "edit_form": _now_shown(edit_form or SoakEditForm(), {
            "every": duration_text(soak_row.every_s),
            "duration": duration_text(soak_row.duration_s), "concurrency": soak_row.concurrency,
            "rate_limit_rps": soak_row.rate_limit_rps or "none"}),
    }, status=status)


@dashboard_view
@require_GET
def soak_detail(request: HttpRequest, soak_id: int) -> HttpResponse:
    soak_row = _soak(soak_id)
    if _htmx_target(request) == SOAK_LIVE_ID:
        return refresh_if_changed(
            request, render(request, "batch/_soak_live.html", _soak_live(soak_row)),
            soak_row.state)
    return _render_soak(request, soak_row)


@dashboard_view
@require_POST
def soak_stop(request: HttpRequest, soak_id: int) -> HttpResponseBase:
    """Stop the soak: a manual intervention (the soak cannot pass after it)."""
    soak_row = _soak(soak_id)
    form = SoakStopForm(request.POST)
    return form_action(
        request, form, lambda data: soak.soak_stop(
            actor=actor_from_request(request), soak=soak_row,
            reason=form.cleaned_data["reason"]),
        success=lambda _: f"Stopped soak {soak_row.pk}.", then=lambda _: soak_url(soak_row),
        renamed=FORM_FIELDS,
        invalid=lambda done: _render_soak(request, _soak(soak_id), stop_form=form,
                                          status=done.status))


@dashboard_view
@require_POST
def soak_edit(request: HttpRequest, soak_id: int) -> HttpResponseBase:
    """Change the soak's schedule or limits: a manual intervention (the soak cannot pass
    after it)."""
    soak_row = _soak(soak_id)
    form = SoakEditForm(request.POST)
    return form_action(
        request, form, lambda data: soak.soak_edit(
            actor=actor_from_request(request), soak=soak_row,
            reason=form.cleaned_data["reason"], **form.changes()),
        success=lambda _: (f"Changed soak {soak_row.pk}; it now counts a manual "
                           "intervention."),
        then=lambda _: soak_url(soak_row), renamed=FORM_FIELDS,
        invalid=lambda done: _render_soak(request, _soak(soak_id), edit_form=form,
                                          status=done.status))


@dashboard_view
@require_http_methods(["GET", "POST"])
def soak_start(request: HttpRequest, plan: str) -> HttpResponse:
    """The plan page's "Start a soak" on a page of its own: a refusal (the plan not in stage
    3, a soak already running, a bad input file) is shown with what was typed."""
    the_plan = get_or_404(plans.plan_get, name=plan, what=f"plan named {plan!r}")
    posted = request.method == "POST"
    form = SoakStartForm(request.POST if posted else None, request.FILES if posted else None)
    return _with_input_file(
        request, form, lambda batch_file: soak.soak_create(
            actor=actor_from_request(request), plan=the_plan, input_file=batch_file,
            **form.service_kwargs()),
        success=lambda started: (f"Started soak {started.pk} on "
                                 f"{the_plan.candidate_pool.name}: a job every "
                                 f"{duration_text(started.every_s)} for "
                                 f"{duration_text(started.duration_s)}."),
        then=soak_url,
        page=lambda status: render(request, "batch/soak_start.html",
                                   {"plan": the_plan, "form": form}, status=status))
