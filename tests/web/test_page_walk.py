"""Every page of `make demo`, on both databases the README offers: the demo seeded as the demo
seeds it (plus what its workers would have added: tests/support/demo_content.py), then walked
over HTTP as each of the five demo people from the navigation, following every same-site link,
htmx poll and API link (tests/support/crawl.py). No answer may be a 5xx.

SQLite is the demo's own: a fresh database in a temporary directory, served by gunicorn with
DEBUG off in a process of its own. PostgreSQL is the test database, served by pytest-django's
live server. The browser tests run on PostgreSQL only; this is what catches a query that only
PostgreSQL can run (DISTINCT ON, an ordered subquery in a UNION, a JSON containment lookup)
or that answers differently on SQLite (JSON text searched beyond ASCII).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

import pytest

from tests.support.crawl import Crawler, Walk, errors_logged, report
from tests.support.demo_content import ROLES, SEARCH_BEYOND_ASCII, seed_demo
from tests.support.demo_site import Site, sqlite_demo_site

pytestmark = pytest.mark.slow

PASSWORD = "walk-the-demo-pages"
# Pages every person must have reached: each shows one of the things the demo and the walk's
# content put there (a plan at every stage, a ramp, a drain, a webhook with deliveries, a
# shadow run with pairs, finished eval and benchmark runs, a batch job and a soak).
MUST_REACH = {
    "fleet:overview", "fleet:pool-detail", "fleet:region-list", "fleet:currency-rates",
    "plans:board", "plans:detail", "traffic:routes", "traffic:route-detail", "traffic:drains",
    "traffic:drain-detail", "ramps:list", "ramps:detail", "shadow:home", "shadow:run-detail",
    "evals:home", "evals:run-detail", "evals:suites", "evals:suite-detail", "bench:home",
    "bench:run-detail", "bench:trace-detail", "conformance:home", "conformance:run-detail",
    "batch:list", "batch:job-detail", "batch:soak-detail", "webhooks:list", "webhooks:detail",
    "audit:list", "accounts:tokens", "api:api-root", "api:pool-list", "api:pool-detail",
    "api:plan-detail", "api:webhook-detail", "api:drain-detail",
}
# Only an administrator reaches these (people and roles are theirs to manage).
ADMIN_ONLY = {"people:list", "people:detail"}


def walk_everyone(base_url: str, password: str, explain: Callable[[str], str]) -> list[Walk]:
    """The administrator (who reaches every page) walks up to six objects of each view and
    four query shapes; the others every view they reach, with two of each: what a role
    changes on a page is its buttons and forms, not which object it shows."""
    thorough = Crawler(base_url, explain=explain)
    brief = Crawler(base_url, explain=explain, per_view=2, per_download=1, shapes_per_view=2)

    def walk(username: str) -> Walk:
        return (thorough if username == "admin" else brief).walk(username, password)

    with ThreadPoolExecutor(max_workers=len(ROLES)) as pool:
        return list(pool.map(walk, ROLES))


def assert_every_page_answered(walks: list[Walk], database: str, seconds: float,
                               seed_notes: str) -> None:
    problems = report(walks)
    assert not problems, f"on {database}:\n{problems}"
    for walk in walks:
        missed = MUST_REACH - set(walk.views())
        if walk.username == "admin":
            missed |= ADMIN_ONLY - set(walk.views())
        assert not missed, (f"on {database}, {walk.username} never reached {sorted(missed)}; "
                            f"the demo seed said: {seed_notes or 'nothing'}")
    pages = {walk.username: len(walk.answers) for walk in walks}
    views = {walk.username: len(walk.views()) for walk in walks}
    print(f"\n{database}: {sum(pages.values())} answers in {seconds:.1f} s; answers per "
          f"person {pages}; views per person {views}")


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


def test_every_page_of_the_demo_on_postgresql_answers_each_person_without_a_server_error(
    live_server: Any, transactional_db: None, tmp_path: Any,
):
    notes = seed_demo(password=PASSWORD, data_dir=tmp_path)
    with errors_logged() as explain:
        started = time.monotonic()
        walks = walk_everyone(live_server.url, PASSWORD, explain)
    assert_every_page_answered(walks, "PostgreSQL", time.monotonic() - started, notes)
