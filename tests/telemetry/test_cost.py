"""Live cost per pool and per route (fleetctl/telemetry/cost.py): a real simulated pool at a
fixed load through a real Envoy, its access log ingested and its /metrics scraped; and what
is never a zero (no rate, no token counter, no tokens), a counter reset, the API's checks."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.urls import reverse
from django.utils import timezone

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.models import Pool
from fleetctl.telemetry.cost import live_cost, live_cost_rollup
from fleetctl.telemetry.ingest import Ingester
from fleetctl.telemetry.models import Cursor, Window
from fleetctl.telemetry.scrape import Scraper
from fleetctl.telemetry.services import window_add
from fleetctl.traffic.gateways.base import DesiredState, PoolTarget, RouteSpec
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
from fleetctl.traffic.models import Gateway
from tests.sim.simproc import MODEL, SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

STREAMS, ROUNDS = 4, 5


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    process = sim_with_profiles(tmp_path_factory.mktemp("cost-sim"), TEST_PROFILES,
                                {"sc": "quick"}, models=[MODEL])
    yield process
    process.stop()


@pytest.fixture
def envoy(sim: SimProcess, tmp_path: Path) -> Iterator[EnvoyProcess]:
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    adapter = EnvoyAdapter(process.gateway("gw-cost", load_timeout_s=30))
    adapter.apply(DesiredState(
        routes=(RouteSpec(key="chat", model=MODEL, latency_class="", residency="", revision=1,
                          weights={"sc": 10_000}),),
        pools={"sc": PoolTarget("sc", (sim.url("sc"),), "US")}))
    yield process
    process.stop()


def _completion_tokens(url: str) -> int:
    """One non-streamed chat completion; the output tokens its usage reports."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "cost me"}],
            "max_tokens": 24}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200
    return int(answer.json()["usage"]["completion_tokens"])


def test_live_cost_from_a_real_envoy_log_and_the_pools_counter_at_a_fixed_load(
        sim: SimProcess, envoy: EnvoyProcess, make_pool: Any, client_for: Any) -> None:
    pool = make_pool("sc", base_urls=[sim.url("sc") + "/v1"], node_hourly_rate="36.00")
    assert envoy.access_log_path is not None
    Gateway.objects.create(name="gw-cost", kind="envoy", admin_address=envoy.admin_url,
                           options={"access_log": str(envoy.access_log_path)})
    scraper = Scraper(timeout_s=5)
    t0 = timezone.now() - timedelta(seconds=90)
    assert scraper.scrape_all(now=t0) == 1  # the first look: where the counter stands
    # A fixed load: STREAMS concurrent streams, ROUNDS requests each, through Envoy.
    with ThreadPoolExecutor(STREAMS) as streams:
        served = sum(streams.map(lambda _: sum(_completion_tokens(envoy.listen_url)
                                               for _ in range(ROUNDS)), range(STREAMS)))
    assert served > 0
    t1 = t0 + timedelta(seconds=90)  # the scrape's clock, given: 90 s metered exactly
    assert scraper.scrape_all(now=t1) == 1
    ingester = Ingester()  # the real Envoy parser
    wait_until(lambda: ingester.once() >= 0 and sum(
        Window.objects.filter(source_name="gw-cost").values_list("requests", flat=True))
        >= STREAMS * ROUNDS, timeout_s=30, what="the ingester to read Envoy's log")

    live = live_cost(pool="sc", since=t0 - timedelta(minutes=5), until=t1 + timedelta(minutes=5))
    # Tokens: exactly what the pool's answers reported; hours: the scrapes' interval.
    assert live.output_tokens == served and live.hours == pytest.approx(90 / 3600)
    assert live.cost == "0.9000"  # 36.00 per hour × 90 s
    expected = (Decimal("36.00") * Decimal(1_000_000) / (Decimal(served) / Decimal(90) *
                Decimal(3600))).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)
    assert Decimal(live.cost_per_1m or "0") == expected and not live.not_measured
    assert live.tokens_source.startswith("pool /metrics")
    assert live.currency == pool.currency
    # The only route through Envoy carried every request to the pool: all of it is its share.
    assert [(r["route"], r["share"], r["output_tokens"], r["cost"]) for r in live.routes] == [
        ("chat", 1.0, served, "0.9000")]
    # No benchmark yet: said, not a made-up comparison.
    assert live.benchmark_cost_per_1m is None and "no benchmark" in live.gap
    # The running-requests gauge was read each round (idle at the second scrape, here).
    assert live.mean_running is not None
    assert live.utilisation is None and live.utilisation_source.startswith("not measured")

    # The fleet overview's column and the pool page show it, beside the benchmark's.
    Pool.objects.filter(name="sc").update(cost_per_1m_output_tokens=Decimal(expected) / 2,
                                          cost_hourly_rate=Decimal("36.00"),
                                          cost_currency="USD", cost_source="run #7")
    viewer = client_for("viewer")
    overview = viewer.get(reverse("fleet:overview")).content.decode()
    assert f"{expected:.2f} USD" in overview and "2.00× benchmark" in overview
    page = viewer.get(reverse("fleet:pool-detail", args=["sc"])).content.decode()
    assert "Live cost" in page and f"{expected} USD" in page
    assert "2.00×" in page and "run #7" in page


