"""The `fleetctl` console script, run as a real process against a live server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.fleet.services import pool_model_create

pytestmark = pytest.mark.slow


def run(live_server, *argv: str, token: str | None = None, url: str | None = None,
        timeout_s: float = 60):
    env = dict(os.environ, FLEETCTL_URL=url or live_server.url)
    env.pop("FLEETCTL_TOKEN", None)
    if token is not None:
        env["FLEETCTL_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "fleetctl.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture
def fleet(transactional_db, make_pool, system):
    h200 = make_pool(name="h200-us-east", labels={"driver": "550"})
    pool_model_create(actor=system, pool=h200, model_id="llama-3.1-8b-instruct",
                      quantisation="fp8", max_context_tokens=8192)
    make_pool(name="mi300x-us-east", runtime="rocm", accelerator="MI300X")


@pytest.fixture
def viewer_token(make_user) -> str:
    user = make_user("val", "viewer")
    return token_create_personal(actor=Actor(user=user), name="cli", scopes=["read"]).secret


def test_pools_list_prints_a_table_and_json(live_server, fleet, viewer_token):
    table = run(live_server, "pools", "list", token=viewer_token)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "RUNTIME", "ACCELERATOR"]
    assert any(line.startswith("h200-us-east") and "llama-3.1-8b-instruct (fp8)" in line
               for line in lines)
    as_json = run(live_server, "pools", "list", "--runtime", "rocm", "--json",
                  token=viewer_token)
    assert [p["name"] for p in json.loads(as_json.stdout)] == ["mi300x-us-east"]


def test_pools_show_and_audit(live_server, fleet, viewer_token):
    shown = run(live_server, "pools", "show", "h200-us-east", token=viewer_token)
    assert shown.returncode == 0, shown.stderr
    assert "driver=550" in shown.stdout and "US" in shown.stdout
    audit = run(live_server, "audit", "--action", "pool.", "--json", token=viewer_token)
    actions = {e["action"] for e in json.loads(audit.stdout)}
    assert actions == {"pool.create"}


def test_errors_are_one_clear_line_and_a_nonzero_exit(live_server, fleet, viewer_token):
    missing = run(live_server, "pools", "show", "nope", token=viewer_token)
    assert missing.returncode == 1
    assert missing.stderr.startswith("fleetctl: HTTP 404")
    assert "Traceback" not in missing.stderr
    no_token = run(live_server, "pools", "list")
    assert no_token.returncode == 2 and "FLEETCTL_TOKEN" in no_token.stderr
    bad_token = run(live_server, "pools", "list", token="fct_wrong")
    assert bad_token.returncode == 1 and "Unknown API token" in bad_token.stderr
    pasted_wrong = run(live_server, "pools", "list", token="fct_abc…")  # not ASCII
    assert pasted_wrong.returncode == 2 and "not a token" in pasted_wrong.stderr
    assert "Traceback" not in pasted_wrong.stderr
    unreachable = run(live_server, "pools", "list", token=viewer_token,
                      url="http://127.0.0.1:9")
    assert unreachable.returncode == 1 and "Cannot reach fleetctl" in unreachable.stderr
    bad_flag = run(live_server, "pools", "list", "--health", "meh", token=viewer_token)
    assert bad_flag.returncode == 2 and "invalid choice" in bad_flag.stderr


def test_a_token_without_read_scope_is_refused_by_the_server(live_server, fleet, make_user):
    user = make_user("ops", "on-call")
    token = token_create_personal(actor=Actor(user=user), name="x", scopes=["drain"]).secret
    result = run(live_server, "pools", "list", token=token)
    assert result.returncode == 1 and "HTTP 403" in result.stderr
