"""Settings fail loudly on what would be unsafe or ambiguous in production."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def _load_settings(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    return subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.DEBUG)"],
        cwd=ROOT, env={**clean, "DJANGO_SETTINGS_MODULE": "fleetctl.settings", **env},
        capture_output=True, text=True, timeout=60,
    )


def test_production_refuses_to_start_without_a_secret_key():
    result = _load_settings(DEBUG="0")
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


def test_production_with_a_secret_key_starts_with_secure_cookies():
    result = subprocess.run(
        [sys.executable, "-c",
         "from django.conf import settings; print(settings.DEBUG, settings.SESSION_COOKIE_SECURE)"],
        cwd=ROOT, env={**os.environ, "DJANGO_SETTINGS_MODULE": "fleetctl.settings",
                       "DEBUG": "0", "SECRET_KEY": "x" * 50},
        capture_output=True, text=True, timeout=60,
    )
    assert result.stdout.split() == ["False", "True"], result.stderr


def test_a_misspelt_boolean_is_an_error_not_a_guess():
    result = _load_settings(DEBUG="maybe")
    assert result.returncode != 0 and "DEBUG='maybe' is not a boolean" in result.stderr


def _env_example() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line[:1].isupper() and "=" in line)


def test_env_example_ships_debug_off_and_no_key_so_it_starts_only_once_given_one():
    shipped = _env_example()
    assert (shipped["DEBUG"], shipped["SECRET_KEY"]) == ("0", "")

    refused = _load_settings(**shipped)
    assert refused.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in refused.stderr

    started = _load_settings(**{**shipped, "SECRET_KEY": "x" * 50})
    assert started.stdout.split() == ["False"], started.stderr