def test_a_missing_rate_or_token_counter_is_not_measured_never_zero(
        make_pool: Any, db: None) -> None:
    make_pool("free", base_urls=["http://127.0.0.1:9"], node_hourly_rate="0")
    make_pool("old", base_urls=["http://127.0.0.1:10"])
    scraper = Scraper(timeout_s=1)
    answers = {"http://127.0.0.1:9/metrics": {"output_tokens": 100.0, "running": 2.0},
               "http://127.0.0.1:10/metrics": {"duration": [[1.0, 1], ["+Inf", 1]]}}
    scraper._fetch = lambda url: (dict(answers[url]), "")  # type: ignore[method-assign]
    t0 = timezone.now()
    scraper.scrape_all(now=t0)
    answers["http://127.0.0.1:9/metrics"]["output_tokens"] = 1100.0
    answers["http://127.0.0.1:10/metrics"]["duration"] = [[1.0, 5], ["+Inf", 5]]
    scraper.scrape_all(now=t0 + timedelta(seconds=10))
    since, until = t0 - timedelta(minutes=1), t0 + timedelta(minutes=1)
    free = live_cost(pool="free", since=since, until=until)
    assert free.output_tokens == 1000 and free.cost is None and free.cost_per_1m is None
    assert free.not_measured.startswith("not measured: the pool's hourly rate is 0")
    old = live_cost(pool="old", since=since, until=until)
    assert old.cost_per_1m is None and old.output_tokens is None
    assert "no vllm:generation_tokens_total" in old.not_measured
    assert "access logs carry no token counts" in old.not_measured
    # Never scraped in the period: said so.
    later = live_cost(pool="old", since=until + timedelta(hours=1),
                      until=until + timedelta(hours=2))
    assert later.not_measured.startswith("not measured: no token counter seen in this period")


def test_an_idle_pool_costs_money_and_a_counter_reset_takes_the_new_count(
        make_pool: Any, db: None) -> None:
    make_pool("idle", base_urls=["http://127.0.0.1:9"], node_hourly_rate="7.20")
    url = "http://127.0.0.1:9/metrics"
    t0 = timezone.now()
    Cursor.objects.create(source_name="idle", path=url, last_counters={
        "output_tokens": 5000.0, "at": t0.timestamp()})
    scraper = Scraper(timeout_s=1)
    counters = {"output_tokens": 5000.0, "running": 0.0}
    scraper._fetch = lambda _url: (dict(counters), "")  # type: ignore[method-assign]
    scraper.scrape_all(now=t0 + timedelta(seconds=50))  # idle: no tokens, 50 s paid
    window = Window.objects.get(source="pool", pool="idle")
    assert (window.output_tokens, window.metered_ms, window.running_samples) == (0, 50_000, 1)
    since, until = t0 - timedelta(minutes=1), t0 + timedelta(minutes=5)
    idle = live_cost(pool="idle", since=since, until=until)
    assert idle.cost == "0.1000" and idle.cost_per_1m is None
    assert idle.not_measured == ("not measured: no output tokens served in this period; the "
                                 "pool still cost 0.1000 USD (idle)")
    counters["output_tokens"] = 300.0  # the server restarted: its count began again
    scraper.scrape_all(now=t0 + timedelta(seconds=100))
    after = live_cost(pool="idle", since=since, until=until)
    assert after.output_tokens == 300 and after.hours == pytest.approx(100 / 3600)
    assert after.cost_per_1m == "666.6667"  # 7.20 / (300 / 100 s) × 1e6 / 3600


