"""docker-compose cannot run here (no Docker engine); check that what it runs exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import yaml
from django.core.management import get_commands

from fleetctl.celery import QUEUES

ROOT = Path(__file__).resolve().parent.parent


def _services() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_compose_has_the_production_shaped_services():
    assert {"postgres", "redis", "web", "worker", "worker-push", "beat", "migrate"} <= set(
        _services())


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
            if "-Q" in command:
                queues = command[command.index("-Q") + 1].split(",")
                assert set(queues) <= set(QUEUES), (name, queues)
        elif command[:2] == ["python", "manage.py"]:
            assert command[2] in get_commands(), (name, command[2])
        else:
            raise AssertionError(f"{name}: unrecognised command {command}")


def test_all_queues_are_consumed_and_push_has_its_own_worker():
    consumed = {
        name: set(s["command"][s["command"].index("-Q") + 1].split(","))
        for name, s in _services().items() if "-Q" in (s.get("command") or [])
    }
    assert set().union(*consumed.values()) == set(QUEUES)
    assert consumed["worker-push"] == {"push"}


def test_env_example_documents_every_setting_read_from_the_environment():
    settings_src = (ROOT / "fleetctl" / "settings.py").read_text()
    read = set(re.findall(r'env_(?:bool|int|list)\("([A-Z_]+)"', settings_src))
    read |= set(re.findall(r'os\.environ\.get\("([A-Z_]+)"', settings_src))
    documented = set(re.findall(r"^([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert read <= documented, read - documented
