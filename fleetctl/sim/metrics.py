"""Prometheus metrics with vLLM's names, one CollectorRegistry per pool.

The engine updates plain Python counters and bucket arrays (a list index and an add per
token); prometheus_client only renders them at scrape time through a custom collector.
That keeps per-token cost far below prometheus_client's locked `observe()`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0)
LAG_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
               1.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((repr(bound), float(running)))
        out.append(("+Inf", float(self.count)))
        return out


@dataclass
class ModelStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    success: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))


@dataclass
class Gauges:
    """Read at scrape time from the engine."""

    running: Callable[[str], int]
    waiting: Callable[[str], int]
    kv_usage: Callable[[], float]
    lagging: Callable[[], bool]


class PoolMetrics:
    def __init__(self, pool_name: str, models: tuple[str, ...], gauges: Gauges) -> None:
        self.pool_name = pool_name
        self.models = models
        self.gauges = gauges
        self.by_model: dict[str, ModelStats] = {m: ModelStats() for m in models}
        self.schedule_lag = Histogram(LAG_BUCKETS)
        self.flush = Histogram(LAG_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # type: ignore[arg-type]

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- collector protocol ------------------------------------------------------------

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._gauges()
        yield from self._counters()
        yield from self._histograms()
        yield self._histogram(
            "sim:schedule_lag_seconds",
            "Scheduler step wake-up minus intended deadline.",
            ["pool"], [([self.pool_name], self.schedule_lag)],
        )
        yield self._histogram(
            "sim:step_flush_seconds",
            "Step wake-up until the woken stream writers handed their chunks to the kernel.",
            ["pool"], [([self.pool_name], self.flush)],
        )
        lagging = GaugeMetricFamily(
            "sim:lagging", "1 when p99 schedule lag over recent steps exceeds 2 ms.",
            labels=["pool"],
        )
        lagging.add_metric([self.pool_name], 1.0 if self.gauges.lagging() else 0.0)
        yield lagging

    def _gauges(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Requests in the running batch.", labels=["model_name"]
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Requests waiting to be admitted.", labels=["model_name"]
        )
        cache = GaugeMetricFamily(
            "vllm:gpu_cache_usage_perc", "KV-cache usage, 0..1.", labels=["model_name"]
        )
        usage = self.gauges.kv_usage()
        for model in self.models:
            running.add_metric([model], float(self.gauges.running(model)))
            waiting.add_metric([model], float(self.gauges.waiting(model)))
            cache.add_metric([model], usage)
        return iter((running, waiting, cache))

    def _counters(self) -> Iterator[Metric]:
        specs = (
            ("vllm:prompt_tokens", "Prefill tokens processed.", "prompt_tokens"),
            ("vllm:generation_tokens", "Generation tokens produced.", "generation_tokens"),
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             "prefix_queries"),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
             "prefix_hits"),
        )
        for name, doc, attr in specs:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            for model, stats in self.by_model.items():
                family.add_metric([model], float(getattr(stats, attr)))
            yield family
        success = CounterMetricFamily(
            "vllm:request_success", "Finished requests.", labels=["model_name", "finished_reason"]
        )
        for model, stats in self.by_model.items():
            for reason in ("stop", "length", *sorted(set(stats.success) - {"stop", "length"})):
                success.add_metric([model, reason], float(stats.success.get(reason, 0)))
        yield success

    def _histograms(self) -> Iterator[Metric]:
        specs = (
            ("vllm:time_to_first_token_seconds", "Time to first token.", "ttft"),
            ("vllm:time_per_output_token_seconds", "Time between output tokens.", "tpot"),
            ("vllm:e2e_request_latency_seconds", "End-to-end request latency.", "e2e"),
            ("vllm:request_queue_time_seconds", "Time waiting before admission.", "queue"),
        )
        for name, doc, attr in specs:
            rows = [([m], getattr(s, attr)) for m, s in self.by_model.items()]
            yield self._histogram(name, doc, ["model_name"], rows)

    @staticmethod
    def _histogram(
        name: str, doc: str, labels: list[str], rows: list[tuple[list[str], Histogram]]
    ) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=labels)
        for values, hist in rows:
            family.add_metric(values, hist.cumulative(), sum_value=hist.total)
        return family
