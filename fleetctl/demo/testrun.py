"""`make test`: the suite against real PostgreSQL and Redis, in pytest-xdist worker processes.

Reached through `python -m fleetctl.demo.devstack test …` (the Makefile and the docs use that);
it lives apart from the demo so that each stays readable.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from fleetctl.demo.devstack import (
    PY,
    ROOT,
    Stack,
    embedded_redis,
    free_port,
    local_destinations,
    log,
    port_answers,
)


def _postgres_url() -> str | None:
    import psycopg

    for user in ("postgres", "root"):
        url = f"postgres://{user}@127.0.0.1:5432/test"
        try:
            with psycopg.connect(url, connect_timeout=2):
                return url
        except psycopg.Error:
            continue
    return None


def _migrated_template(url: str, env: dict[str, str]) -> str | None:
    """A migrated database the test workers' databases are copied from (CREATE DATABASE …
    TEMPLATE): migrations run once here, on an idle machine, instead of once per worker on a
    busy one (15–22 s each with three workers). Django still runs `migrate` on each copy, so a
    template left by an older checkout is brought up to date, not trusted. None (each worker
    migrates its own) when it cannot be made."""
    import psycopg
    from psycopg import sql

    name = f"{url.rsplit('/', 1)[1].split('?')[0]}_migrated"
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  [name]).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        log(f"no template database ({exc}); each test worker migrates its own")
        return None
    migrated = subprocess.run(
        [PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT,
        env={**env, "DATABASE_URL": f"{url.rsplit('/', 1)[0]}/{name}"},
        capture_output=True, text=True)
    if migrated.returncode != 0:
        log(f"migrating the template database {name} failed; each test worker migrates its "
            f"own:\n{migrated.stderr[-2000:]}")
        return None
    return name


# On 2 cores, with the files longest first: 3 workers 20:58, 4 workers 20:29 (both ~2,020
# CPU-seconds, 80 % of the machine: the suite is CPU-bound), so 3, which loads the
# timing-bound tests less.
TEST_WORKERS = 3


def pytest_defaults(pytest_args: list[str]) -> list[str]:
    """What `make test` adds unless told otherwise: its 30 slowest tests, and worker processes
    (pytest-xdist; `FLEETCTL_TEST_WORKERS`, 0 for one process, or `-n` in the arguments).
    A file's tests stay on one worker (`--dist loadfile`), so its module-scoped real services
    start once. Files are handed out in collection order, which tests/support/schedule.py
    makes longest first: xdist's own reordering (most tests first) would leave the few long
    end-to-end files for last, one worker finishing them while the others wait."""
    defaults = ["--durations=30"]
    chosen = any(arg in ("-n", "--numprocesses") or arg.startswith(("-n", "--numprocesses="))
                 or arg == "no:xdist" for arg in pytest_args)
    workers = os.environ.get("FLEETCTL_TEST_WORKERS", str(TEST_WORKERS))
    if not chosen and workers.strip() not in ("", "0", "1"):
        defaults += ["-n", workers.strip(), "--dist", "loadfile", "--no-loadscope-reorder"]
    return defaults


def run_tests(pytest_args: list[str]) -> int:
    env = dict(os.environ)
    stack = Stack()
    if not env.get("DATABASE_URL"):
        url = _postgres_url()
        if url is None:
            log("make test needs PostgreSQL (the suite tests what production runs). Start it on "
                "127.0.0.1:5432 with a `test` database, or set "
                "DATABASE_URL=postgres://USER@HOST:PORT/DB.")
            return 2
        env["DATABASE_URL"] = url
    if not env.get("REDIS_URL"):
        if port_answers("127.0.0.1", 6379):
            env["REDIS_URL"] = "redis://127.0.0.1:6379/15"
        else:
            log("no Redis on 127.0.0.1:6379: starting the embedded one for the tests")
            env["REDIS_URL"] = embedded_redis(stack, env, free_port()).replace("/0", "/15")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        log("Chromium is not installed: the browser tests will fail. Debian: "
            "`apt-get install chromium` (.ci/run does this).")
    else:
        env.setdefault("FLEETCTL_CHROMIUM", chromium)
    local_destinations(env, webhooks=True, own=[])
    if env["DATABASE_URL"].startswith(("postgres://", "postgresql://")) and \
            "TEST_DATABASE_TEMPLATE" not in env:
        template = _migrated_template(env["DATABASE_URL"], env)
        if template is not None:
            env["TEST_DATABASE_TEMPLATE"] = template
    log(f"database {env['DATABASE_URL']}  broker {env['REDIS_URL']}")
    try:
        return subprocess.call([PY, "-m", "pytest", *pytest_defaults(pytest_args),
                                *pytest_args], cwd=ROOT, env=env)
    finally:
        stack.stop()
