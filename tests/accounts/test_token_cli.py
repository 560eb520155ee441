"""`fleetctl token show | revoke`, run as a real process against a live server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.models import ApiToken
from fleetctl.accounts.services import token_create_service

pytestmark = pytest.mark.slow


def run(live_server: Any, *argv: str, token: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLEETCTL_URL=live_server.url, FLEETCTL_TOKEN=token)
    return subprocess.run([sys.executable, "-m", "fleetctl.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=60)


def test_token_revoke_revokes_the_token_the_cli_uses(live_server: Any, transactional_db: None):
    issued = token_create_service(actor=Actor.for_system("test"), name="ci-bot",
                                  scopes=["read"])
    shown = run(live_server, "token", "show", "--json", token=issued.secret)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["name"] == "ci-bot"

    revoked = run(live_server, "token", "revoke", token=issued.secret)
    assert revoked.returncode == 0, revoked.stderr
    assert f"Revoked token {issued.token.prefix}… (ci-bot)" in revoked.stdout
    assert ApiToken.objects.get(pk=issued.token.pk).revoked_at is not None

    again = run(live_server, "token", "revoke", token=issued.secret)
    assert again.returncode == 1
    assert "HTTP 401: This API token was revoked." in again.stderr
