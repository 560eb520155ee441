"""Three real ingester processes share six gateways' access logs (a lease per log): every
line is counted exactly once, and when one is killed with SIGKILL mid-stream the other two
take its shards over once its leases expired, still counting every line once."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetctl.demo.process import stop
from fleetctl.telemetry import histogram
from fleetctl.telemetry.ingest import LEASE_SOURCE, SHARD_PREFIX
from fleetctl.telemetry.models import Cursor, Window
from fleetctl.traffic.models import Gateway
from tests.support.waiting import wait_until
from tests.telemetry.lines import envoy_line, start_ingester

pytestmark = pytest.mark.slow

LOGS = 6


def _owners() -> dict[str, str]:
    """gateway -> owner of its live lease."""
    now = datetime.now(tz=UTC)
    return {row.path.removeprefix(SHARD_PREFIX + "log:"): row.last_counters["owner"]
            for row in Cursor.objects.filter(source_name=LEASE_SOURCE,
                                             path__startswith=SHARD_PREFIX + "log:",
                                             updated_at__gte=now)}


def _lines() -> dict[str, int]:
    return dict(Cursor.objects.exclude(source_name=LEASE_SOURCE)
                .values_list("source_name", "lines"))


def test_three_ingesters_share_six_logs_and_survive_a_kill(transactional_db: None,
                                                           tmp_path: Path) -> None:
    paths = {}
    for i in range(LOGS):
        name = f"gw-{i}"
        paths[name] = tmp_path / f"{name}.log"
        paths[name].touch()
        Gateway.objects.create(name=name, kind="envoy", admin_address="http://127.0.0.1:1",
                               options={"access_log": str(paths[name])})
    written = dict.fromkeys(paths, 0)
    done = threading.Event()
    t0 = time.time()

    def writer() -> None:
        # Bursts of 20 lines into every log in turn (~6,000 lines/s in all), each burst's
        # last line split across two writes (a gateway's buffer ends anywhere).
        logs = {name: open(path, "ab", buffering=0) for name, path in paths.items()}  # noqa: SIM115
        try:
            while not done.is_set():
                for name, log in logs.items():
                    n = written[name]
                    burst = b"".join(envoy_line(start=t0 + (n + k) % 40, pool=f"p{k % 3}")
                                     for k in range(20))
                    log.write(burst[:-25])
                    log.write(burst[-25:])
                    written[name] = n + 20
                time.sleep(0.02)
        finally:
            for log in logs.values():
                log.close()

    args = ("--no-scrape", "--flush-interval", "0.2")
    procs = {}
    for k in range(3):
        proc = start_ingester(tmp_path / f"ingest-{k}.log", *args)
        procs[proc.pid] = proc
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        # Balanced: 6 shards, 3 live, at most 2 each, so each holds exactly 2.
        def balanced() -> bool:
            owners = _owners()
            held = [list(owners.values()).count(o) for o in set(owners.values())]
            return len(owners) == LOGS and sorted(held) == [2, 2, 2]

        wait_until(balanced, timeout_s=60, what="3 ingesters holding 2 shards each",
                   explain=lambda: repr(_owners()))
        wait_until(lambda: len(_lines()) == LOGS and min(_lines().values()) > 200,
                   timeout_s=60, what="every log read and flushed")
        owners = _owners()
        victim_owner = owners["gw-0"]
        victim = procs[int(victim_owner.split(":")[1])]
        orphans = {gw for gw, owner in owners.items() if owner == victim_owner}
        os.kill(victim.pid, signal.SIGKILL)  # no goodbye flush: what it read since is lost
        victim.wait(timeout=10)
        killed_at = dict(written)

        def taken_over() -> bool:
            now = _owners()
            return (len(now) == LOGS and victim_owner not in now.values()
                    and all(_lines().get(gw, 0) > killed_at[gw] for gw in orphans))

        wait_until(taken_over, timeout_s=60, what="the killed ingester's shards taken over",
                   explain=lambda: repr((_owners(), _lines(), killed_at)))
        done.set()
        thread.join(timeout=10)
        total = dict(written)
        wait_until(lambda: _lines() == total, timeout_s=60, what="every line counted",
                   explain=lambda: repr((_lines(), total)))
        survivors = {owner for owner in _owners().values()}
        assert len(survivors) == 2 and victim_owner not in survivors
    finally:
        done.set()
        for proc in procs.values():
            stop(proc, 20)
    for name, path in paths.items():
        rows = Window.objects.filter(source_name=name)
        assert sum(row.requests for row in rows) == total[name], name
        assert sum(histogram.count(row.duration) for row in rows) == total[name], name
        assert Cursor.objects.get(source_name=name).offset == path.stat().st_size
    taken = "".join((tmp_path / f"ingest-{k}.log").read_text() for k in range(3))
    for gw in orphans:
        assert taken.count(f"took shard log:{gw} ") >= 2  # the victim, then a survivor
    assert not _owners()  # the survivors let their shards go on their clean stop
