"""Envoy access log lines in the JSON format the bootstrap renders (envoy/accesslog.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def envoy_line(*, start: float, route: str = "chat", pool: str = "pa", status: int = 200,
               duration_ms: float = 120.0, ttft_ms: float | None = 40.0, bytes_out: int = 900,
               attempts: int = 1, streamed: bool = True, flags: str = "-") -> bytes:
    entry: dict[str, Any] = {
        "start": f"{start:.3f}", "route": route, "pool": pool, "status": status,
        "duration_ms": duration_ms, "ttft_ms": ttft_ms, "bytes": bytes_out,
        "attempts": attempts,
        "ctype": "text/event-stream" if streamed else "application/json", "flags": flags,
    }
    return json.dumps(entry).encode() + b"\n"


def ingester_env() -> dict[str, str]:
    """The environment for an ingester subprocess on the test database."""
    from django.conf import settings
    from django.db import connection

    db = settings.DATABASES["default"]
    env = dict(os.environ)
    if db["ENGINE"].endswith("postgresql"):
        env["DATABASE_URL"] = (f"postgres://{db.get('USER') or 'postgres'}@"
                               f"{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/"
                               f"{connection.settings_dict['NAME']}")
    env["REDIS_URL"] = settings.REDIS_URL
    env["PYTHONUNBUFFERED"] = "1"
    # A killed ingester's successor waits out its lease: 3 s (not 10) keeps the kill tests
    # short, still 15 flush intervals of 0.2 s, so a live holder never lets it lapse.
    env["TELEMETRY_LEASE_MIN_S"] = "3"
    env["TELEMETRY_LEASE_WAIT_S"] = "0.5"
    return env


def start_ingester(log: Path, *args: str,
                   env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`python -m fleetctl.telemetry.ingest ARGS` on `env` (ingester_env() when None),
    appending to `log`; returned at once (tests/ramps/e2e.py `Ingester` waits for its lease).
    The one starter of the tests' ingester processes."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fleetctl.telemetry.ingest", "--log-level", "INFO", *args],
            cwd=REPO, env=ingester_env() if env is None else env, stdout=out,
            stderr=subprocess.STDOUT)
