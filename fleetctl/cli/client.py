"""The CLI's REST client: one place for the base URL, the token, timeouts and error text."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


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

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._send("POST", path, json=body)

    def _send(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            raise CliError(f"Cannot reach fleetctl at {self.base_url}: {exc}. "
                           "Is it running (make demo), and is FLEETCTL_URL right?") from exc
        except httpx.TimeoutException as exc:
            raise CliError(f"{self.base_url}{path} did not answer in time.") from exc
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
