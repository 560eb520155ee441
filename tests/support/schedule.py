"""The order in which `make test` hands files to its pytest-xdist workers.

With `--dist loadfile` a file is a unit of work: one worker runs all of it, so its module-scoped
real services (a simulator, Envoy, a demo) start once. Units are handed out in collection order
(`make test` turns off xdist's own reordering, which puts the files with the most tests first
and so left the few long end-to-end files, such as the page walks, for the very end), and a
worker asks for the next one as it runs out. Longest first is what keeps the last minutes from
being one worker finishing a long file while the others wait: the files that took longest in a
measured run go first, in that order, then every other file as pytest collects it.

The list only orders; a file missing from it, or one listed that no longer exists, changes no
test's outcome. Refresh it from a run's `--junitxml` (sum of each file's test times) when the
suite's shape changes.
"""

from __future__ import annotations

import os

import pytest

# Measured: `make test` alone on the 2-core machine (3 workers, 1258 s), each file's summed
# test times incl. setup and teardown, longest first; the files over about half a minute.
LONGEST_FIRST = [
    "tests/api/test_schemathesis.py",  # 257 s
    "tests/test_devstack.py",  # 171 s
    "tests/ramps/test_e2e_guarded.py",  # 117 s
    "tests/cli/test_bench_cli.py",  # 111 s
    "tests/web/test_phone_and_axe.py",  # 103 s
    "tests/traffic/contract/test_contract.py",  # 101 s
    "tests/traffic/test_residency_property.py",  # 97 s
    "tests/web/test_stored_xss.py",  # 82 s
    "tests/cli/test_eval_cli.py",  # 80 s
    "tests/conformance/test_runs.py",  # 80 s
    "tests/shadow/test_collector.py",  # 79 s
    "tests/cli/test_ramp_cli.py",  # 78 s
    "tests/web/test_page_walk_sqlite.py",  # 77 s
    "tests/web/test_page_walk.py",  # 73 s
    "tests/cli/test_plans_cli.py",  # 59 s
    "tests/batch/test_drill.py",  # 57 s
    "tests/evals/test_demo.py",  # 56 s
    "tests/evals/test_e2e.py",  # 56 s
    "tests/shadow/test_e2e.py",  # 56 s
    "tests/traffic/test_drain_e2e.py",  # 52 s
    "tests/evals/test_resume.py",  # 49 s
    "tests/ramps/test_e2e_disconnects.py",  # 45 s
    "tests/evals/test_browser.py",  # 45 s
    "tests/migrations_plan/test_plans_browser.py",  # 39 s
    "tests/batch/test_worker.py",  # 37 s
    "tests/bench/test_runs.py",  # 37 s
    "tests/evals/test_runs.py",  # 35 s
    "tests/cli/test_shadow_cli.py",  # 34 s
    "tests/migrations_plan/test_permissions.py",  # 34 s
    "tests/migrations_plan/test_evidence_sources.py",  # 33 s
    "tests/traffic/test_drain_convergence.py",  # 33 s
    "tests/ramps/web/test_pages.py",  # 32 s
    "tests/cli/test_cli.py",  # 31 s
]
_RANK = {path: rank for rank, path in enumerate(LONGEST_FIRST)}


def longest_first(items: list[pytest.Item]) -> None:
    """Under xdist only, reorder `items` in place: the listed files first, longest first, each
    file's tests kept together and in their own order, then the rest as collected. Every
    worker collects the same order, as xdist requires."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    unlisted = len(_RANK)
    items.sort(key=lambda item: _RANK.get(item.nodeid.split("::", 1)[0], unlisted))
