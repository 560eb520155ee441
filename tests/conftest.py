"""Shared fixtures. Tests talk to real PostgreSQL and Redis (see `make test`), and the
`celery_worker` fixture starts a real Celery worker process against the test database."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal, token_create_service
from fleetctl.fleet import services as fleet_services
from fleetctl.fleet.models import Pool, Region
from tests.support.celery_worker import start_celery_worker
from tests.support.schedule import longest_first
from tests.support.waiting import wait_until
from tests.support.workers import log_name

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = Actor.for_system("test")


def pytest_report_header() -> list[str]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    return [f"fleetctl: database {db['ENGINE'].rsplit('.', 1)[-1]} {db.get('HOST', '')}"
            f" broker {settings.CELERY_BROKER_URL}"]


# The `browser` fixture (Chromium through Playwright) for the dashboard tests.
pytest_plugins = ["tests.browser"]

# Fixtures that start a real process (a Celery worker, a simulated fleet, a gateway, a
# collector, a browser, a live server): a test using one is marked `processes`.
PROCESS_FIXTURES = frozenset({
    "celery_worker", "celery_worker_process", "browser", "live_server", "batch_sim",
    "sim_pool", "sim_primary_pool", "bench_sim", "conformance_sim", "start_collector",
    "start_sim", "sim_fleet", "envoy", "sims", "haproxy", "nginx", "sim",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)
    longest_first(items)  # the order xdist's workers take files in (tests/support/schedule.py)


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    """PBKDF2 at production strength costs ~0.3 s per user on this machine; tests make many
    users. Hashing strength is Django's concern, not ours."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_api_auth_block_on_loopback() -> None:
    """Invalid bearer tokens are counted per address in Redis, which outlives a test: without
    this, the suite's handful of deliberate 401s from 127.0.0.1 could add up to a 429 in some
    later test. Tests of the throttle itself use addresses of their own."""
    from fleetctl.accounts import throttle

    throttle.reset("127.0.0.1")


@pytest.fixture
def system() -> Actor:
    return SYSTEM


@pytest.fixture
def make_user(db: None) -> Callable[..., User]:
    def make(username: str, *roles: str, password: str = "pw-for-tests-only") -> User:
        user = User.objects.create_user(username=username, password=password)
        # Role groups come from a data migration, which transactional tests' flush empties.
        user.groups.set([Group.objects.get_or_create(name=role)[0] for role in roles])
        return user

    return make


@pytest.fixture
def region(db: None) -> Region:
    return fleet_services.region_create(actor=SYSTEM, code="us-east", name="US East",
                                        jurisdiction="US")


@pytest.fixture
def make_pool(db: None, region: Region) -> Callable[..., Pool]:
    counter = {"n": 0}

    def make(name: str | None = None, **overrides: Any) -> Pool:
        counter["n"] += 1
        fields: dict[str, Any] = {
            "name": name or f"pool-{counter['n']}", "runtime": "cuda", "accelerator": "H200",
            "region": region, "base_urls": [f"http://127.0.0.1:{9000 + counter['n']}"],
            "max_context_tokens": 32768, "node_hourly_rate": "10.50",
        }
        fields.update(overrides)
        return fleet_services.pool_create(actor=SYSTEM, **fields)

    return make


@pytest.fixture
def api() -> APIClient:
    return APIClient()


@pytest.fixture
def client_for(make_user: Callable[..., User]) -> Callable[..., APIClient]:
    """An API client logged in (session) as a new user with the given roles."""

    def make(*roles: str, username: str | None = None) -> APIClient:
        user = make_user(username or "-".join(roles or ("norole",)), *roles)
        client = APIClient()
        client.force_login(user)
        client.user = user  # type: ignore[attr-defined]
        return client

    return make


