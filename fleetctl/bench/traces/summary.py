"""What a trace looks like, summarised in one pass as it streams by."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from fleetctl.bench.traces.request import NO_REQUESTS, TraceError, TraceRequest


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What a trace looks like. Percentiles are nearest-rank (always an observed value);
    the mean rate is (count − 1) / duration, None when every request arrives at once."""

    request_count: int
    duration_s: float
    mean_request_rate_per_s: float | None
    prompt_tokens_p50: int
    prompt_tokens_p95: int
    prompt_tokens_max: int
    prompt_tokens_total: int
    completion_tokens_p50: int
    completion_tokens_p95: int
    completion_tokens_max: int
    completion_tokens_total: int
    prefix_group_share: float
    prefix_token_share: float
    with_text_share: float
    latency_classes: dict[str, int] = field(default_factory=dict)


class TraceSummariser:
    """One-pass summary: add() each request as it streams by, then result(). Token counts are
    kept as histograms (value → count), so percentiles are exact and memory stays small."""

    def __init__(self) -> None:
        self.count = 0
        self.first_arrival_s = 0.0
        self.last_arrival_s = 0.0
        self.prompt: Counter[int] = Counter()
        self.completion: Counter[int] = Counter()
        self.in_group = 0
        self.prefix_tokens = 0
        self.with_text = 0
        self.latency: Counter[str] = Counter()

    def add(self, request: TraceRequest) -> TraceRequest:
        if not self.count:
            self.first_arrival_s = request.arrival_s
        self.count += 1
        self.last_arrival_s = request.arrival_s
        self.prompt[request.prompt_tokens] += 1
        self.completion[request.completion_tokens] += 1
        if request.prefix_tokens:
            self.in_group += 1
            self.prefix_tokens += request.prefix_tokens
        if request.prompt is not None or request.messages is not None:
            self.with_text += 1
        if request.latency_class is not None:
            self.latency[request.latency_class] += 1
        return request

    def result(self) -> TraceSummary:
        if not self.count:
            raise TraceError([(0, NO_REQUESTS)])
        duration = self.last_arrival_s - self.first_arrival_s
        prompt_total = sum(v * c for v, c in self.prompt.items())
        return TraceSummary(
            request_count=self.count, duration_s=duration,
            mean_request_rate_per_s=(self.count - 1) / duration if duration > 0 else None,
            prompt_tokens_p50=_rank(self.prompt, 0.50), prompt_tokens_p95=_rank(self.prompt, 0.95),
            prompt_tokens_max=max(self.prompt), prompt_tokens_total=prompt_total,
            completion_tokens_p50=_rank(self.completion, 0.50),
            completion_tokens_p95=_rank(self.completion, 0.95),
            completion_tokens_max=max(self.completion),
            completion_tokens_total=sum(v * c for v, c in self.completion.items()),
            prefix_group_share=self.in_group / self.count,
            prefix_token_share=self.prefix_tokens / prompt_total,
            with_text_share=self.with_text / self.count,
            latency_classes=dict(sorted(self.latency.items())),
        )


def _rank(histogram: Counter[int], q: float) -> int:
    """Nearest-rank percentile: the smallest value with at least q of the count at or below."""
    values = sorted(histogram)
    cumulative = list(itertools.accumulate(histogram[v] for v in values))
    target = max(1, math.ceil(q * cumulative[-1]))
    return values[bisect.bisect_left(cumulative, target)]


def summarise(requests: Iterable[TraceRequest]) -> TraceSummary:
    """Summarise in one pass (the iterable is consumed, not stored)."""
    summariser = TraceSummariser()
    for request in requests:
        summariser.add(request)
    return summariser.result()
