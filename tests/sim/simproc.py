"""Running the simulator as a real process (`python -m fleetctl.sim --pool ...`) in tests.

Pools listen on port 0 (a free port each); `SimProcess` reads the start-up banners to learn
the URLs, then waits for `/health`.
"""

from __future__ import annotations

import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai

from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
MODEL = "llama-3.1-8b-instruct"

# The pools of tests/sim's fleet, by profile (tests/support/profiles.py TEST_PROFILES).
FLEET_POOLS = {
    "ref": "quick",
    "twin": "quick-twin",
    "div": "diverging",
    "tie": "tie",
    "flip": "flip",
    "narrow": "narrow",
    "small": "small",
    "cache": "prefill",
    "faulty": "quick",
    "gt": "quick",
    "metrics": "quick",
    # One part of the OpenAI contract switched off each: on the command line, and in a file.
    "notools": "quick:tool_calls=false",
    "nojson": "quick:json_mode=false",
    "nousage": "quick:stream_usage=false",
    "nologprobs": "quick:logprobs=false",
    "othertok": "quick-other",
}


class SimProcess:
    """A running `python -m fleetctl.sim` and the URL of each of its pools."""

    def __init__(self, args: list[str], expected_pools: int, log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetctl.sim", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.banners: list[str] = []
        self.urls: dict[str, str] = {}
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._read_banners(expected_pools)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _read_banners(self, expected: int, timeout_s: float = 60.0) -> None:
        # Generous: start-up is quick, but a loaded machine can take seconds to import.
        deadline = time.monotonic() + timeout_s
        while len(self.banners) < expected:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"simulator did not start: {self.log()}") from None
            if line is None:
                raise RuntimeError(f"simulator exited: {self.log()}")
            self.banners.append(line)
            name = line.split()[2]
            # The description may itself contain " on ": take the URL, not the first " on ".
            match = re.search(r" on (https?://\S+) models: ", line)
            if match is None:
                raise RuntimeError(f"unexpected start-up line {line!r}: {self.log()}")
            self.urls[name] = match[1]
        for url in self.urls.values():
            _wait_healthy(url, deadline)

    def url(self, pool: str) -> str:
        return self.urls[pool]

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def sim_with_profiles(folder: Path, profiles: str, pools: dict[str, str], *,
                      models: Sequence[str] = (), args: Sequence[str] = ()) -> SimProcess:
    """A simulator with the given profiles file text (tests/support/profiles.py
    TEST_PROFILES) and pools (name -> profile, each on a free port), serving `models` (the
    profile's own when none are given), with further command-line `args`, logging to
    `folder`/sim.log. The one starter of the tests' simulated fleets."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "profiles.toml"
    path.write_text(profiles)
    argv = ["--profiles", str(path), "--log-level", "WARNING", *args]
    for model in models:
        argv += ["--model", model]
    for name, profile in pools.items():
        argv += ["--pool", f"{name}={profile}@0"]
    return SimProcess(argv, len(pools), folder / "sim.log")


def _wait_healthy(url: str, deadline: float) -> None:
    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout_s=max(0.0, deadline - time.monotonic()),
               what=f"{url} to answer /health")


def run_cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`python -m fleetctl.sim ARGS` to completion (for commands that exit by themselves)."""
    return subprocess.run(
        [sys.executable, "-m", "fleetctl.sim", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
    )


def client(url: str, timeout_s: float = 30.0) -> openai.OpenAI:
    # No retries: a test must see the simulator's first answer (429, 500, 503...).
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sim", max_retries=0, timeout=timeout_s)


def async_client(url: str, timeout_s: float = 30.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="sim", max_retries=0, timeout=timeout_s
    )


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports that can be bound now, below Linux's ephemeral
    range (32768-60999): a port in that range can be taken meanwhile by any outgoing
    connection's local end (the workers' Redis and database connections), and the simulated
    fleet then cannot listen on it."""
    from tests.support.workers import port_range

    start, stop = port_range()  # each test worker its own stretch
    pick = random.Random()
    while True:
        base = pick.randrange(start, stop - count)
        if all(_bindable(base + i) for i in range(count)):
            return base


@contextmanager
def demo_fleet(log: Path) -> Iterator[int]:
    """The demo's simulated pools with the demo's profiles (devstack.DEMO_SIM_POOLS) on
    consecutive free ports, as `make demo` starts them; yields the base port the demo seed
    takes (`--sim-base-port`)."""
    from fleetctl.demo import devstack

    base = free_ports(len(devstack.DEMO_SIM_POOLS) + 1)
    args = ["--log-level", "WARNING"]
    for name, profile, offset in devstack.DEMO_SIM_POOLS:
        args += ["--pool", f"{name}={profile}@{base + offset}"]
    sim = SimProcess(args, len(devstack.DEMO_SIM_POOLS), log)
    try:
        yield base
    finally:
        sim.stop()