def test_a_routes_share_and_daily_rollups(make_pool: Any, db: None) -> None:
    make_pool("shared", base_urls=["http://127.0.0.1:9"], node_hourly_rate="10.00")
    day = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=2)
    for start, tokens in ((day, 40_000), (day + timedelta(days=1), 20_000)):
        window_add(source="pool", source_name="shared", route="", pool="shared",
                   resolution_s=600, start=start,
                   counts={"output_tokens": tokens, "metered_ms": 600_000})
        for route, requests in (("chat", 30), ("batch", 10)):
            window_add(source="gateway", source_name="gw", route=route, pool="shared",
                       resolution_s=600, start=start, counts={"requests": requests})
    since, until = day - timedelta(hours=12), day + timedelta(days=1, hours=12)
    chat = live_cost(pool="shared", since=since, until=until, route="chat")
    assert chat.route_share == 0.75 and chat.output_tokens == 45_000
    assert chat.cost == "2.5000"  # 10.00 × 20 min × 0.75
    days = live_cost_rollup(pool="shared", since=since, until=until, period="day")
    assert [(d.since.date(), d.output_tokens, d.cost) for d in days] == [
        (day.date(), 40_000, "1.6667"), ((day + timedelta(days=1)).date(), 20_000, "1.6667")]
    months = live_cost_rollup(pool="shared", since=since, until=until, period="month")
    assert sum(m.output_tokens or 0 for m in months) == 60_000


