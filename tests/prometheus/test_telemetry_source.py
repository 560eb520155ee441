"""A Prometheus as a telemetry source: the real Prometheus of the stack scrapes the simulated
pools; the reader (fleetctl/prometheus/telemetry.py) turns each pool's vLLM histograms into
windows of source "prometheus", shown beside the gateways' figures, labelled by source, and
never read by the ramp guard. A Prometheus that is down writes no window and shows its
error."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleetctl.core.ports import free_port
from fleetctl.prometheus import services
from fleetctl.prometheus.telemetry import PrometheusReader
from fleetctl.ramps import guard
from fleetctl.ramps.selectors import pool_judgement
from fleetctl.telemetry import histogram
from fleetctl.telemetry.models import Cursor, Window
from fleetctl.telemetry.scrape import Scraper
from fleetctl.telemetry.selectors import ingest_status, live_summary, pool_stats
from tests.sim.simproc import client
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db

CANDIDATE = "mi300x-us"


def _count(stack, pool: str) -> float:
    series = stack.series(f'sum(vllm:e2e_request_latency_seconds_count{{pool="{pool}"}})')
    return float(series[0]["value"][1]) if series else 0.0  # type: ignore[index]


def _requests(stack, pool: str, n: int) -> None:
    """`n` chat requests to the pool, then a wait until Prometheus has scraped them all."""
    before = _count(stack, pool)
    openai = client(stack.sim.url(pool))
    model = openai.models.list().data[0].id
    for _ in range(n):
        openai.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "user", "content": "hello"}])
    wait_until(lambda: _count(stack, pool) >= before + n, timeout_s=30,
               what=f"Prometheus to scrape the {n} requests")


def test_each_pools_histograms_become_prometheus_windows_beside_the_gateways(
        stack, world, client_for):
    services.source_create(actor=world.actor("admin"), name="prom",
                           base_url=stack.prometheus.url, telemetry_selector='pool="$pool"')
    reader = PrometheusReader()
    # Prometheus has scraped both pools (the fixture waits for `up`), so the first read finds
    # their counters: it only records where they stand. (Through the ingester's scrape
    # thread's call: telemetry finds the reader as a provider.)
    assert Scraper().read_prometheus() == 2
    assert not Window.objects.filter(source="prometheus").exists()
    _requests(stack, CANDIDATE, 6)
    assert reader.read_all() == 2

    window = Window.objects.get(source="prometheus", source_name="prom", pool=CANDIDATE)
    assert window.route == "" and window.requests == 6
    assert histogram.count(window.ttft) == 6 and histogram.count(window.duration) == 6
    # The primary served nothing in between: no window (never a window of zeros).
    assert not Window.objects.filter(source="prometheus", pool="h200-us").exists()
    cursor = Cursor.objects.get(source_name="prom", path=f"prometheus:{CANDIDATE}")
    assert cursor.last_error == "" and cursor.lines == 2
    assert {"source": "prom", "kind": "Prometheus", "path": f"prometheus:{CANDIDATE}"}.items() \
        <= next(row for row in ingest_status() if row["source"] == "prom"
                and row["path"].endswith(CANDIDATE)).items()

    # Shown beside the gateways' figures, labelled by source; the gateways' own are untouched
    # (no gateway logged anything: requests 0, no TTFT), so nothing is counted twice.
    since = timezone.now() - timedelta(minutes=1)
    stats = pool_stats(pool=CANDIDATE, since=since, reported=True)
    assert stats.requests == 0 and stats.ttft_p95.value is None
    (prom,) = stats.reported
    assert prom.label == "from Prometheus prom" and prom.requests == 6 and prom.error == ""
    assert prom.ttft_p95.n == 6 and prom.ttft_p95.value is not None
    assert prom.ttft_p95.source.startswith("from Prometheus prom (vllm:time_to_first_token")
    assert live_summary(pools=[CANDIDATE])[CANDIDATE].reported[0].duration_p95.n == 6

    # The guard reads the gateways' windows only: six requests in Prometheus are no data to
    # it (it waits), never a judgement on them.
    judgement = pool_judgement(pool=CANDIDATE, route="llama", primary="h200-us",
                               thresholds=guard.Thresholds(800, 60, 0.01, 20.0, None),
                               min_samples=5, since=since, until=timezone.now(),
                               now=timezone.now())
    assert judgement.decision == guard.WAIT
    assert judgement.numbers["candidate"]["requests"] == 0
    assert "reported" not in judgement.numbers["candidate"]

    viewer = client_for("viewer")
    answer = viewer.get(f"/api/v1/telemetry/pools/{CANDIDATE}/").json()
    (shown,) = answer["stats"]["reported"]
    assert shown["label"] == "from Prometheus prom" and shown["requests"] == 6
    assert shown["ttft_p95"]["n"] == 6
    page = viewer.get(f"/pools/{CANDIDATE}/").content.decode()
    assert "From Prometheus prom" in page and 'class="reported-ttft"' in page


def test_a_pool_matcher_reads_every_pool_with_one_query_a_histogram_and_agrees_with_per_pool(
        stack, world, monkeypatch):
    """`pool="$pool"` is read for the whole fleet at once (three queries a round); a selector
    that names the pool otherwise (`pool=~"$pool"`) is read per pool (three each); both
    write the same windows from the same counters."""
    from fleetctl.prometheus import telemetry

    services.source_create(actor=world.actor("admin"), name="fleet",
                           base_url=stack.prometheus.url, telemetry_selector='pool="$pool"')
    services.source_create(actor=world.actor("admin"), name="each",
                           base_url=stack.prometheus.url, telemetry_selector='pool=~"$pool"')
    asked: list[tuple[str, str]] = []
    real_get = telemetry.source_get

    def counting_get(source, path, params=None, **kw):
        asked.append((source.name, (params or {}).get("query", "")))
        return real_get(source, path, params, **kw)

    monkeypatch.setattr(telemetry, "source_get", counting_get)
    reader = PrometheusReader()
    assert reader.read_all() == 4  # two sources x two pools, baselines only
    assert sorted(n for n, _ in asked) == ["each"] * 6 + ["fleet"] * 3
    assert all('pool!=""' in q and "by (le, instance, pool)" in q
               for n, q in asked if n == "fleet")
    _requests(stack, CANDIDATE, 5)
    assert reader.read_all() == 4
    fleet = Window.objects.get(source="prometheus", source_name="fleet", pool=CANDIDATE)
    each = Window.objects.get(source="prometheus", source_name="each", pool=CANDIDATE)
    assert fleet.requests == each.requests == 5
    assert fleet.ttft == each.ttft and fleet.duration == each.duration
    assert not Window.objects.filter(source="prometheus", pool="h200-us").exists()


@pytest.mark.parametrize(("selector", "label", "query"), [
    ('pool="$pool"', "pool", 'sum by (le, instance, pool) (f_bucket{pool!=""})'),
    ('pool = "$pool",job="vllm"', "pool",
     'sum by (le, instance, pool) (f_bucket{pool!="",job="vllm"})'),
    ('job="vllm",k8s_pool="$pool"', "k8s_pool",
     'sum by (le, instance, k8s_pool) (f_bucket{job="vllm",k8s_pool!=""})'),
    ('pool=~"$pool"', None, None),  # a regex: per pool
    ('job="vllm-$pool"', None, None),  # the pool inside a value: per pool
    ('pool="$pool",alias="$pool"', None, None),  # two matchers: per pool
    ('job="a\\"pool=\\"$pool"', None, None),  # inside a quoted value: per pool
])
def test_which_selectors_are_read_for_the_whole_fleet_at_once(selector, label, query):
    from fleetctl.prometheus.telemetry import fleet_query, pool_label

    assert pool_label(selector) == label
    if label is not None:
        assert fleet_query("f", selector, label) == query


def test_a_prometheus_that_is_down_writes_no_windows_and_shows_its_error(world, client_for):
    services.source_create(actor=world.actor("admin"), name="gone",
                           base_url=f"http://127.0.0.1:{free_port()}", timeout_s=1.0,
                           telemetry_selector='pool="$pool"')
    reader = PrometheusReader()
    assert reader.read_all() == 0
    assert reader.read_all() == 0
    assert not Window.objects.filter(source="prometheus").exists()
    cursor = Cursor.objects.get(source_name="gone", path=f"prometheus:{CANDIDATE}")
    assert "unreachable" in cursor.last_error and "Prometheus gone" in cursor.last_error
    (gone,) = live_summary(pools=[CANDIDATE])[CANDIDATE].reported
    assert gone.ttft_p95.value is None and gone.requests == 0  # a dash, never a zero
    assert "unreachable" in gone.error
    page = client_for("viewer").get(f"/pools/{CANDIDATE}/").content.decode()
    assert "pool-reported-error" in page and "unreachable" in page
    # No longer a telemetry source: its state goes with it.
    services.source_update(actor=world.actor("admin"),
                           source=services.MetricSource.objects.get(name="gone"),
                           telemetry_selector="")
    assert not Cursor.objects.filter(source_name="gone").exists()
    assert live_summary(pools=[CANDIDATE])[CANDIDATE].reported == []
    assert PrometheusReader().read_all() == 0 and not Cursor.objects.filter(
        source_name="gone").exists()


def test_a_selector_without_series_says_so(stack, world):
    services.source_create(actor=world.actor("admin"), name="prom",
                           base_url=stack.prometheus.url,
                           telemetry_selector='pool="$pool",job="no-such-job"')
    assert PrometheusReader().read_all() == 0
    cursor = Cursor.objects.get(source_name="prom", path=f"prometheus:{CANDIDATE}")
    assert cursor.last_error.startswith("no series: Prometheus prom has no")
    assert 'pool="mi300x-us",job="no-such-job"' in cursor.last_error
    assert not Window.objects.filter(source="prometheus").exists()


@pytest.mark.parametrize(("body", "says"), [
    ({"telemetry_selector": 'job="vllm"'}, "$pool"),
    ({"telemetry_selector": '{pool="$pool"}'}, "without braces"),
    ({"telemetry_selector": 'pool="$pool",route="$route"'}, "Only $pool"),
    ({"telemetry_selector": 'pool="$pool"', "kind": "http-json"}, "Only a Prometheus"),
])
def test_a_bad_selector_is_a_400_naming_it_and_nothing_is_stored(world, client_for, body, says):
    from fleetctl.prometheus.models import MetricSource

    admin = client_for("admin")
    answer = admin.post("/api/v1/metric-sources/", {
        "name": "prom", "base_url": "http://10.0.0.5:9090", **body}, format="json")
    assert answer.status_code == 400, answer.content
    assert says in str(answer.json()["error"]["fields"]["telemetry_selector"])
    assert not MetricSource.objects.exists()
    made = admin.post("/api/v1/metric-sources/", {
        "name": "prom", "base_url": "http://10.0.0.5:9090"}, format="json")
    assert made.status_code == 201 and made.json()["telemetry_selector"] == ""
    changed = admin.patch("/api/v1/metric-sources/prom/", body, format="json")
    assert changed.status_code == 400
    assert MetricSource.objects.get().telemetry_selector == ""
