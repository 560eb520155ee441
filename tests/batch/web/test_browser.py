"""A batch job from the dashboard in a real browser (Chromium through Playwright), run by a
real worker process against a real simulator pool: an on-call engineer uploads an input
file on the new-job form, creates the job, lands on its page, watches it complete through
the page's own htmx poll (progress, the throughput chart drawn) and downloads the output
file. No console error or failed request anywhere (CSP forbids inline script).

Set FLEETCTL_SCREENSHOTS=1 to also write docs/screenshots/batch-job.png."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from fleetctl.fleet.models import Pool
from tests.batch.factory import write_input
from tests.batch.workerproc import WorkerProcess, worker_starter
from tests.browser import sign_in
from tests.web.test_browser import Problems, shoot

pytestmark = [pytest.mark.slow, pytest.mark.browser]
PASSWORD = "pw-for-tests-only"
REQUESTS = 40


@pytest.fixture
def workers(tmp_path: Path, transactional_db: None) -> Iterator[Callable[..., WorkerProcess]]:
    with worker_starter(tmp_path) as start:
        yield start


def test_upload_a_file_create_a_job_and_watch_it_complete(
        live_server: Any, sim_pool: Pool, make_user: Callable[..., Any], tmp_path: Path,
        workers: Callable[..., WorkerProcess], browser: Browser):
    # Seeded before the browser starts (Playwright's loop would give the ORM a connection
    # of its own).
    make_user("olga", "on-call", password=PASSWORD)
    path = write_input(tmp_path / "nightly.jsonl", REQUESTS)
    worker = workers("web")

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = Problems(page)
    new_url = f"{live_server.url}/batch/jobs/new/"
    sign_in(page, new_url, "olga", PASSWORD)
    page.set_input_files("#id_file", str(path))
    page.select_option("#id_pool", sim_pool.name)
    page.fill("#id_concurrency", "4")
    page.fill("#id_chunk_size", "10")
    page.fill("#id_compare_sample", "0")
    page.get_by_role("button", name="Create the job").click()
    page.wait_for_url("**/batch/jobs/*/")
    expect(page.get_by_text("Created batch job")).to_be_visible()
    expect(page.locator("h1")).to_contain_text(f"nightly.jsonl on {sim_pool.name}")

    live = page.locator("#batch-live")
    expect(live).to_have_attribute("data-state", "completed", timeout=60_000)
    expect(live.locator(".batch-done")).to_contain_text(f"{REQUESTS} of {REQUESTS} requests")
    expect(live.locator(".batch-succeeded")).to_have_text(str(REQUESTS))
    # The poll that saw the job end reloaded the page once: the forms are gone, the chart
    # is drawn from the results.
    expect(page.locator(".batch-action-form")).to_have_count(0)
    expect(page.locator("#batch-throughput-chart.js-plotly-plot")).to_be_visible()
    shoot(page, "batch-job.png")

    with page.expect_download() as download:
        page.locator(".batch-download-output").click()
    lines = Path(download.value.path()).read_text().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in lines) == sorted(
        f"req-{i}" for i in range(REQUESTS))

    page.get_by_role("navigation", name="Sections").get_by_role("link", name="Batch").click()
    page.wait_for_url("**/batch/")
    expect(page.locator("tr[data-state=completed]")).to_have_count(1)
    assert worker.alive(), worker.log()
    assert problems.items == [], problems.items
