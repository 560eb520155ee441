"""`fleetctl restore` of a drain already restored: one line naming the restore that did it,
who and when, and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import push, services
from tests.conftest import SYSTEM

pytestmark = pytest.mark.slow
MODEL = "llama-3.1-8b-instruct"


def run(live_server, token: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLEETCTL_URL=live_server.url, FLEETCTL_TOKEN=token)
    return subprocess.run([sys.executable, "-m", "fleetctl.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=60)


def test_restoring_twice_names_the_first_restore(live_server, transactional_db, make_pool,
                                                 make_user, settings, tmp_path: Path):
    settings.FLEETCTL_GATEWAY_KINDS = ["tests.traffic.fake_kind"]
    pools = [make_pool(name="primary"), make_pool(name="cand")]
    for pool in pools:
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = services.route_create(actor=SYSTEM, name="llama", model_id=MODEL,
                                  primary_pool=pools[0], weights={"primary": 80, "cand": 20})
    services.gateway_create(actor=SYSTEM, name="gw-1", kind="file",
                            admin_address=str(tmp_path), options={"file_name": "weights.json"},
                            routes=[route])
    drain = push.drain_push_now(
        services.drain_request(actor=SYSTEM, route=route, reason="incident"))
    assert push.drain_progress(drain_id=drain.pk)
    user = make_user("olga", "on-call")
    token = token_create_personal(actor=Actor(user=user), name="cli",
                                  scopes=["read", "drain"]).secret

    restore = push.drain_push_now(
        services.drain_restore(actor=Actor(user=user), drain=drain, reason="over"))
    restore.refresh_from_db()

    again = run(live_server, token, "restore", str(drain.pk), "--reason", "twice")
    assert again.returncode == 1
    # The restore's status is read when the second one is refused (a worker may be
    # completing it meanwhile): verified or complete.
    line = again.stderr.strip()
    assert line.startswith(
        f"fleetctl: HTTP 409: Drain {drain.pk} was already restored: restore {restore.pk} by "
        f"olga at {restore.requested_at:%Y-%m-%d %H:%M:%S} UTC ("), line
    assert line.endswith(f"). See /traffic/drains/{restore.pk}/."), line
    assert "\n" not in line and "by hand" not in line
