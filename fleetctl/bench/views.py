"""Benchmarks dashboard: runs and traces, uploading or generating a trace, starting a run,
and the run page (live progress, per-pool results side by side, charts, the level table,
exports and the metric definitions).

Function views that call selectors (reads) and services (writes, through `call_service`).
htmx asks for the run's live block by targeting its id; the view then renders only that
partial, every 2 s while the run can still change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.bench import charts, selectors, services
from fleetctl.bench.filters import RunFilter
from fleetctl.bench.forms import RunForm, TraceGenerateForm, TraceUploadForm
from fleetctl.bench.models import Level, Run, Trace
from fleetctl.core.charts import figure_data, pool_colours
from fleetctl.core.views import (
    filtered_page,
    form_page,
    get_or_404,
    page_or_block,
    run_cancel_view,
)

LIVE_ID = "run-live"  # the block htmx re-polls on the run page
RUNS_PAGE_SIZE = 25
TRACES_LIMIT = 50


def _trace(name: str) -> Trace:
    return get_or_404(selectors.trace_get, name=name, what=f"trace named {name!r}")


def _run(run_id: int) -> Run:
    return get_or_404(selectors.run_get, run_id=run_id, what=f"benchmark run with id {run_id}")


def _trace_page(trace: Trace) -> str:
    return reverse("bench:trace-detail", kwargs={"name": trace.name})


# --- the list --------------------------------------------------------------------------------

@dashboard_view
@require_GET
def bench_home(request: HttpRequest) -> HttpResponse:
    runs, page = filtered_page(request, RunFilter, selectors.run_list(), RUNS_PAGE_SIZE)
    return render(request, "bench/home.html", {
        "filter": runs, "page": page,
        "traces": selectors.trace_list()[:TRACES_LIMIT],
        "trace_count": selectors.trace_list().count(),
    })


# --- traces ----------------------------------------------------------------------------------

@dashboard_view
@require_http_methods(["GET", "POST"])
def trace_upload(request: HttpRequest) -> HttpResponseBase:
    posted = request.method == "POST"
    form = TraceUploadForm(request.POST if posted else None, request.FILES if posted else None)
    # The uploaded file object (memory or a temporary file), read line by line.
    # A benchmark form's page answers the service's field errors on the form (200) and a
    # refusal as a message with its status, as these pages have always answered.
    return form_page(request, form, lambda data: services.trace_upload(
        actor=actor_from_request(request), name=data["name"], description=data["description"],
        source=data["source"], fileobj=data["file"]),
        success=lambda trace: f"Stored trace {trace.name}: {trace.requests:,} requests.",
        then=_trace_page, template="bench/trace_upload.html", flash_refusals=True)


@dashboard_view
@require_http_methods(["GET", "POST"])
def trace_generate(request: HttpRequest) -> HttpResponseBase:
    form = TraceGenerateForm(request.POST if request.method == "POST" else None)
    return form_page(request, form, lambda _: services.trace_generate(
        actor=actor_from_request(request), **form.service_kwargs()),
        success=lambda trace: f"Generated trace {trace.name}: {trace.requests:,} requests.",
        then=_trace_page, template="bench/trace_generate.html", flash_refusals=True)


@dashboard_view
@require_GET
def trace_detail(request: HttpRequest, name: str) -> HttpResponse:
    trace = _trace(name)
    return render(request, "bench/trace_detail.html", {
        "trace": trace, "summary": trace.summary or {},
        "runs": selectors.trace_runs(trace=trace, limit=RUNS_PAGE_SIZE),
        "file_present": selectors.trace_path(trace).exists(),
    })


# --- runs ------------------------------------------------------------------------------------

def _run_initial(request: HttpRequest) -> dict[str, Any]:
    initial: dict[str, Any] = {"mode": Run.Mode.SEARCH}
    if request.GET.get("trace"):
        initial["trace"] = request.GET["trace"]
    if request.GET.getlist("pool"):
        initial["pools"] = request.GET.getlist("pool")
    return initial


@dashboard_view
@require_http_methods(["GET", "POST"])
def run_create(request: HttpRequest) -> HttpResponseBase:
    form = RunForm(request.POST if request.method == "POST" else None,
                   initial=_run_initial(request))
    return form_page(request, form, lambda _: services.run_create(
        actor=actor_from_request(request), **form.service_kwargs()),
        success=lambda run: f"Started run {run.pk}; it appears below as its levels are "
                            "measured.",
        then=lambda run: reverse("bench:run-detail", kwargs={"run_id": run.pk}),
        template="bench/run_form.html", context=lambda: {"has_traces": selectors.trace_exists()},
        flash_refusals=True)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


@dataclass
class LevelRow:
    """One row of the level table: the level and its summary's numbers in display units."""

    level: Level
    colour: str
    ttft_ms: tuple[float | None, float | None, float | None]
    tpot_p50_ms: float | None
    itl_p95_ms: float | None
    e2e_p95_s: float | None
    request_rate_per_s: float | None
    measured: int
    tokens_fallback: int
    client_lag_p99_ms: float | None
    client_cpu_share: float | None

    @classmethod
    def of(cls, level: Level, colour: str) -> LevelRow:
        s = level.summary or {}
        lags = [x for x in (s.get("schedule_lag_p99_s"), s.get("loop_lag_p99_s"))
                if x is not None]
        return cls(
            level=level, colour=colour,
            ttft_ms=(_ms(s.get("ttft_p50_s")), _ms(s.get("ttft_p95_s")),
                     _ms(s.get("ttft_p99_s"))),
            tpot_p50_ms=_ms(s.get("tpot_p50_s")), itl_p95_ms=_ms(s.get("itl_p95_s")),
            e2e_p95_s=s.get("e2e_p95_s"), request_rate_per_s=s.get("request_rate_per_s"),
            measured=sum(int(s.get(k) or 0) for k in ("n_ok", "n_errors", "n_timeouts")),
            tokens_fallback=int(s.get("n_tokens_fallback") or 0),
            client_lag_p99_ms=_ms(max(lags)) if lags else None,
            client_cpu_share=s.get("client_cpu_share"))


def _run_context(run: Run) -> dict[str, Any]:
    levels = list(selectors.run_levels(run=run))
    outcomes = selectors.run_outcomes(run=run)
    points = selectors.chart_points(levels=levels)
    colours = pool_colours(pool.name for pool in run.pools.all())
    figures = [(element, f"{element}-data", label, figure_data(fig))
               for element, label, fig in charts.run_figures(
                   points, slo_ttft_ms=run.slo_ttft_p95_ms, slo_tpot_ms=run.slo_tpot_p95_ms,
                   timing=run.timing)]
    rows = [LevelRow.of(level, colours.get(level.pool.name, "")) for level in levels]
    return {
        "run": run, "levels": rows, "outcomes": outcomes,
        "progress": selectors.run_progress(run=run, levels=levels),
        "figures": figures if points else [], "colours": colours,
        "polling": run.status in Run.ACTIVE, "live_id": LIVE_ID,
        "fallback_levels": sum(1 for row in rows if row.tokens_fallback),
    }


@dashboard_view
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    return page_or_block(request, "bench/run_detail.html", "bench/_run_live.html",
                         _run_context(_run(run_id)), block_id=LIVE_ID)


run_cancel = dashboard_view(run_cancel_view(
    _run, lambda request, run: services.run_cancel(actor=actor_from_request(request), run=run),
    detail="bench:run-detail",
    said=lambda run: f"Cancelled run {run.pk}; the levels measured so far are kept."))
