"""Fleet dashboard: overview, pool detail and the registry forms.

Function views that call selectors (reads) and services (writes). htmx asks for a block of the
same page by targeting its id; the view then renders only that block's partial template.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.charts import figure_data
from fleetctl.core.views import (
    call_service,
    filter_form_says_any,
    form_action,
    form_page,
    get_or_404,
)
from fleetctl.fleet import charts, selectors, services
from fleetctl.fleet.filters import PoolFilter
from fleetctl.fleet.forms import CurrencyRateForm, PoolForm, PoolModelForm, RegionForm
from fleetctl.fleet.models import CurrencyRate, Pool, PoolModel

# The ids of the overview blocks htmx refreshes; the view picks the partial by HX-Target.
TILES_ID = "summary-tiles"
POOLS_ID = "pool-groups"
RECENT_PROBES = 50
OVERVIEW_PAGE_SIZE = 100
CHART_HOURS = 24


def _pool_url(pool: Pool) -> str:
    return reverse("fleet:pool-detail", args=[pool.name])


# --- overview --------------------------------------------------------------------------------

@dashboard_view
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    summary = selectors.fleet_summary()
    if request.htmx.target == TILES_ID:  # type: ignore[attr-defined]
        return render(request, "fleet/_summary_tiles.html", {"summary": summary})
    pool_filter = PoolFilter(request.GET or None, queryset=selectors.pool_list())
    filter_form_says_any(pool_filter.form)
    # A page of pools (one join + one prefetch of models, however many pools exist). A person
    # reads a hundred rows, not a thousand; filters and the tiles cover the rest.
    page = Paginator(selectors.pools_for_overview(pool_filter.qs), OVERVIEW_PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    groups = selectors.pools_grouped(selectors.pools_with_interruption(list(page.object_list)))
    context: dict[str, Any] = {
        "summary": summary,
        "groups": groups,
        "page": page,
        "shown": page.paginator.count,
        "filter": pool_filter,
        "filtered": any(value for key, value in request.GET.items() if key != "page"),
        # Rows link to `<pools_url><name>/`: one reverse() per page instead of one per pool.
        "pools_url": reverse("fleet:pool-detail", args=["0"]).removesuffix("0/"),
    }
    if request.htmx.target == POOLS_ID:  # type: ignore[attr-defined]
        return render(request, "fleet/_pool_groups.html", context)
    context["region_codes"] = selectors.region_codes()
    context["model_ids"] = selectors.model_ids_served()
    return render(request, "fleet/overview.html", context)


# --- pool detail -----------------------------------------------------------------------------

def _render_pool_detail(
    request: HttpRequest, pool: Pool, *, model_form: PoolModelForm, status: int = 200
) -> HttpResponse:
    now = timezone.now()
    # Enough rows for a whole day at the configured probe interval, plus slack for retries.
    day_of_probes = CHART_HOURS * 3600 // max(settings.HEALTH_PROBE_INTERVAL_S, 1) + 200
    checks = selectors.pool_health_history(pool=pool, hours=CHART_HOURS, limit=day_of_probes)
    figure = (
        figure_data(charts.probe_latency_figure(checks, until=now, hours=CHART_HOURS))
        if checks else None
    )
    audit_query = urlencode({"object_type": pool._meta.label_lower, "object_id": pool.pk})
    context = {
        "pool": pool,
        "tax": (tax := selectors.pool_interruption(pool=pool)),
        "cost_incl_tax": tax.apply(pool.cost_per_1m_output_tokens),
        "served": _with_reported(pool, list(pool.models.all())),
        "model_form": model_form,
        "figure": figure,
        "probe_count": len(checks),
        "failed_count": sum(1 for check in checks if not check.ok),
        "recent_probes": list(reversed(checks[-RECENT_PROBES:])),
        "transitions": selectors.pool_recent_transitions(pool=pool),
        "audit_url": f"{reverse('audit:list')}?{audit_query}",
        "api_checks_url": f"{reverse('api:health-check-list')}?{urlencode({'pool': pool.name})}",
    }
    return render(request, "fleet/pool_detail.html", context, status=status)


def _with_reported(pool: Pool, entries: list[PoolModel]) -> list[PoolModel]:
    """Each entry with `reported_len`: the max_model_len the pool's servers last reported
    for its model (the health probe), None when they report none; `claims_more` when the
    registry claims more than that (context tiers place the pool by what it serves)."""
    lengths = (pool.reported or {}).get("max_model_len") or {}
    for entry in entries:
        length = lengths.get(entry.model_id)
        entry.reported_len = length if isinstance(length, int) else None  # type: ignore[attr-defined]
        entry.claims_more = (  # type: ignore[attr-defined]
            isinstance(length, int)
            and min(entry.max_context_tokens, pool.max_context_tokens) > length)
    return entries


@dashboard_view
@require_GET
def pool_detail(request: HttpRequest, name: str) -> HttpResponse:
    pool = get_or_404(selectors.pool_get, name=name, what=f"pool named {name!r}")
    return _render_pool_detail(request, pool, model_form=PoolModelForm(pool=pool))


# --- pool forms ------------------------------------------------------------------------------

@dashboard_view
@require_http_methods(["GET", "POST"])
def pool_create(request: HttpRequest) -> HttpResponseBase:
    form = PoolForm(request.POST if request.method == "POST" else None)
    return form_page(
        request, form, lambda data: services.pool_create(actor=actor_from_request(request),
                                                         **data),
        success=lambda pool: f"Registered pool {pool.name}.", then=_pool_url,
        template="fleet/pool_form.html", context=lambda: {"pool": None}, flash_refusals=True)


@dashboard_view
@require_http_methods(["GET", "POST"])
def pool_edit(request: HttpRequest, name: str) -> HttpResponseBase:
    pool = get_or_404(selectors.pool_get, name=name, what=f"pool named {name!r}")
    form = PoolForm(request.POST if request.method == "POST" else None, pool=pool)
    stale_before = pool.cost_stale_reason

    def then(saved: Pool) -> str:
        # After "Saved pool …": an edit that made its cost stale says so once, here.
        stale = saved.cost_stale_reason
        if stale and stale != stale_before:
            messages.warning(request, f"Its cost per 1M output tokens is now stale: {stale}.")
        return _pool_url(saved)

    return form_page(
        request, form, lambda data: services.pool_update(actor=actor_from_request(request),
                                                         pool=pool, **data),
        success=lambda saved: f"Saved pool {saved.name}.", then=then,
        template="fleet/pool_form.html", context=lambda: {"pool": pool}, flash_refusals=True)


@dashboard_view
@require_http_methods(["GET", "POST"])
def pool_delete(request: HttpRequest, name: str) -> HttpResponse:
    pool = get_or_404(selectors.pool_get, name=name, what=f"pool named {name!r}")
    status = 200
    if request.method == "POST":
        actor = actor_from_request(request)
        done = call_service(request, lambda: services.pool_delete(actor=actor, pool=pool))
        if done.ok:
            messages.success(request, f"Deleted pool {name}.")
            return redirect("fleet:overview")
        status = done.status
    return render(request, "fleet/pool_confirm_delete.html", {"pool": pool}, status=status)


# --- served models ---------------------------------------------------------------------------

@dashboard_view
@require_POST
def pool_model_add(request: HttpRequest, name: str) -> HttpResponseBase:
    pool = get_or_404(selectors.pool_get, name=name, what=f"pool named {name!r}")
    form = PoolModelForm(request.POST, pool=pool)
    return form_action(
        request, form, lambda data: services.pool_model_create(
            actor=actor_from_request(request), pool=pool, **data),
        success=lambda entry: f"{pool.name} now serves {entry.model_id}.",
        then=lambda _entry: _pool_url(pool),
        invalid=lambda done: _render_pool_detail(request, pool, model_form=form,
                                                 status=done.status),
        flash_refusals=True)


@dashboard_view
@require_POST
def pool_model_remove(request: HttpRequest, name: str, entry_id: int) -> HttpResponse:
    pool = get_or_404(selectors.pool_get, name=name, what=f"pool named {name!r}")
    entry = selectors.pool_model_get(pool=pool, entry_id=entry_id)
    if entry is None:
        messages.error(request, "That model was already removed from this pool.")
        return redirect("fleet:pool-detail", name=pool.name)
    actor = actor_from_request(request)
    if call_service(request, lambda: services.pool_model_delete(actor=actor, entry=entry)).ok:
        messages.success(request, f"{pool.name} no longer serves {entry.model_id}.")
    return redirect("fleet:pool-detail", name=pool.name)


# --- regions ---------------------------------------------------------------------------------

@dashboard_view
@require_GET
def region_list(request: HttpRequest) -> HttpResponse:
    regions = selectors.region_list()
    return render(request, "fleet/region_list.html", {"regions": regions})


@dashboard_view
@require_http_methods(["GET", "POST"])
def region_create(request: HttpRequest) -> HttpResponseBase:
    form = RegionForm(request.POST if request.method == "POST" else None)
    return form_page(
        request, form, lambda data: services.region_create(actor=actor_from_request(request),
                                                           **data),
        success=lambda region: f"Created region {region.code} ({region.jurisdiction}).",
        then=lambda _region: reverse("fleet:region-list"), template="fleet/region_form.html",
        flash_refusals=True)


# --- currency rates --------------------------------------------------------------------------

RATES_SHOWN = 200


@dashboard_view
@require_http_methods(["GET", "POST"])
def currency_rates(request: HttpRequest) -> HttpResponseBase:
    """Dated exchange rates: the only way costs in two currencies are compared."""
    form = CurrencyRateForm(request.POST if request.method == "POST" else None)
    return form_page(
        request, form, lambda data: services.currency_rate_create(
            actor=actor_from_request(request), **data),
        success=lambda rate: f"Added {rate}.", then=lambda _rate: reverse("fleet:currency-rates"),
        template="fleet/currency_rates.html", flash_refusals=True, context=lambda: {
            "rates": selectors.currency_rate_list()[:RATES_SHOWN],
            "rate_count": selectors.currency_rate_list().count(),
            "audit_url": f"{reverse('audit:list')}?"
                         f"{urlencode({'object_type': CurrencyRate._meta.label_lower})}"})


@dashboard_view
@require_POST
def currency_rate_delete(request: HttpRequest, rate_id: int) -> HttpResponse:
    rate = selectors.currency_rate_get(rate_id=rate_id)
    if rate is None:
        messages.error(request, "That rate was already deleted.")
        return redirect("fleet:currency-rates")
    actor = actor_from_request(request)
    if call_service(request, lambda: services.currency_rate_delete(actor=actor,
                                                                   currency_rate=rate)).ok:
        messages.success(request, f"Deleted {rate}.")
    return redirect("fleet:currency-rates")
