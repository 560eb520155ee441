"""What both page walks share (test_page_walk.py on PostgreSQL, test_page_walk_sqlite.py on
the demo's own SQLite): who walks, how thoroughly, and what each person must have reached.
Two files so that pytest-xdist can run the two walks at once, each about two minutes."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tests.support.crawl import Crawler, Walk, report
from tests.support.demo_content import ROLES

PASSWORD = "walk-the-demo-pages"
# Pages every person must have reached: each shows one of the things the demo and the walk's
# content put there (a plan at every stage, a ramp, a drain, a webhook with deliveries, a
# shadow run with pairs, finished eval and benchmark runs, a batch job and a soak).
MUST_REACH = {
    "fleet:overview", "fleet:pool-detail", "fleet:region-list", "fleet:currency-rates",
    "plans:board", "plans:detail", "economics:business-case", "economics:report",
    "economics:report-pdf", "traffic:routes",
    "traffic:route-detail", "traffic:drains",
    "traffic:drain-detail", "ramps:list", "ramps:detail", "shadow:home", "shadow:run-detail",
    "evals:home", "evals:run-detail", "evals:suites", "evals:suite-detail", "bench:home",
    "bench:run-detail", "bench:trace-detail", "conformance:home", "conformance:run-detail",
    "batch:list", "batch:job-detail", "batch:soak-detail", "webhooks:list", "webhooks:detail",
    "metric_sources:list", "metric_sources:detail",
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
