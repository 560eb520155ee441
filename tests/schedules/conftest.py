"""The plans' small world (tests/migrations_plan/conftest.py) and a webhook subscribed to the
schedules' events, for the schedules tests."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleetctl.schedules.models import Schedule
from fleetctl.webhooks.models import Webhook
from tests.migrations_plan.conftest import World, world

# A fixed, controllable clock: tests pass `now=` from here, never sleep.
T0 = datetime(2026, 3, 10, 8, 0, tzinfo=UTC)


def next_run(schedule: Schedule) -> datetime:
    """The schedule's next occurrence (enabled: never null)."""
    assert schedule.next_run_at is not None
    return schedule.next_run_at


@pytest.fixture
def hook(db: None) -> Webhook:
    return Webhook.objects.create(name="on-call-hook", url="https://hooks.example.invalid/x",
                                  events=["schedule.missed", "schedule.failed"],
                                  created_by="test")


__all__ = ["T0", "World", "hook", "next_run", "world"]
