"""What every dashboard view shares: turning service errors into form errors and messages,
and the 404 answer. Views stay thin callers of selectors and services; this is the glue.

The guard that needs the signed-in person (`dashboard_view`) lives in
`fleetctl.accounts.dashboard`: core imports nothing of the apps above it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from django import forms
from django.contrib import messages as django_messages
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.http import HttpRequest, HttpResponseServerError, JsonResponse
from django.http.response import HttpResponseBase
from django.template import loader
from django.views import defaults

from fleetctl.core.api.errors import error_body
from fleetctl.core.errors import DomainError
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
