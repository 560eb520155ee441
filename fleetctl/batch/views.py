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
from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Sum
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
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
from fleetctl.batch.models import ACTIVE_STATES, BatchChunk, BatchFile, BatchJob, Soak
from fleetctl.core.charts import figure_data
from fleetctl.core.errors import NotFoundError
from fleetctl.core.views import Outcome, call_for_form
from fleetctl.fleet.models import Pool
from migrations_plan.models import Plan

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


def _call(call: Callable[[], Any], form: Any) -> Outcome[Any]:
    return call_for_form(call, form, renamed=FORM_FIELDS)


def _job_or_404(job_id: int) -> BatchJob:
    try:
        job = selectors.job_get(job_id)
    except (NotFoundError, BatchJob.DoesNotExist) as exc:
        raise Http404(f"No batch job with id {job_id}.") from exc
    if job is None:
        raise Http404(f"No batch job with id {job_id}.")
    return job


def _soak_or_404(soak_id: int) -> Soak:
    found = (Soak.objects.select_related("plan", "pool", "input_file", "evidence",
                                         "cost_evidence").filter(pk=soak_id).first())
    if found is None:
        raise Http404(f"No soak with id {soak_id}.")
    return found


def _seen_changed(request: HttpRequest, state: str, response: HttpResponse) -> HttpResponse:
    if request.GET.get("seen") and request.GET["seen"] != state:
        # The state changed while the page watched: reload once, so the forms offered are
        # the ones this state allows.
        response["HX-Refresh"] = "true"
    return response


def _htmx_target(request: HttpRequest) -> str:
    return str(getattr(getattr(request, "htmx", None), "target", "") or "")


# ---- list ------------------------------------------------------------------------------------

def _chunk_sums(job_ids: list[int]) -> dict[int, dict[str, int]]:
    """Succeeded, failed and retries per job for one page of the list: one query."""
    rows = (BatchChunk.objects.filter(job_id__in=job_ids).values("job_id")
            .annotate(succeeded=Sum("succeeded"), failed=Sum("failed"), retries=Sum("retries"))
            .order_by())
    return {row["job_id"]: {"succeeded": row["succeeded"] or 0, "failed": row["failed"] or 0,
                            "retries": row["retries"] or 0}
            for row in rows}


def _list_rows(jobs: list[BatchJob]) -> list[dict[str, Any]]:
    sums = _chunk_sums([job.pk for job in jobs])
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
    filters = form.filters()
    jobs = selectors.job_list().select_related("pool", "plan", "soak", "input_file")
    jobs = jobs.filter(**filters) if filters is not None else jobs.none()
    page = Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = _list_rows(list(page.object_list))
    context = {"filter_form": form, "page": page, "rows": rows, "list_id": LIST_ID,
               "polling": any(row["job"].is_active for row in rows)}
    if _htmx_target(request) == LIST_ID:
        return render(request, "batch/_job_rows.html", context)
    return render(request, "batch/list.html", context)


# ---- new job ---------------------------------------------------------------------------------

def _pools() -> list[str]:
    return list(Pool.objects.order_by("name").values_list("name", flat=True))


