"""The CLI's REST client: one place for the base URL, the token, timeouts and error text."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
# A POST sent with an Idempotency-Key is safe to send again: the server answers a repeat
# with the first answer. Retried (same key) when the answer was lost or the server said to.
RETRY_DELAYS_S = (0.5, 1.0, 2.0)
RETRY_STATUSES = (502, 503, 504)


class CliError(Exception):
    """Something the user can fix; printed without a traceback. exit_code 2 = usage."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ApiClient:
    def __init__(self, base_url: str, token: str, timeout_s: float = 15.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise CliError(
                f"FLEETCTL_URL={base_url!r} is not an http(s) URL, e.g. {DEFAULT_URL}", 2
            )
        if not token:
            raise CliError(
                "No API token. Create one on the dashboard's Tokens page, then "
                "`export FLEETCTL_TOKEN=fct_…` (or pass --token).", 2
            )
        if not token.isascii() or not token.isprintable() or " " in token:
            raise CliError(
                "FLEETCTL_TOKEN is not a token: a token is one word of printable ASCII "
                "(fct_…). Copy it again from the dashboard's Tokens page.", 2
            )
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout_s, follow_redirects=False,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                     "User-Agent": "fleetctl-cli"},
        )

    @classmethod
    def from_env(cls, url: str | None, token: str | None) -> ApiClient:
        return cls(url or os.environ.get("FLEETCTL_URL") or DEFAULT_URL,
                   token or os.environ.get("FLEETCTL_TOKEN", ""))

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        clean = {k: v for k, v in (params or {}).items() if v not in (None, "")}
        return self._send("GET", path, params=clean)

    def post(self, path: str, body: dict[str, Any], params: dict[str, Any] | None = None,
             *, idempotent: bool = False, timeout_s: float | None = None) -> Any:
        """POST `body`. `idempotent`: a change of traffic, sent with a fresh Idempotency-Key
        and sent again with the same key when the answer is lost (a timeout, a dropped
        connection, a 502/503/504, or 409 "in progress"), so a retry never changes twice."""
        clean = {k: v for k, v in (params or {}).items() if v not in (None, "")}
        extra: dict[str, Any] = {}
        if timeout_s is not None:
            extra["timeout"] = timeout_s
        if not idempotent:
            return self._send("POST", path, json=body, params=clean, **extra)
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        for delay in (*RETRY_DELAYS_S, None):
            try:
                response = self._http.request("POST", path, json=body, params=clean,
                                               headers=headers, **extra)
            except (httpx.TimeoutException, httpx.NetworkError) as exc:
                if delay is None:
                    raise self._transport_error(path, exc) from exc
            else:
                if delay is None or not self._retry(response):
                    return self._decode(response)
            time.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises on its last pass

    @staticmethod
    def _retry(response: httpx.Response) -> bool:
        if response.status_code in RETRY_STATUSES:
            return True
        if response.status_code == 409:
            try:
                return bool(response.json()["error"]["code"] == "in_progress")
            except (ValueError, KeyError, TypeError):
                return False
        return False

    def _transport_error(self, path: str, exc: Exception) -> CliError:
        if isinstance(exc, httpx.ConnectError):
            return CliError(f"Cannot reach fleetctl at {self.base_url}: {exc}. "
                            "Is it running (make demo), and is FLEETCTL_URL right?")
        if isinstance(exc, httpx.TimeoutException):
            return CliError(f"{self.base_url}{path} did not answer in time.")
        return CliError(f"{self.base_url}{path}: the connection failed ({exc}).")

    def _send(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.TimeoutException) as exc:
            raise self._transport_error(path, exc) from exc
        return self._decode(response)

    def get_all(self, path: str, params: dict[str, Any] | None = None,
                limit: int | None = None) -> list[dict[str, Any]]:
        """Follow pagination until `limit` rows (or all of them)."""
        rows: list[dict[str, Any]] = []
        page = 1
        while True:
            body = self.get(path, {**(params or {}), "page": page, "page_size": 200})
            rows.extend(body["results"])
            if not body.get("next") or (limit is not None and len(rows) >= limit):
                return rows[:limit] if limit is not None else rows
            page += 1

    def polled(self, item: dict[str, Any], path: str, running: Callable[[dict[str, Any]], bool],
               every_s: float, sleep: Callable[[float], None] | None = None,
               ) -> Iterator[dict[str, Any]]:
        """`item` (a run, a job, a ramp), then `item` read again from `path` every `every_s`
        while `running(item)`: the last one yielded has ended."""
        yield item
        while running(item):
            (sleep or time.sleep)(every_s)
            item = self.get(path)
            yield item

    def _decode(self, response: httpx.Response) -> Any:
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code < 400:
            if body is None:
                raise CliError(f"{response.url} did not answer JSON; is FLEETCTL_URL the "
                               "fleetctl server?")
            return body
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        raise CliError(f"HTTP {response.status_code}: {message or response.text[:200]}")
