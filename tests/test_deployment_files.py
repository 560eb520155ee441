"""docker-compose cannot run here (no Docker engine); check that what it runs exists, that it
starts the same Celery workers as `make demo`, and that it refuses to start without a key."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands

from fleetctl.celery import QUEUES, ROUTES, app
from fleetctl.demo import devstack

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _services() -> dict[str, dict]:
    return _compose()["services"]


def _env_example() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if re.match(r"^[A-Z_]+=", line))


def test_compose_has_the_production_shaped_services():
    workers = {name for name, _queue, _threads in devstack.DEMO_WORKERS}
    assert {"postgres", "redis", "web", "beat", "migrate", *workers} <= set(_services())


def test_every_compose_command_exists_in_the_project():
    for name, service in _services().items():
        command = service.get("command")
        if not command or name in ("postgres", "redis"):
            continue
        if command[0] == "gunicorn":
            module, attr = command[1].split(":") if ":" in command[1] else (command[1],
                                                                            "application")
            assert callable(getattr(importlib.import_module(module), attr)), name
        elif command[0] == "celery":
            assert command[1:3] == ["-A", "fleetctl"], name
            assert command[3] in ("worker", "beat"), name
        elif command[:2] == ["python", "manage.py"]:
            assert command[2] in get_commands(), (name, command[2])
        elif command[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(command[2]) is not None, (name, command[2])
        else:
            raise AssertionError(f"{name}: unrecognised command {command}")


# --- the workers: the same topology in the demo and in compose -------------------------------

def _option(argv: list[str], *flags: str, default: str | None = None) -> str | None:
    for flag in flags:
        if flag in argv:
            return argv[argv.index(flag) + 1]
    return default


def _workers(commands: dict[str, list[str]]) -> dict[str, tuple[frozenset[str], str, int]]:
    """Celery worker name -> (queues, pool, concurrency), from command lines."""
    found = {}
    for name, argv in commands.items():
        if "celery" not in argv or "worker" not in argv[argv.index("celery"):]:
            continue
        queues = _option(argv, "-Q", "--queues")
        assert queues, f"{name} consumes no named queue (Celery's default would be used)"
        found[name] = (frozenset(queues.split(",")),
                       _option(argv, "-P", "--pool", default="prefork") or "",
                       int(_option(argv, "-c", "--concurrency", default="0") or 0))
    return found


def _compose_workers() -> dict[str, tuple[frozenset[str], str, int]]:
    return _workers({name: list(s.get("command") or []) for name, s in _services().items()})


def _demo_workers() -> dict[str, tuple[frozenset[str], str, int]]:
    return _workers(devstack.worker_commands())


@pytest.mark.parametrize("where", ["compose", "demo"])
def test_every_queue_is_consumed_by_exactly_one_worker_on_threads(where):
    workers = _compose_workers() if where == "compose" else _demo_workers()
    for queue in QUEUES:
        consumers = [name for name, (queues, _pool, _c) in workers.items() if queue in queues]
        assert len(consumers) == 1, (where, queue, consumers)
    consumed = set().union(*(queues for queues, _pool, _c in workers.values()))
    assert consumed == set(QUEUES), (where, consumed - set(QUEUES))
    assert {pool for _queues, pool, _c in workers.values()} == {"threads"}, where
    assert all(c > 0 for _queues, _pool, c in workers.values()), where


def test_compose_starts_the_demos_workers_with_at_least_as_many_threads():
    compose, demo = _compose_workers(), _demo_workers()
    assert set(compose) == set(demo)
    for name, (queues, pool, threads) in demo.items():
        assert compose[name][:2] == (queues, pool), name
        assert compose[name][2] >= threads, name


def test_the_bench_queue_has_a_worker_of_its_own_in_both():
    # A benchmark run holds its slot for hours: no other queue may share those slots.
    for workers in (_compose_workers(), _demo_workers()):
        [bench] = [queues for queues, _pool, _c in workers.values() if "bench" in queues]
        assert bench == {"bench"}


# --- tasks and routes ------------------------------------------------------------------------

def _tasks() -> set[str]:
    app.loader.import_default_modules()  # every app's tasks module, as a worker imports them
    return {name for name in app.tasks if not name.startswith("celery.")}


def test_every_task_is_routed_by_name_to_a_declared_queue():
    tasks = _tasks()
    assert tasks - set(ROUTES) == set(), "give these tasks a queue in fleetctl/celery.py ROUTES"
    assert set(ROUTES) - tasks == set(), "ROUTES names tasks that do not exist"
    for name in tasks:
        assert app.amqp.router.route({}, name)["queue"].name == ROUTES[name] in QUEUES, name


def test_every_queue_carries_a_task_and_every_beat_entry_is_a_task():
    assert set(ROUTES.values()) == set(QUEUES)
    tasks = _tasks()
    for entry in app.conf.beat_schedule.values():
        assert entry["task"] in tasks, entry


def test_the_test_sessions_worker_consumes_every_queue(celery_worker_process):
    active = app.control.inspect(timeout=5).active_queues() or {}
    [queues] = [q for name, q in active.items() if name.startswith("test-")]
    assert {queue["name"] for queue in queues} == set(QUEUES)


# --- settings ----------------------------------------------------------------------------------

def test_env_example_documents_every_setting_read_from_the_environment():
    settings_src = (ROOT / "fleetctl" / "settings.py").read_text()
    read = set(re.findall(r'env_(?:bool|int|list)\("([A-Z_]+)"', settings_src))
    read |= set(re.findall(r'os\.environ\.get\("([A-Z_]+)"', settings_src))
    documented = set(re.findall(r"^([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert read <= documented, read - documented


class Missing(Exception):
    pass


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${NAME}, ${NAME:-default} and ${NAME:?error} (unset or empty both count as
    missing, as with the colon forms in Compose)."""
    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise Missing(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-?])([^}]*))?\}", one, value)


def _app_services() -> dict[str, dict]:
    return {name: s for name, s in _services().items() if "build" in s}


def test_compose_refuses_to_start_without_a_secret_key_and_says_how_to_make_one():
    services = _app_services()
    assert {"web", "beat", "migrate"} <= set(services)
    shipped = _env_example()  # what `cp .env.example .env` gives
    for name, service in services.items():
        environment = service["environment"]
        with pytest.raises(Missing, match=r"set SECRET_KEY in \.env") as refused:
            interpolate(environment["SECRET_KEY"], shipped)
        assert interpolate(environment["DEBUG"], shipped) == "0", name
        assert interpolate(environment["DEBUG"], {}) == "0", name
        key = "k" * 50
        assert interpolate(environment["SECRET_KEY"], {**shipped, "SECRET_KEY": key}) == key
    # The command the error message gives makes a key compose reads as written (no $).
    [command] = re.findall(r'python -c "([^"]+)"', str(refused.value))
    made = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert re.fullmatch(r"[A-Za-z0-9_-]{50,}", made)