@pytest.fixture
def token_client(make_user: Callable[..., User]) -> Callable[..., APIClient]:
    """An API client that authenticates with a bearer token (personal when roles are given)."""

    seq = iter(range(1, 1000))

    def make(scopes: list[str], *roles: str, service: bool = False) -> APIClient:
        if service:
            issued = token_create_service(actor=SYSTEM, name="bot", scopes=scopes)
        else:
            user = make_user(f"tok-{next(seq)}-{'-'.join(roles) or 'none'}", *roles)
            issued = token_create_personal(actor=Actor(user=user), name="cli", scopes=scopes)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
        client.token = issued.token  # type: ignore[attr-defined]
        return client

    return make


# --- a real Celery worker --------------------------------------------------------------------

def _worker_env(database_name: str) -> dict[str, str]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    env = dict(os.environ)
    if db["ENGINE"].endswith("postgresql"):
        user = db.get("USER") or "postgres"
        env["DATABASE_URL"] = (
            f"postgres://{user}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/"
            f"{database_name}"
        )
    env["REDIS_URL"] = settings.REDIS_URL
    env["HEALTH_PROBE_TIMEOUT_S"] = "2"
    return env


def _purge_broker() -> None:
    from fleetctl.celery import QUEUES, app

    with app.connection_for_write() as conn:
        for queue in QUEUES:
            conn.default_channel.queue_purge(queue)


_worker_started = False


def _worker_quiet(timeout_s: float = 60) -> None:
    """Let the session's worker finish what a test left it (a benchmark started with
    --no-wait, a drain's watcher queued with a countdown) before the test's database is
    flushed: a task writing rows while TRUNCATE runs deadlocks with it, and the next test
    starts on leftovers. Countdown tasks are revoked and the queues purged; running ones are
    waited for."""
    from fleetctl.celery import app

    _cancel_leftover_jobs()
    inspect = app.control.inspect(timeout=1.0, limit=1)

    def quiet() -> bool:
        scheduled = inspect.scheduled() or {}
        waiting = [task["request"]["id"] for tasks in scheduled.values() for task in tasks]
        if waiting:
            app.control.revoke(waiting)
        _purge_broker()
        return not [task for tasks in (inspect.active() or {}).values() for task in tasks]

    # Best effort: a task still running after timeout_s is the test's own to explain.
    with contextlib.suppress(AssertionError):
        wait_until(quiet, timeout_s=timeout_s, every_s=0.1, what="the worker to go quiet")


def _cancel_leftover_jobs() -> None:
    """Cancel the evidence jobs a test left queued or running (an eval run on pools that are
    gone, a probe of a seeded demo's fleet): their drivers stop at their next heartbeat, as
    for a person's cancel, instead of running out their timeouts against a database about
    to be flushed."""
    from django.apps import apps
    from django.utils import timezone

    from fleetctl.core.jobs import ACTIVE, Job, JobStatus

    for model in apps.get_models():
        if issubclass(model, Job):
            model.objects.filter(status__in=ACTIVE).update(
                status=JobStatus.CANCELLED, cancelled_by="test teardown",
                error="cancelled at the end of its test", finished_at=timezone.now())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Before the test's fixtures are torn down (so before a transactional flush)."""
    if _worker_started and "transactional_db" in getattr(item, "fixturenames", ()):
        from pytest_django.plugin import blocking_manager_key

        with item.config.stash[blocking_manager_key].unblock():
            _worker_quiet()
    yield


@pytest.fixture(scope="session")
def celery_worker_process(
    django_db_setup: None, django_db_blocker: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """One worker process for the session, consuming every queue, on the test database."""
    from django.db import connection

    from fleetctl.celery import QUEUES

    with django_db_blocker.unblock():
        name = connection.settings_dict["NAME"]
    env = _worker_env(name)
    _purge_broker()
    log = ROOT / "var" / log_name("test-worker", ".log")
    log.write_bytes(b"")  # this session's
    proc = start_celery_worker(env, log, node=f"test-{os.getpid()}@%h", queues=QUEUES,
                               concurrency=12)
    global _worker_started
    _worker_started = True
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def celery_worker(
    celery_worker_process: subprocess.Popen[bytes], transactional_db: None
) -> subprocess.Popen[bytes]:
    """Use with tests whose data the worker must see (hence transactional_db)."""
    return celery_worker_process
