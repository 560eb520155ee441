"""Every page of `make demo`, on PostgreSQL (the SQLite half is test_page_walk_sqlite.py): the
demo seeded as the demo seeds it (plus what its workers would have added:
tests/support/demo_content.py), then walked over HTTP as each of the five demo people from the
navigation, following every same-site link, htmx poll and API link (tests/support/crawl.py,
tests/web/page_walk.py). No answer may be a 5xx.

PostgreSQL is the test database, served by pytest-django's live server. The browser tests run
on PostgreSQL only; this is what catches a query that only PostgreSQL can run (DISTINCT ON, an
ordered subquery in a UNION, a JSON containment lookup) or that answers differently on SQLite
(JSON text searched beyond ASCII).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.crawl import errors_logged
from tests.support.demo_content import seed_demo
from tests.web.page_walk import PASSWORD, assert_every_page_answered, walk_everyone

pytestmark = pytest.mark.slow


def test_every_page_of_the_demo_on_postgresql_answers_each_person_without_a_server_error(
    live_server: Any, transactional_db: None, tmp_path: Any,
):
    notes = seed_demo(password=PASSWORD, data_dir=tmp_path)
    with errors_logged() as explain:
        started = time.monotonic()
        walks = walk_everyone(live_server.url, PASSWORD, explain)
    assert_every_page_answered(walks, "PostgreSQL", time.monotonic() - started, notes)
