"""Every page of `make demo` on the demo's own database, SQLite: a fresh database in a
temporary directory, the demo seeded as the demo seeds it (plus what its workers would have
added: tests/support/demo_content.py), served by gunicorn with DEBUG off in a process of its
own, then walked over HTTP as each of the five demo people (tests/web/page_walk.py). No
answer may be a 5xx. The same walk on PostgreSQL is test_page_walk.py; the two are files of
their own so that pytest-xdist runs them at once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import closing

import pytest

from tests.support.crawl import Crawler
from tests.support.demo_content import SEARCH_BEYOND_ASCII
from tests.support.demo_site import Site, sqlite_demo_site
from tests.web.page_walk import assert_every_page_answered, walk_everyone

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sqlite_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with sqlite_demo_site(tmp_path_factory.mktemp("sqlite-demo")) as site:
        yield site


def test_every_page_of_the_sqlite_demo_answers_each_person_without_a_server_error(
    sqlite_demo: Site,
):
    started = time.monotonic()
    walks = walk_everyone(sqlite_demo.base_url, sqlite_demo.password, sqlite_demo.explain)
    assert_every_page_answered(walks, "SQLite", time.monotonic() - started, sqlite_demo.notes)


def test_the_eval_item_search_finds_words_beyond_ascii_on_sqlite_too(sqlite_demo: Site):
    word, item = SEARCH_BEYOND_ASCII
    with closing(Crawler(sqlite_demo.base_url).sign_in("viewer", sqlite_demo.password)) as client:
        runs = client.get("/api/v1/eval-runs/").json()["results"]
        run = next(run for run in runs if "walk-arithmetic" in json.dumps(run["suite"]))

        html = client.get(f"/evals/runs/{run['id']}/", params={"q": word}).text

    assert f'data-item="{item}"' in html
    assert html.count('class="eval-diff-item"') == 1
