"""core.bulk.update_rows: one UPDATE for many rows, each with its own values, only where the
caller's conditions still hold, on PostgreSQL (the test database) and SQLite (a scratch
database of its own)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from fleetctl.core.bulk import update_rows
from fleetctl.evals.models import EvalResult

FIELDS = ("status", "attempts", "text", "score", "completion_tokens", "scored_at", "error")
AT = datetime(2026, 12, 7, 16, 30, 5, 123456, tzinfo=UTC)


def _values(i: int) -> dict[str, Any]:
    # Row 0 carries NULLs in every nullable column (a column of NULLs has no type in VALUES),
    # the others text with quotes, JSON with nesting, floats and datetimes.
    if i == 0:
        return {"status": "done", "attempts": [], "text": "", "score": None,
                "completion_tokens": None, "scored_at": None, "error": ""}
    return {"status": "done", "attempts": [{"at": "x", "ms": 1.5 * i, "error": "it's"}],
            "text": f"answer 'number' {i}; DROP TABLE x", "score": i / 10,
            "completion_tokens": 7 * i, "scored_at": AT, "error": "" if i % 2 else "e"}


@pytest.fixture
def sqlite_alias(tmp_path: Path, django_db_blocker: Any) -> Iterator[str]:
    """A SQLite database holding just the eval results' table (its foreign keys off: the
    tables they point at are not there). Not the test database: opened outside pytest-django's
    test case, which only knows the configured aliases."""
    alias = "bulk_sqlite"
    with django_db_blocker.unblock():
        yield from _scratch_sqlite(alias, tmp_path)


def _scratch_sqlite(alias: str, tmp_path: Path) -> Iterator[str]:
    connections.settings[alias] = {**connections.settings["default"],
                                   "ENGINE": "django.db.backends.sqlite3",
                                   "NAME": str(tmp_path / "bulk.sqlite3"), "OPTIONS": {}}
    connection = connections[alias]
    try:
        with connection.schema_editor() as editor:
            editor.create_model(EvalResult)
        with connection.cursor() as cursor:  # after the editor, which turns them back on
            cursor.execute("PRAGMA foreign_keys = OFF")
        yield alias
    finally:
        connection.close()
        del connections[alias]
        del connections.settings[alias]


def _check(alias: str) -> None:
    rows = [EvalResult(run_id=1, run_pool_id=1, item_id=i + 1, position=i, status="claimed",
                       claim="mine" if i != 3 else "theirs") for i in range(6)]
    EvalResult.objects.using(alias).bulk_create(rows)
    pks = list(EvalResult.objects.using(alias).order_by("position").values_list("pk", flat=True))
    written = update_rows(EvalResult, [(pk, _values(i)) for i, pk in enumerate(pks)], FIELDS,
                          where={"status": "claimed", "claim": "mine"}, using=alias)
    assert written == 5  # row 3 is claimed by another token: left alone
    got = {r.position: r for r in EvalResult.objects.using(alias).order_by("position")}
    assert got[3].status == "claimed" and got[3].text == "" and got[3].scored_at is None
    for i in (0, 1, 2, 4, 5):
        want = _values(i)
        assert {f: getattr(got[i], f) for f in FIELDS} == want, i
    # A second write finds nothing claimed by this token any more.
    assert update_rows(EvalResult, [(pks[1], _values(2))], FIELDS,
                       where={"status": "claimed", "claim": "mine"}, using=alias) == 0
    assert EvalResult.objects.using(alias).get(pk=pks[1]).text == _values(1)["text"]
    assert update_rows(EvalResult, [], FIELDS, using=alias) == 0


def test_rows_are_written_with_their_own_values_where_the_condition_holds_on_sqlite(
        sqlite_alias: str) -> None:
    _check(sqlite_alias)


@pytest.mark.django_db(transaction=True)
def test_rows_are_written_with_their_own_values_where_the_condition_holds_on_postgresql(
        ) -> None:
    with connections["default"].cursor() as cursor:  # the test database's own rows are none
        cursor.execute("SET session_replication_role = replica")  # no FK checks: no parents
    try:
        _check("default")
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute("SET session_replication_role = DEFAULT")