def test_the_cost_api(make_pool: Any, client_for: Any) -> None:
    make_pool("api-pool")
    client = client_for("viewer")
    url = "/api/v1/telemetry/pools/api-pool/cost/"

    def refused(params: dict[str, str]) -> dict[str, Any]:
        answer = client.get(url, params)
        assert answer.status_code == 400
        return answer.json()["error"]["fields"]

    assert "period" in refused({"period": "week"})
    assert refused({"since": "2026-12-05T00:00:00Z", "until": "2026-12-04T00:00:00Z"}) == {
        "since": ["since must be before until."]}
    assert "since" in refused({"since": "not a date"})
    assert "since" in refused({"since": "2026-01-01T00:00:00Z", "until": "2026-03-01T00:00:00Z"})
    assert client.get("/api/v1/telemetry/pools/nope/cost/").status_code == 404
    answer = client.get(url, {"period": "day"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["total"]["cost_per_1m"] is None
    assert body["total"]["not_measured"].startswith("not measured: ")
    assert len(body["periods"]) in (7, 8)  # 7 days back from now: 8 UTC days unless at 0:00


def test_utilisation_against_the_benchmarks_slo_capacity_explains_the_gap(
        make_pool: Any, db: None) -> None:
    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet.services import pool_model_create
    from migrations_plan import services as plans
    from tests.conftest import SYSTEM

    pool = make_pool("util", node_hourly_rate="36.00")
    pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
    # Its benchmark: the SLO held up to 8 streams, which gave 800 output tokens/s: 12.50 per 1M.
    plans.evidence_record(
        actor=Actor.for_system("benchmark"), pool=pool, kind="benchmark", verdict="pass",
        summary="run 3", model_id=MODEL, source="benchmark run 3",
        data={"run": 3, "timing": "concurrency", "best_concurrency": 8,
              "output_tokens_per_s": 800.0, "cost_per_1m": "12.5000",
              "measured_on": "2026-12-01", "endpoints": 1,
              "slo": {"ttft_p95_ms": 800, "tpot_p95_ms": 60, "error_rate": 0.01}})
    Pool.objects.filter(pk=pool.pk).update(
        cost_per_1m_output_tokens=Decimal("12.5000"), cost_hourly_rate=Decimal("36.00"),
        cost_currency="USD", cost_source="run #3")
    # Live: 10 minutes at a mean of 4 running requests and 400 tokens/s.
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    window_add(source="pool", source_name="util", route="", pool="util", resolution_s=600,
               start=start, counts={"output_tokens": 240_000, "metered_ms": 600_000,
                                    "running_sum": 240, "running_samples": 60})
    live = live_cost(pool="util", since=start, until=start + timedelta(minutes=10))
    assert live.cost_per_1m == "25.0000" and live.benchmark_cost_per_1m == "12.5000"
    assert live.utilisation == 0.5 and live.capacity_streams == 8
    assert "benchmark run 3" in live.utilisation_source
    assert live.gap == (
        "live 25.00 vs benchmark 12.50 USD per 1M (run #3), 2.00×: utilisation 50 % (mean 4.0 "
        "of 8 SLO streams running; the benchmark ran at its SLO concurrency); the pool served "
        "400 output tokens/s, 50 % of the 800 its benchmark gave at the SLO")


def _statuses(url: str, n: int) -> list[int]:
    """`n` non-streamed chat completions, one after another: their status codes."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "cost me"}],
            "max_tokens": 16}
    return [httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code
            for _ in range(n)]


def test_an_injected_error_rate_raises_the_cost_per_successful_request(
        sim: SimProcess, tmp_path: Path, make_pool: Any, client_for: Any) -> None:
    # The pool has a second endpoint nobody listens on: Envoy retries a request that could
    # not connect there on the live one (retries), which are spend and never successes.
    dead = f"http://127.0.0.1:{free_port()}"
    make_pool("sc", base_urls=[sim.url("sc") + "/v1"], node_hourly_rate="36.00")
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    try:
        EnvoyAdapter(process.gateway("gw-err", load_timeout_s=30)).apply(DesiredState(
            routes=(RouteSpec(key="chat", model=MODEL, latency_class="", residency="",
                              revision=1, weights={"sc": 10_000}),),
            pools={"sc": PoolTarget("sc", (sim.url("sc"), dead), "US")}))
        assert process.access_log_path is not None
        Gateway.objects.create(name="gw-err", kind="envoy", admin_address=process.admin_url,
                               options={"access_log": str(process.access_log_path)})
        ingester, scraper = Ingester(), Scraper(timeout_s=5)

        def phase(error_rate: float) -> tuple[list[int], Any]:
            """A fixed load (STREAMS × ROUNDS requests) at `error_rate`, 60 s metered (the
            scrapes' clock, given), read from fresh windows."""
            Window.objects.all().delete()
            Cursor.objects.filter(source_name="sc").delete()  # the pool's: a first look
            t0 = timezone.now() - timedelta(seconds=60)
            httpx.post(f"{sim.url('sc')}/admin/faults", json={"error_rate": error_rate},
                       timeout=5).raise_for_status()
            assert scraper.scrape_all(now=t0) == 1
            with ThreadPoolExecutor(STREAMS) as streams:
                codes = [c for part in streams.map(lambda _: _statuses(process.listen_url,
                                                                       ROUNDS), range(STREAMS))
                         for c in part]
            assert scraper.scrape_all(now=t0 + timedelta(seconds=60)) == 1
            wait_until(lambda: ingester.once() >= 0 and sum(
                Window.objects.filter(source_name="gw-err").values_list("requests", flat=True))
                >= len(codes), timeout_s=30, what="the ingester to read Envoy's log")
            return codes, live_cost(pool="sc", since=t0 - timedelta(minutes=5),
                                    until=t0 + timedelta(minutes=5))

        clean_codes, clean = phase(0.0)
        codes, faulty = phase(0.4)
    finally:
        httpx.post(f"{sim.url('sc')}/admin/faults", json={"error_rate": 0.0}, timeout=5)
        process.stop()
    # Envoy's retry may land on the dead endpoint again (names.py: about 2^-5 per retry):
    # a 503 the client saw, counted as the error it is.
    clean_ok = clean_codes.count(200)
    assert set(clean_codes) <= {200, 503} and set(codes) <= {200, 500, 503}
    assert (clean.requests, clean.successful_requests) == (len(clean_codes), clean_ok)
    ok = codes.count(200)
    failed = len(codes) - ok
    assert 0 < failed < len(codes) and ok < clean_ok
    # What the client saw is what the access log says, and the spend is the pool's 60 s.
    assert (faulty.requests, faulty.failed_requests, faulty.successful_requests) == (
        len(codes), failed, ok)
    assert faulty.error_rate == pytest.approx(failed / len(codes))
    assert clean.retries is not None and faulty.retries is not None
    assert clean.retries + faulty.retries > 0  # the dead endpoint: Envoy's retries, logged
    assert clean.cost == faulty.cost == "0.6000"  # 36.00 per hour × 60 s, busy or failing
    assert faulty.cost_per_success == str(
        (Decimal("0.6") / ok).quantize(Decimal("1e-8"), rounding=ROUND_HALF_UP))
    assert clean.cost_per_success == str(
        (Decimal("0.6") / clean_ok).quantize(Decimal("1e-8"), rounding=ROUND_HALF_UP))
    # The same load, the same spend, fewer successes: each success costs more.
    assert Decimal(faulty.cost_per_success) > Decimal(clean.cost_per_success)
    assert [(r["route"], r["successful_requests"], r["cost_per_success"])
            for r in faulty.routes] == [("chat", ok, faulty.cost_per_success)]
    assert not faulty.per_success_not_measured
    # The API and the pool page show it.
    answer = client_for("viewer").get("/api/v1/telemetry/pools/sc/cost/", {
        "since": (timezone.now() - timedelta(minutes=20)).isoformat(),
        "until": timezone.now().isoformat()})
    assert answer.status_code == 200, answer.content
    total = answer.json()["total"]
    assert (total["successful_requests"], total["failed_requests"], total["cost_per_success"]) == (
        ok, failed, faulty.cost_per_success)
    assert total["routes"][0]["cost_per_success"] == faulty.cost_per_success
    page = client_for("viewer", username="page-viewer").get(
        reverse("fleet:pool-detail", args=["sc"])).content.decode()
    assert "Per successful request, last hour" in page
    assert f"{faulty.cost_per_success} USD" in page
    assert f"{ok} of {len(codes)} requests succeeded" in page


def test_cost_per_successful_request_is_never_a_zero(make_pool: Any, db: None) -> None:
    make_pool("quiet", base_urls=["http://127.0.0.1:9"], node_hourly_rate="36.00")
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    since, until = start, start + timedelta(minutes=10)
    window_add(source="pool", source_name="quiet", route="", pool="quiet", resolution_s=600,
               start=start, counts={"output_tokens": 0, "metered_ms": 600_000})
    nothing = live_cost(pool="quiet", since=since, until=until)
    assert nothing.cost == "6.0000" and nothing.cost_per_success is None
    assert nothing.requests is None
    assert nothing.per_success_not_measured.startswith(
        "not measured: the gateways logged no request to this pool")
    window_add(source="gateway", source_name="gw", route="chat", pool="quiet",
               resolution_s=600, start=start, counts={"requests": 5, "errors": 5, "retries": 2})
    failing = live_cost(pool="quiet", since=since, until=until)
    assert (failing.requests, failing.failed_requests, failing.successful_requests) == (5, 5, 0)
    assert failing.error_rate == 1.0 and failing.cost_per_success is None
    assert failing.per_success_not_measured == (
        "not measured: no request succeeded in this period (5 attempted, 5 failed); the pool "
        "still cost 6.0000 USD")
    # A request the split sent here that another pool answered is an attempt this pool failed.
    window_add(source="gateway", source_name="gw", route="chat", pool="quiet",
               resolution_s=600, start=start, counts={"requests": 15, "fell_over": 4})
    some = live_cost(pool="quiet", since=since, until=until)
    assert (some.requests, some.failed_requests, some.successful_requests) == (24, 9, 15)
    assert some.cost_per_success == "0.40000000"  # 6.00 ÷ 15, to 8 decimals
    Pool.objects.filter(name="quiet").update(node_hourly_rate=0)
    free = live_cost(pool="quiet", since=since, until=until)
    assert free.cost_per_success is None and free.successful_requests == 15
    assert free.per_success_not_measured.startswith("not measured: the pool's hourly rate is 0")
