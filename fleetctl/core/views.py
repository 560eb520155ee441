"""The dashboard's view kit: what every dashboard view shares. Views stay thin callers of
selectors and services; this is the glue, written once:

- `get_or_404(selector, ..., what=...)`: the one rule for turning a selector's "nothing"
  (None, `NotFoundError`, `DoesNotExist`) into the 404 page.
- `form_action(...)`: selector → form → service → message → redirect (or, for an htmx
  request, `HX-Redirect`), with the page re-rendered with the form's errors and the refusal's
  status when the form or the service says no.
- `form_page(...)`: a page with one form: the form on a GET, `form_action` on a POST.
- `call_service` / `call_for_form`: one service call, its refusals onto the form or a message.
- `button_action(...)`: a write behind a button: service → message → redirect.
- `run_cancel_view(...)`: an evidence job's run-cancel view (bench, conformance, evals).
- `page_or_block(...)`: a page, or for htmx's poll of its live block that block alone.
- `filtered_page(...)`: a list page's filter and page.
- `refresh_if_changed(...)`: a polled block whose object changed state asks htmx to reload
  the page once, so the buttons offered match the state.

The guard that needs the signed-in person (`dashboard_view`) lives in
`fleetctl.accounts.dashboard`: core imports nothing of the apps above it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django import forms
from django.contrib import messages as django_messages
from django.core.exceptions import NON_FIELD_ERRORS, ObjectDoesNotExist, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseServerError, JsonResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.template import loader
from django.urls import reverse
from django.views import defaults
from django.views.decorators.http import require_POST

from fleetctl.core.api.errors import error_body, openai_error_body
from fleetctl.core.errors import DomainError, NotFoundError
from fleetctl.core.requestid import current_request_id

T = TypeVar("T")


@dataclass
class Outcome(Generic[T]):
    """What a dashboard write came to: the service's result, or the status to answer with."""

    result: T | None = None
    status: int = 200
    ok: bool = False


def call_service(
    request: HttpRequest, call: Callable[[], T], *, form: forms.BaseForm | None = None
) -> Outcome[T]:
    """Run one service call for a view. Field errors go onto `form` (answered 200, as Django
    does for invalid forms); refusals (403, 404, 409) become a message and their status."""
    try:
        return Outcome(result=call(), ok=True)
    except ValidationError as exc:
        if form is None:
            django_messages.error(request, " ".join(exc.messages))
            return Outcome(status=400)
        form_add_service_errors(form, exc)
        return Outcome()
    except DomainError as exc:
        django_messages.error(request, exc.message)
        return Outcome(status=exc.status_code)


def call_for_form(call: Callable[[], T], form: forms.BaseForm, *,
                  renamed: dict[str, str] | None = None) -> Outcome[T]:
    """A service call for a form whose page shows every refusal on the form itself: field
    errors onto its fields (`renamed`: the service's argument name -> the form's field name
    where they differ), a refusal (403, 409) at its top with the refusal's status, so the
    person reads why next to what they pressed."""
    try:
        return Outcome(result=call(), ok=True)
    except ValidationError as exc:
        if renamed and hasattr(exc, "error_dict"):
            exc = ValidationError({renamed.get(field, field): errors
                                   for field, errors in exc.error_dict.items()})
        form_add_service_errors(form, exc)
        return Outcome(status=400)
    except DomainError as exc:
        form.add_error(None, exc.message)
        return Outcome(status=exc.status_code)


def get_or_404(select: Callable[..., T | None], /, *args: object, what: str,
               **kwargs: object) -> T:
    """The selector's object, or the 404 page saying `No {what}.` Selectors answer "nothing"
    as None (or raise `NotFoundError` / `DoesNotExist`); this is the one place a view turns
    that into a 404, so every page says it the same way."""
    try:
        found = select(*args, **kwargs)
    except (NotFoundError, ObjectDoesNotExist) as exc:
        raise Http404(f"No {what}.") from exc
    if found is None:
        raise Http404(f"No {what}.")
    return found


def go_to(request: HttpRequest, url: str) -> HttpResponse:
    """After a write: a redirect, or for an htmx request `HX-Redirect` (htmx would otherwise
    swap the whole next page into the element that posted)."""
    if request.headers.get("HX-Request") == "true" and not request.headers.get("HX-Boosted"):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = url
        return response
    return redirect(url)


def form_action(request: HttpRequest, form: forms.BaseForm,
                call: Callable[[dict[str, Any]], T], *, success: Callable[[T], str],
                then: Callable[[T], str], invalid: Callable[[Outcome[T]], HttpResponseBase],
                renamed: dict[str, str] | None = None,
                flash_refusals: bool = False) -> HttpResponseBase:
    """The dashboard's one write: validate `form`; call the service with its cleaned data;
    on success a message (`success(result)`) and a redirect to `then(result)`; otherwise
    `invalid(outcome)` re-renders the page with the form's errors and the status to answer
    (400 for the form or a field, the refusal's 403/404/409). Nothing is written on a refusal
    (services are transactions). `flash_refusals`: the pages that show a refusal as a
    message above the page (`call_service`), and the form's own errors with 200."""
    done: Outcome[T] = Outcome(status=200 if flash_refusals else 400)
    if form.is_valid():
        data = form.cleaned_data
        done = (call_service(request, lambda: call(data), form=form) if flash_refusals
                else call_for_form(lambda: call(data), form, renamed=renamed))
        if done.ok:
            result: T = done.result  # type: ignore[assignment]
            django_messages.success(request, success(result))
            return go_to(request, then(result))
    return invalid(done)


