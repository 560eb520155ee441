"""Shadow dashboard: the runs, the run page (live counters, divergence against the noise
floor over time, the per-metric verdicts, the most divergent pairs side by side) and the
forms that start, adjust and stop a run. Views stay thin: selectors read, services write.

The run page has two live blocks that htmx re-polls while the run is running: the counters
every 3 s (the collector and the workers move them constantly) and the judgement (chart,
table, verdict) every 15 s, which is how often the judge looks at the pairs. Re-drawing the
chart every 3 s would only burn the reader's CPU.

Stored answers are user content: every text reaches the page through `escape` (the first
divergent token is wrapped in <mark> around escaped pieces), never through `|safe` on raw
text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.utils.html import escape
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.charts import figure_data
from fleetctl.core.views import (
    Outcome,
    filtered_page,
    form_action,
    form_page,
    get_or_404,
)
from fleetctl.inference.chat import prompt_text
from fleetctl.inference.compare import TOKEN_RE
from fleetctl.shadow import charts, live, selectors, services, stats
from fleetctl.shadow.filters import RunFilter
from fleetctl.shadow.forms import AdjustForm, StartForm, StopForm
from fleetctl.shadow.models import ShadowRun
from migrations_plan import selectors as plans

COUNTERS_ID = "shadow-counters"
JUDGEMENT_ID = "shadow-judgement"
PAGE_SIZE = 25
PAIRS_SHOWN = 10
SIDES = ("primary", "secondary", "candidate")
DROP_REASONS = (("dropped_rate", "over the requests/s cap"),
                ("dropped_tokens", "over the daily token cap"),
                ("dropped_behind", "collector or workers behind"),
                ("dropped_malformed", "malformed body"),
                ("dropped_too_large", "body too large"),
                ("dropped_stopped", "run no longer running"),
                ("dropped_residency", "outside the route's residency pin"))
HAPROXY_NOTE = ("HAProxy cannot mirror: these gateways' traffic is not sampled; use a replay "
                "run.")


def _run(run_id: int) -> ShadowRun:
    return get_or_404(selectors.run_get, run_id, what=f"shadow run with id {run_id}")


# ---- pairs side by side ------------------------------------------------------------------------

def _spans(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group()) for m in TOKEN_RE.finditer(text)]


def mark_first_divergence(text: str, reference: str) -> SafeString:
    """`text` escaped, with its first token that differs from `reference`'s (the same
    `TOKEN_RE` split compare() falls back to) wrapped in <mark>. Equal texts come back
    escaped and unmarked; when `text` is a prefix of `reference`, an empty <mark> shows
    where it stopped."""
    mine, theirs = _spans(text), _spans(reference)
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a[2] != b[2]),
              None)
    if at is None:
        if len(mine) == len(theirs):
            return escape(text)
        if len(mine) < len(theirs):
            return mark_safe(escape(text) + '<mark class="cut" title="ends here"></mark>')
        at = len(theirs)
    start, end, _ = mine[at]
    return mark_safe(escape(text[:start]) + '<mark>' + escape(text[start:end]) + '</mark>'
                     + escape(text[end:]))


@dataclass
class PairView:
    pair: Any
    texts: dict[str, SafeString]
    prompt: str

    @property
    def has_text(self) -> bool:
        return bool(self.texts)


def pair_views(pairs: list[Any]) -> list[PairView]:
    out = []
    for pair in pairs:
        content = pair.content or {}
        texts: dict[str, SafeString] = {}
        if any(isinstance(content.get(side), str) for side in SIDES):
            primary = str(content.get("primary") or "")
            texts = {
                "primary": mark_first_divergence(primary, str(content.get("candidate") or "")),
                "secondary": mark_first_divergence(str(content.get("secondary") or ""),
                                                   primary),
                "candidate": mark_first_divergence(str(content.get("candidate") or ""),
                                                   primary),
            }
        out.append(PairView(pair=pair, texts=texts, prompt=prompt_text(content.get("prompt"))))
    return out


# ---- the pieces of the run page -----------------------------------------------------------------

def _counters(run: ShadowRun) -> dict[str, Any]:
    counters: dict[str, int | None] = dict(selectors.live_counters(run))
    if "tokens_today" not in counters:
        try:
            counters["tokens_today"] = live.tokens_today(run.pk)
        except redis.RedisError:  # the page still shows what the run folded in
            counters["tokens_today"] = None
    drops = [(key, label, int(counters.get(key) or 0)) for key, label in DROP_REASONS]
    return {"counters": counters, "drops": drops,
            "dropped_total": sum(n for _, _, n in drops)}


def metric_rows(judgement: Any) -> list[dict[str, Any]]:
    """The latest judgement's metrics, the gated ones first (the verdict reads only them)."""
    if judgement is None:
        return []
    rows = [{"metric": name, **values} for name, values in (judgement.metrics or {}).items()]
    rows.sort(key=lambda r: (not r.get("gated"), r["metric"] != charts.HEADLINE))
    return rows


def latency_rows(judgement: Any) -> list[dict[str, Any]]:
    """The latest judgement's latency summary, one row per side in the triple's order."""
    latency = (judgement.latency or {}) if judgement is not None else {}
    return [{"side": side, "ttft": latency[side].get("ttft_ms"),
             "tpot": latency[side].get("tpot_ms"), "whole": latency[side].get("latency_ms")}
            for side in stats.SIDES if side in latency]


