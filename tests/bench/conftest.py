"""Fixtures for the benchmark runner: one simulator process (real, `python -m fleetctl.sim`)
with ground truth recorded, and a trace row type that needs nothing from `traces.py`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.sim.simproc import SimProcess

# Known timing, network latency 0, one shared step time for any batch (decode_per_seq_ms 0),
# prefill 20,000 tok/s: a 600-token prompt adds 30 ms to the step that emits its first token.
BENCH_PROFILES = """
[profiles.paced]
base = "h200"
decode_base_ms = 20.0
decode_per_seq_ms = 0.0
prefill_tokens_per_s = 20000.0
network_latency_ms = 0.0
divergence_rate = 0.0
max_context = 8192
kv_cache_tokens = 400000
prefix_cache_tokens = 16384
"""
BENCH_POOLS = {"paced": "paced", "faulty": "paced", "flaky": "paced"}


@dataclass(frozen=True)
class Row:
    """A trace row as the runner reads it (the shape of `traces.TraceRequest`)."""

    prompt_tokens: int
    completion_tokens: int
    arrival_s: float = 0.0
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prefix_group: str | None = None
    prefix_tokens: int = 0
    latency_class: str | None = None


@pytest.fixture(scope="session")
def bench_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    folder = tmp_path_factory.mktemp("bench-sim")
    profiles = folder / "profiles.toml"
    profiles.write_text(BENCH_PROFILES)
    args = ["--profiles", str(profiles), "--log-level", "WARNING", "--record-ground-truth"]
    for name, profile in BENCH_POOLS.items():
        args += ["--pool", f"{name}={profile}@0"]
    sim = SimProcess(args, len(BENCH_POOLS), Path(folder) / "sim.log")
    yield sim
    sim.stop()