def form_page(request: HttpRequest, form: forms.BaseForm, call: Callable[[dict[str, Any]], T],
              *, template: str, success: Callable[[T], str], then: Callable[[T], str],
              context: Callable[[], dict[str, Any]] | None = None,
              renamed: dict[str, str] | None = None,
              flash_refusals: bool = False) -> HttpResponseBase:
    """A page with one form: on a GET, `template` with the form (as `form`) and `context()`;
    on a POST, `form_action` (the service, a message and the result's page), the same page
    again with the form's errors and the status to answer when the form or the service says
    no. `context` is read only when the page is shown."""
    def page(done: Outcome[T]) -> HttpResponse:
        extra = context() if context is not None else {}
        return render(request, template, {"form": form, **extra}, status=done.status)

    if request.method != "POST":
        return page(Outcome())
    return form_action(request, form, call, success=success, then=then, invalid=page,
                       renamed=renamed, flash_refusals=flash_refusals)


def button_action(request: HttpRequest, call: Callable[[], T], *,
                  success: Callable[[T], str], then: Callable[[T], str],
                  back: str) -> HttpResponse:
    """A write behind a button (no form to re-render): the service's result gets a message
    and a redirect to `then(result)`; a refusal is a message and a redirect to `back`, the
    page the button was on."""
    done = call_service(request, call)
    if not done.ok:
        return go_to(request, back)
    result: T = done.result  # type: ignore[assignment]
    django_messages.success(request, success(result))
    return go_to(request, then(result))


def run_cancel_view(get_run: Callable[[int], T], cancel: Callable[[HttpRequest, T], object], *,
                    detail: str, said: Callable[[T], str]) -> Callable[..., HttpResponse]:
    """The `run_cancel` view of an evidence job's run pages (`fleetctl.core.urls.job_run_urls`):
    a POST cancels run `run_id` (`get_run`, then `cancel(request, run)`), says what was kept
    (`said(run)`) and goes back to the run's page (URL name `detail`), also on a refusal.
    The app wraps it in its guard (`dashboard_view`)."""

    @require_POST
    def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
        run = get_run(run_id)
        page = reverse(detail, kwargs={"run_id": run_id})
        return button_action(request, lambda: cancel(request, run), success=lambda _: said(run),
                             then=lambda _: page, back=page)

    return run_cancel


def page_or_block(request: HttpRequest, page: str, block: str, context: dict[str, Any], *,
                  block_id: str) -> HttpResponse:
    """A page whose block `block_id` htmx polls: that block's template alone when the poll
    asks for it, the whole page otherwise, both from the same context."""
    if request.htmx.target == block_id:  # type: ignore[attr-defined]
        return render(request, block, context)
    return render(request, page, context)


def filtered_page(request: HttpRequest, filterset_class: Callable[..., Any], queryset: Any,
                  size: int) -> tuple[Any, Any]:
    """A list page's filter (empty choices read "any") and the page of its rows asked for."""
    found = filterset_class(request.GET or None, queryset=queryset)
    filter_form_says_any(found.form)
    return found, Paginator(found.qs, size).get_page(request.GET.get("page"))


def refresh_if_changed(request: HttpRequest, response: HttpResponse, state: str) -> HttpResponse:
    """A polled block sends `?seen=<state it loaded with>`: when the object's state changed
    meanwhile, ask htmx to reload the page once, so the forms offered are this state's."""
    seen = request.GET.get("seen")
    if seen and seen != state:
        response["HX-Refresh"] = "true"
    return response


def form_add_service_errors(form: forms.BaseForm, exc: ValidationError) -> None:
    """Put a service's ValidationError onto the form: on the field it names when the form
    has that field, otherwise at the top of the form, so no message is ever lost."""
    if not hasattr(exc, "error_dict"):
        for message in exc.messages:
            form.add_error(None, message)
        return
    for field, messages in exc.message_dict.items():
        target = field if field in form.fields and field != NON_FIELD_ERRORS else None
        for message in messages:
            label = "" if target or field == NON_FIELD_ERRORS else f"{field}: "
            form.add_error(target, f"{label}{message}")


def filter_form_says_any(form: forms.BaseForm) -> None:
    """An empty choice in a filter form means "any"; say so instead of "---------"."""
    for field in form.fields.values():
        # django-filter's choice fields prepend `empty_label` to their choices themselves.
        if isinstance(field, forms.ChoiceField) and getattr(field, "empty_label", None):
            field.empty_label = "any"  # type: ignore[attr-defined]
            # The widget holds a copy of the choices made before this form existed.
            field.widget.choices = field.choices  # type: ignore[attr-defined]


def not_found(request: HttpRequest, exception: Exception) -> HttpResponseBase:
    """settings.handler404: a path no URL matches (e.g. /api/v1/drains/1.5/) gets the API's
    one error shape under /api/, the Not found page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body(
            "not_found", "Nothing at this path: check the id or name in it, and the endpoint "
                         "against /api/docs/."), status=404)
    if request.path.startswith("/openai/"):
        return JsonResponse(openai_error_body(
            f"Unknown URL: {request.method} {request.path[:200]} (the OpenAI Batch API serves "
            f"/openai/v1/files and /openai/v1/batches).", code="unknown_url"), status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponseBase:
    """urls.handler500: the page names the request's id, which is in the log beside the
    traceback, so a person can quote it (a browser shows no response header). Under /api/
    the API's one error shape, with the id in its message. Rendered without the request's
    context, like Django's own 500 page: a context processor could be what failed."""
    request_id = getattr(request, "request_id", "") or current_request_id()
    if request.path.startswith("/api/"):
        return JsonResponse(error_body(
            "server_error", f"Something broke on our side; it was logged with request id "
                            f"{request_id or 'unknown'}. Quote it when you report the "
                            f"problem."), status=500)
    html = loader.get_template("500.html").render({"request_id": request_id})
    return HttpResponseServerError(html)
