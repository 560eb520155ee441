"""The ingester with real parts: a killed and restarted ingester process (exactly once), a
real simulator's /metrics (TPOT windows), and a real Envoy writing its access log in front of
a simulated pool."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.demo.process import stop
from fleetctl.telemetry import histogram
from fleetctl.telemetry.ingest import Ingester
from fleetctl.telemetry.models import Cursor, Window
from fleetctl.telemetry.scrape import Scraper, metrics_url
from fleetctl.traffic.gateways.base import DesiredState, PoolTarget, RouteSpec
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
from fleetctl.traffic.models import Gateway
from tests.sim.simproc import MODEL, SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until
from tests.telemetry.lines import envoy_line, start_ingester
from tests.traffic.accesslog import chat

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    process = sim_with_profiles(tmp_path_factory.mktemp("telemetry-sim"), TEST_PROFILES,
                                {"sa": "quick"}, models=[MODEL])
    yield process
    process.stop()


def test_an_ingester_killed_mid_stream_neither_loses_nor_double_counts(
        transactional_db: None, tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    path.touch()
    Gateway.objects.create(name="gw-kill", kind="envoy", admin_address="http://127.0.0.1:1",
                           options={"access_log": str(path)})
    written = {"n": 0}
    done = threading.Event()
    t0 = time.time()

    def writer() -> None:
        # ~4,000 lines/s in small bursts, some lines split across writes (the gateway's
        # buffer ends anywhere), until stopped.
        with open(path, "ab", buffering=0) as log:
            while not done.is_set():
                burst = b"".join(envoy_line(start=t0 + written["n"] % 50,
                                            pool=f"p{written['n'] % 3}")
                                 for _ in range(40))
                log.write(burst[:-25])
                log.write(burst[-25:])
                written["n"] += 40
                time.sleep(0.01)

    first = start_ingester(tmp_path / "ingest-1.log", "--no-scrape", "--flush-interval",
                           "0.2")
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        wait_until(lambda: (Cursor.objects.filter(path=str(path)).values_list(
            "lines", flat=True).first() or 0) > 2000, timeout_s=60, what="a first flush")
        os.kill(first.pid, signal.SIGKILL)  # no goodbye flush: the unflushed lines are lost
        first.wait(timeout=10)
        # Lines keep coming while no ingester runs.
        killed_at = written["n"]
        wait_until(lambda: written["n"] >= killed_at + 1000, timeout_s=30,
                   what="1,000 lines written while no ingester runs")
        second = start_ingester(tmp_path / "ingest-2.log", "--no-scrape", "--flush-interval",
                                "0.2")
        try:
            # The restarted ingester catches up with those and goes on reading as lines come.
            started_at = written["n"]
            wait_until(lambda: Cursor.objects.get(path=str(path)).lines > started_at,
                       timeout_s=60, what="the restarted ingester to read past its start")
            done.set()
            thread.join(timeout=10)
            total = written["n"]
            wait_until(lambda: Cursor.objects.get(path=str(path)).lines == total,
                       timeout_s=60, what="the restarted ingester to catch up")
        finally:
            stop(second, 20)
    finally:
        done.set()
        stop(first, 20)
    rows = Window.objects.filter(source_name="gw-kill")
    assert sum(row.requests for row in rows) == total
    assert sum(histogram.count(row.duration) for row in rows) == total
    assert Cursor.objects.get(path=str(path)).offset == path.stat().st_size


def test_scraping_a_real_pool_gives_tpot_windows(sim: SimProcess, make_pool: Any) -> None:
    make_pool("sa", base_urls=[sim.url("sa") + "/v1"])
    scraper = Scraper(timeout_s=5)
    assert scraper.scrape_all() == 1  # the first look only records where the counters stand
    cursor = Cursor.objects.get(source_name="sa")
    assert cursor.path == metrics_url(sim.url("sa")) and cursor.last_counters["tpot"]
    assert not Window.objects.exists()
    for i in range(6):
        assert chat(sim.url("sa"), stream=bool(i % 2), max_tokens=8) == 200
    assert scraper.scrape_all() == 1
    window = Window.objects.get(source="pool", pool="sa")
    assert (window.route, window.source_name, window.requests) == ("", "sa", 6)
    assert histogram.count(window.ttft) == 6 and histogram.count(window.tpot) > 0
    # A pool that does not answer costs its timeout and says why; the others still count.
    make_pool("down", base_urls=[f"http://127.0.0.1:{free_port()}"])
    assert chat(sim.url("sa"), stream=True, max_tokens=8) == 200
    assert scraper.scrape_all() == 1
    assert Cursor.objects.get(source_name="down").last_error
    assert Window.objects.get(source="pool", pool="sa").requests == 7


def test_a_counter_reset_takes_the_new_counts(make_pool: Any, db: None) -> None:
    make_pool("sr", base_urls=["http://127.0.0.1:9"])
    url = "http://127.0.0.1:9/metrics"
    Cursor.objects.create(source_name="sr", path=url, last_counters={
        "duration": [[1.0, 50], ["+Inf", 60]], "tpot": [[0.1, 500], ["+Inf", 600]]})
    scraper = Scraper(timeout_s=1)
    scraper._fetch = lambda _url: ({"duration": [[1.0, 3], ["+Inf", 4]],  # type: ignore
                                    "tpot": [[0.1, 30], ["+Inf", 40]]}, "")
    scraper.scrape_all()
    window = Window.objects.get(source="pool", pool="sr")
    assert window.requests == 4 and histogram.count(window.tpot) == 40


@pytest.fixture
def envoy(sim: SimProcess, tmp_path: Path) -> Iterator[EnvoyProcess]:
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    adapter = EnvoyAdapter(process.gateway("gw-envoy", load_timeout_s=30))
    adapter.apply(DesiredState(
        routes=(RouteSpec(key="chat", model=MODEL, latency_class="", residency="", revision=1,
                          weights={"sa": 10_000}),),
        pools={"sa": PoolTarget("sa", (sim.url("sa"),), "US")}))
    yield process
    process.stop()


def test_a_real_envoy_log_becomes_windows_matching_the_requests(
        envoy: EnvoyProcess, db: None) -> None:
    assert envoy.access_log_path is not None
    Gateway.objects.create(name="gw-envoy", kind="envoy", admin_address=envoy.admin_url,
                           options={"access_log": str(envoy.access_log_path)})
    statuses = [chat(envoy.listen_url, stream=i % 3 != 0, max_tokens=8) for i in range(12)]
    assert statuses == [200] * 12
    ingester = Ingester()  # the real Envoy parser, from the kind registry
    wait_until(lambda: ingester.once() >= 0 and sum(
        Window.objects.filter(source_name="gw-envoy").values_list("requests", flat=True)) >= 12,
        timeout_s=30, what="the ingester to read Envoy's log")
    rows = list(Window.objects.filter(source_name="gw-envoy"))  # one or two 10 s windows
    assert {(row.route, row.pool) for row in rows} == {("chat", "sa")}
    assert sum(row.requests for row in rows) == 12 and sum(row.errors for row in rows) == 0
    assert sum(row.streamed for row in rows) == 8
    assert sum(histogram.count(row.ttft) for row in rows) == 8
    assert sum(histogram.count(row.duration) for row in rows) == 12
    assert sum(row.flags.get("2xx", 0) for row in rows) == 12
    assert Cursor.objects.get(source_name="gw-envoy").malformed == 0