def _judgement(run: ShadowRun) -> dict[str, Any]:
    judgements = selectors.judgements_picked(run, charts.thin)
    latest = judgements[-1] if judgements else None
    figure = None
    if judgements:
        figure = figure_data(charts.divergence_figure(judgements, margin=run.margin))
    return {"judgements": judgements, "latest": latest, "metrics": metric_rows(latest),
            "latency": latency_rows(latest), "figure": figure,
            "margin_points": run.margin * 100}


def _run_context(request: HttpRequest, run: ShadowRun, **forms: Any) -> dict[str, Any]:
    context: dict[str, Any] = {
        "run": run, "counters_id": COUNTERS_ID, "judgement_id": JUDGEMENT_ID,
        "polling": run.running, "haproxy_note": HAPROXY_NOTE,
        "content_off": run.content == ShadowRun.Content.OFF, "sides": SIDES,
        "confidence_pct": run.confidence * 100,
        **_counters(run), **_judgement(run),
        "pairs": pair_views(list(selectors.pairs_most_divergent(run, limit=PAIRS_SHOWN))),
        "stop_form": forms.get("stop_form") or StopForm(),
        "adjust_form": forms.get("adjust_form") or AdjustForm(run=run),
    }
    return context


# ---- pages ---------------------------------------------------------------------------------------

@dashboard_view
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    runs, page = filtered_page(request, RunFilter, selectors.run_list(), PAGE_SIZE)
    return render(request, "shadow/home.html", {"filter": runs, "page": page})


@dashboard_view
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(run_id)
    target = request.htmx.target  # type: ignore[attr-defined]
    if target == COUNTERS_ID:
        return render(request, "shadow/_counters.html", {
            "run": run, "counters_id": COUNTERS_ID, "polling": run.running,
            **_counters(run)})
    if target == JUDGEMENT_ID:
        return render(request, "shadow/_judgement.html", {
            "run": run, "judgement_id": JUDGEMENT_ID, "polling": run.running,
            **_judgement(run)})
    return render(request, "shadow/run_detail.html", _run_context(request, run))


def _local_next(request: HttpRequest, value: str) -> str:
    if value and url_has_allowed_host_and_scheme(value, allowed_hosts={request.get_host()},
                                                 require_https=request.is_secure()):
        return value
    return ""


def _run_page_again(request: HttpRequest, run: ShadowRun, **forms: Any
                    ) -> Callable[[Outcome[ShadowRun]], HttpResponse]:
    """A refused stop or adjust: the run page (as it now stands) with the form's errors."""
    def page(done: Outcome[ShadowRun]) -> HttpResponse:
        run.refresh_from_db()
        return render(request, "shadow/run_detail.html", _run_context(request, run, **forms),
                      status=done.status)
    return page


def _run_page(run: ShadowRun) -> str:
    return reverse("shadow:run-detail", kwargs={"run_id": run.pk})


@dashboard_view
@require_POST
def run_stop(request: HttpRequest, run_id: int) -> HttpResponseBase:
    """The kill switch: one POST with a reason. The collector stops sampling within a
    second (the service unpublishes the run) and the route's mirror is cleared."""
    run = _run(run_id)
    form = StopForm(request.POST)
    return form_action(
        request, form, lambda data: services.run_stop(
            actor=actor_from_request(request), run=run, reason=form.cleaned_data["reason"]),
        success=lambda _: f"Stopped shadow run {run.pk}: nothing more is sampled.",
        then=lambda _: (_local_next(request, form.cleaned_data.get("next") or "")
                        or f"/shadow/runs/{run.pk}/"),
        invalid=_run_page_again(request, run, stop_form=form))


@dashboard_view
@require_POST
def run_adjust(request: HttpRequest, run_id: int) -> HttpResponseBase:
    run = _run(run_id)
    form = AdjustForm(request.POST, run=run)
    return form_action(
        request, form, lambda data: services.run_adjust(
            actor=actor_from_request(request), run=run, **form.changes()),
        success=lambda _: f"Adjusted shadow run {run.pk}.", then=lambda _: _run_page(run),
        invalid=_run_page_again(request, run, adjust_form=form))


@dashboard_view
@require_http_methods(["GET", "POST"])
def plan_start(request: HttpRequest, name: str) -> HttpResponseBase:
    """Start a run for a plan. The plan page's Shadow panel posts here; a refused start
    renders this page with the form and what was wrong, nothing stored."""
    plan = get_or_404(plans.plan_get, name=name, what=f"plan named {name!r}")
    form = StartForm(request.POST if request.method == "POST" else None, plan=plan)
    return form_page(
        request, form, lambda data: services.run_create(
            actor=actor_from_request(request), plan=plan, **form.service_kwargs()),
        template="shadow/start.html",
        context=lambda: {"plan": plan, "current": selectors.run_for_plan(plan)},
        success=lambda run: (f"Started shadow run {run.pk} for {plan.name}: "
                             f"{run.candidate.name} against {run.primary.name}."),
        then=_run_page)
