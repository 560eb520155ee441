"""Every refused sign-in goes into the audit log, and every lockout it causes.

Django's `user_login_failed` reaches both our receiver and axes' (which counts the failure and,
at the limit, sends `user_locked_out`). Which of the two runs first depends on import order
(the admin's autodiscovery imports axes' receivers early), so the lockout is recorded by
whichever of our receivers runs second: the failure always comes first in the log."""

from __future__ import annotations

from typing import Any

from axes.helpers import get_client_user_agent
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest

from fleetctl.accounts import services
from fleetctl.accounts.backends import REFUSED_LOCKED
from fleetctl.accounts.throttle import client_ip

_FAILURE_RECORDED = "fleetctl_failure_recorded"
_LOCKOUT_PENDING = "fleetctl_lockout_pending"


def _tried(credentials: dict[str, Any] | None) -> str:
    # Django hands receivers the credentials with the password already masked; only the
    # username is read here.
    return str((credentials or {}).get("username") or "")


def _record_lockout(request: HttpRequest, username: str) -> None:
    services.login_lockout_record(username=username, ip_address=client_ip(request),
                                  user_agent=get_client_user_agent(request))


def audit_login_failed(sender: Any, credentials: dict[str, Any] | None = None,
                       request: HttpRequest | None = None, **kwargs: Any) -> None:
    if request is None:  # authenticate() called in-process, not a sign-in over HTTP
        return
    services.login_failure_record(
        username=_tried(credentials), ip_address=client_ip(request),
        user_agent=get_client_user_agent(request),
        while_locked=getattr(request, REFUSED_LOCKED, False))
    setattr(request, _FAILURE_RECORDED, True)
    pending = getattr(request, _LOCKOUT_PENDING, None)
    if pending is not None:
        _record_lockout(request, pending)


def audit_lockout(sender: Any, request: HttpRequest, username: str | None = None,
                  **kwargs: Any) -> None:
    # axes signals again for each attempt made while locked out; those are recorded (as
    # refused) by audit_login_failed, the lockout itself only once.
    if getattr(request, REFUSED_LOCKED, False):
        return
    if getattr(request, _FAILURE_RECORDED, False):
        _record_lockout(request, username or "")
    else:
        setattr(request, _LOCKOUT_PENDING, username or "")


def connect() -> None:
    """Called from AccountsConfig.ready."""
    from axes.signals import user_locked_out

    user_login_failed.connect(audit_login_failed, dispatch_uid="fleetctl-audit-login-failed")
    user_locked_out.connect(audit_lockout, dispatch_uid="fleetctl-audit-lockout")