def _upload(request: HttpRequest, form: JobForm | SoakStartForm) -> Outcome[BatchFile]:
    """The form's input file: a new upload through the service (a bad line refuses the whole
    file, the errors named by line on the form's file field; nothing stored), or the file
    picked."""
    data = form.cleaned_data
    if data.get("input_file"):
        picked = BatchFile.objects.filter(pk=data["input_file"]).first()
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
                   pools=_pools(), initial=initial)
    done: Outcome[Any] = Outcome(status=400 if posted else 200)
    if posted and form.is_valid():
        actor = actor_from_request(request)
        uploaded = _upload(request, form)
        done = Outcome(status=uploaded.status)
        if uploaded.result is not None:
            batch_file = uploaded.result
            pool = Pool.objects.get(name=form.cleaned_data["pool"])
            kwargs = form.service_kwargs()
            done = _call(lambda: services.job_create(actor=actor, input_file=batch_file,
                                                     pool=pool, **kwargs), form)
            if done.result is not None:
                job = done.result
                messages.success(request, f"Created batch job {job.pk}: {job.total:,} requests "
                                          f"of {batch_file.name} on {pool.name}.")
                return redirect("batch:job-detail", job_id=job.pk)
            if form.cleaned_data.get("file"):
                _kept_file(request, form, batch_file)
    return render(request, "batch/job_new.html", {"form": form}, status=done.status)


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
    resends = job.resends.all()
    return render(request, "batch/job_detail.html", {
        **_live(job), **_charts(job),
        "comparison": compare.comparison_summary(job),
        "events": list(job.events.order_by("-at", "-id")[:EVENTS_SHOWN]),
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
    job = _job_or_404(job_id)
    blocks = {LIVE_ID: ("batch/_job_live.html", _live),
              CHARTS_ID: ("batch/_job_charts.html", _charts)}
    target = _htmx_target(request)
    if target in blocks:
        name, context = blocks[target]
        return _seen_changed(request, job.state, render(request, name, context(job)))
    return _render_job(request, job)


@dashboard_view
@require_POST
def job_action(request: HttpRequest, job_id: int) -> HttpResponse:
    """Pause, resume or cancel, always with a reason (audited, and a manual intervention on
    the job's timeline). A refusal is shown on the page with its status; nothing changed."""
    job = _job_or_404(job_id)
    form = JobActionForm(request.POST)
    done: Outcome[BatchJob] = Outcome(status=400)
    if form.is_valid():
        action = form.cleaned_data["action"]
        actor = actor_from_request(request)
        done = _call(lambda: ACTIONS[action](actor=actor, job=job,
                                             reason=form.cleaned_data["reason"]), form)
        if done.result is not None:
            messages.success(request, f"{ACTION_DONE[action]} batch job {job.pk}.")
            return redirect("batch:job-detail", job_id=job.pk)
        job = _job_or_404(job_id)
    return _render_job(request, job, action_form=form, status=done.status)


@dashboard_view
@require_POST
def job_edit(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_or_404(job_id)
    form = JobEditForm(request.POST)
    done: Outcome[BatchJob] = Outcome(status=400)
    if form.is_valid():
        actor = actor_from_request(request)
        data = form.cleaned_data
        done = _call(lambda: services.job_edit(
            actor=actor, job=job, concurrency=data.get("concurrency"),
            rate_limit_rps=data.get("rate_limit_rps"), reason=data["reason"]), form)
        if done.result is not None:
            messages.success(request, f"Changed batch job {job.pk}: concurrency "
                                      f"{done.result.concurrency}, rate limit "
                                      f"{done.result.rate_limit_rps or 'none'}.")
            return redirect("batch:job-detail", job_id=job.pk)
        job = _job_or_404(job_id)
    return _render_job(request, job, edit_form=form, status=done.status)


def _stream(lines: Iterator[bytes], filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@dashboard_view
@require_GET
def job_output(request: HttpRequest, job_id: int) -> StreamingHttpResponse:
    """The output file (OpenAI Batch output format), streamed: what exists so far, also for
    an expired or cancelled job."""
    job = _job_or_404(job_id)
    return _stream(outputs.blocks(outputs.output_lines(job)), f"{job.public_id}_output.jsonl")


@dashboard_view
@require_GET
def job_errors(request: HttpRequest, job_id: int) -> StreamingHttpResponse:
    job = _job_or_404(job_id)
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
        "events": list(soak_row.events.order_by("-at", "-id")[:EVENTS_SHOWN]),
        "stop_form": stop_form or SoakStopForm(),
        "edit_form": _now_shown(edit_form or SoakEditForm(), {
            "every": duration_text(soak_row.every_s),
            "duration": duration_text(soak_row.duration_s), "concurrency": soak_row.concurrency,
            "rate_limit_rps": soak_row.rate_limit_rps or "none"}),
    }, status=status)


@dashboard_view
@require_GET
def soak_detail(request: HttpRequest, soak_id: int) -> HttpResponse:
    soak_row = _soak_or_404(soak_id)
    if _htmx_target(request) == SOAK_LIVE_ID:
        return _seen_changed(request, soak_row.state,
                             render(request, "batch/_soak_live.html", _soak_live(soak_row)))
    return _render_soak(request, soak_row)


@dashboard_view
@require_POST
def soak_stop(request: HttpRequest, soak_id: int) -> HttpResponse:
    """Stop the soak: a manual intervention (the soak cannot pass after it)."""
    soak_row = _soak_or_404(soak_id)
    form = SoakStopForm(request.POST)
    done: Outcome[Soak] = Outcome(status=400)
    if form.is_valid():
        actor = actor_from_request(request)
        done = _call(lambda: soak.soak_stop(actor=actor, soak=soak_row,
                                            reason=form.cleaned_data["reason"]), form)
        if done.result is not None:
            messages.success(request, f"Stopped soak {soak_row.pk}.")
            return redirect("batch:soak-detail", soak_id=soak_row.pk)
        soak_row = _soak_or_404(soak_id)
    return _render_soak(request, soak_row, stop_form=form, status=done.status)


@dashboard_view
@require_POST
def soak_edit(request: HttpRequest, soak_id: int) -> HttpResponse:
    """Change the soak's schedule or limits: a manual intervention (the soak cannot pass
    after it)."""
    soak_row = _soak_or_404(soak_id)
    form = SoakEditForm(request.POST)
    done: Outcome[Soak] = Outcome(status=400)
    if form.is_valid():
        actor = actor_from_request(request)
        done = _call(lambda: soak.soak_edit(actor=actor, soak=soak_row,
                                            reason=form.cleaned_data["reason"],
                                            **form.changes()), form)
        if done.result is not None:
            messages.success(request, f"Changed soak {soak_row.pk}; it now counts a manual "
                                      "intervention.")
            return redirect("batch:soak-detail", soak_id=soak_row.pk)
        soak_row = _soak_or_404(soak_id)
    return _render_soak(request, soak_row, edit_form=form, status=done.status)


def _plan_or_404(name: str) -> Plan:
    plan = Plan.objects.select_related("candidate_pool", "primary_pool").filter(name=name).first()
    if plan is None:
        raise Http404(f"No plan named {name!r}.")
    return plan


@dashboard_view
@require_http_methods(["GET", "POST"])
def soak_start(request: HttpRequest, plan: str) -> HttpResponse:
    """The plan page's "Start a soak" on a page of its own: a refusal (the plan not in stage
    3, a soak already running, a bad input file) is shown with what was typed."""
    the_plan = _plan_or_404(plan)
    posted = request.method == "POST"
    form = SoakStartForm(request.POST if posted else None, request.FILES if posted else None)
    done: Outcome[Any] = Outcome(status=400 if posted else 200)
    if posted and form.is_valid():
        actor = actor_from_request(request)
        uploaded = _upload(request, form)
        done = Outcome(status=uploaded.status)
        if uploaded.result is not None:
            batch_file = uploaded.result
            kwargs = form.service_kwargs()
            done = _call(lambda: soak.soak_create(actor=actor, plan=the_plan,
                                                  input_file=batch_file, **kwargs), form)
            if done.result is not None:
                started = done.result
                messages.success(request, f"Started soak {started.pk} on "
                                          f"{the_plan.candidate_pool.name}: a job every "
                                          f"{duration_text(started.every_s)} for "
                                          f"{duration_text(started.duration_s)}.")
                return redirect("batch:soak-detail", soak_id=started.pk)
            if form.cleaned_data.get("file"):
                _kept_file(request, form, batch_file)
    return render(request, "batch/soak_start.html", {"plan": the_plan, "form": form},
                  status=done.status)


def job_url(job: BatchJob) -> str:
    return reverse("batch:job-detail", args=[job.pk])
