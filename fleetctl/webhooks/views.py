"""Webhook pages: the list, a form to add or change one, and each webhook's deliveries with
their attempts."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts import roles
from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.views import (
    button_action,
    form_page,
    get_or_404,
)
from fleetctl.webhooks import selectors, services
from fleetctl.webhooks.forms import WebhookForm
from fleetctl.webhooks.models import EVENTS, Webhook

DELIVERIES_PER_PAGE = 50


def _detail_url(hook: Webhook) -> str:
    return reverse("webhooks:detail", args=[hook.name])


@dashboard_view
@require_GET
def webhook_list(request: HttpRequest) -> HttpResponse:
    hooks = list(selectors.webhook_list())
    last = selectors.deliveries_latest(webhooks=hooks)
    rows = [(hook, last.get(hook.pk)) for hook in hooks]
    return render(request, "webhooks/list.html", {"rows": rows, "events": sorted(EVENTS.items())})


@dashboard_view
@require_http_methods(["GET", "POST"])
def webhook_create(request: HttpRequest) -> HttpResponseBase:
    actor = actor_from_request(request)
    form = WebhookForm(request.POST if request.method == "POST" else None,
                       can_trust=actor.can(roles.ADMIN_MANAGE))
    return form_page(
        request, form, lambda _data: services.webhook_create(actor=actor, **form.changes()),
        success=lambda hook: f"Created webhook {hook.name}.", then=_detail_url,
        template="webhooks/form.html", flash_refusals=True)


@dashboard_view
@require_http_methods(["GET", "POST"])
def webhook_edit(request: HttpRequest, name: str) -> HttpResponseBase:
    hook = get_or_404(selectors.webhook_get, name=name, what=f"webhook named {name}")
    actor = actor_from_request(request)
    # A reader sees the form (disabled) with the URL as readers see it everywhere.
    url = hook.url if actor.can(roles.FLEET_MANAGE) else hook.url_shown
    initial = {"name": hook.name, "url": url, "events": hook.events,
               "format": hook.format, "active": hook.active, "trusted": hook.trusted}
    form = WebhookForm(request.POST if request.method == "POST" else None, initial=initial,
                       editing=True, can_trust=actor.can(roles.ADMIN_MANAGE))
    return form_page(
        request, form, lambda _data: services.webhook_update(actor=actor, webhook=hook,
                                                             **form.changes()),
        success=lambda saved: f"Saved webhook {saved.name}.", then=_detail_url,
        template="webhooks/form.html", context=lambda: {"webhook": hook}, flash_refusals=True)


@dashboard_view
@require_POST
def webhook_delete(request: HttpRequest, name: str) -> HttpResponse:
    hook = get_or_404(selectors.webhook_get, name=name, what=f"webhook named {name}")
    if request.POST.get("confirm") != "yes":
        messages.error(request, f"Tick the box to confirm deleting webhook {name} and its "
                                f"delivery records.")
        return redirect("webhooks:detail", name=name)
    return button_action(
        request, lambda: services.webhook_delete(actor=actor_from_request(request),
                                                 webhook=hook),
        success=lambda _: f"Deleted webhook {name} and its delivery records.",
        then=lambda _: reverse("webhooks:list"),
        back=reverse("webhooks:detail", kwargs={"name": name}))


@dashboard_view
@require_POST
def webhook_test(request: HttpRequest, name: str) -> HttpResponse:
    hook = get_or_404(selectors.webhook_get, name=name, what=f"webhook named {name}")
    page = reverse("webhooks:detail", kwargs={"name": name})
    return button_action(
        request, lambda: services.webhook_test(actor=actor_from_request(request), webhook=hook),
        success=lambda delivery: f"Test delivery {delivery.pk} queued.",
        then=lambda _: page, back=page)


@dashboard_view
@require_GET
def webhook_detail(request: HttpRequest, name: str) -> HttpResponse:
    hook = get_or_404(selectors.webhook_get, name=name, what=f"webhook named {name}")
    page = Paginator(selectors.deliveries_for(webhook=hook), DELIVERIES_PER_PAGE).get_page(
        request.GET.get("page"))
    return render(request, "webhooks/detail.html", {"webhook": hook, "page": page})
