"""Sign-in throttling: django-axes refuses a username from an address after repeated failures
(settings: AXES_*). The password check itself stays with Django's ModelBackend."""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.exceptions import AxesBackendPermissionDenied
from django.http import HttpRequest

# Set on a request whose sign-in was refused because it was already locked out, so the audit
# says "refused: locked out" rather than "wrong password", and the lockout is recorded once.
REFUSED_LOCKED = "fleetctl_refused_locked"


class LoginThrottleBackend(AxesStandaloneBackend):
    def authenticate(  # type: ignore[override]
        self, request: HttpRequest | None, username: str | None = None,
        password: str | None = None, **kwargs: Any,
    ) -> None:
        # Every sign-in over HTTP (the login page, the admin) passes its request. Only code in
        # this process calls authenticate() without one (the test client's login(), a shell),
        # and there is no address to throttle; axes would raise instead of answering.
        if request is None:
            return None
        try:
            return super().authenticate(request, username, password, **kwargs)  # type: ignore[no-any-return]
        except AxesBackendPermissionDenied:
            setattr(request, REFUSED_LOCKED, True)
            raise
