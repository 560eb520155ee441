"""Following one gateway's access log (Follower) and adding what it reads into open windows
(Aggregator): the ingester's reading half, with no database work (ingest.py flushes)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleetctl.telemetry.histogram import bucket_of
from fleetctl.traffic.gateways.base import ENDED_BY_CLIENT, ENDED_BY_POOL, LogRecord

log = logging.getLogger("fleetctl.telemetry.ingest")

Parser = Callable[[bytes, Mapping[str, str]], LogRecord | None]

READ_CHUNK = 4 * 1024 * 1024  # bytes read from one file per poll
MAX_LINE = 1024 * 1024  # a "line" longer than this without a newline is skipped as malformed


class _Aggregate:
    __slots__ = (
        "bytes_out",
        "client_disconnects",
        "client_errors",
        "duration",
        "errors",
        "fallbacks",
        "fell_over",
        "flags",
        "requests",
        "retries",
        "streamed",
        "tiers",
        "ttft",
    )

    def __init__(self) -> None:
        self.requests = self.errors = self.client_errors = self.client_disconnects = 0
        self.retries = self.streamed = self.bytes_out = 0
        self.fallbacks = self.fell_over = 0
        self.ttft: dict[int, int] = {}
        self.duration: dict[int, int] = {}
        self.flags: dict[str, int] = {}
        self.tiers: dict[str, int] = {}  # context tier routed by ("0", "unknown") -> count


class Aggregator:
    """Open windows: (gateway, route, pool, window start in epoch seconds) -> aggregate."""

    def __init__(self, window_s: int) -> None:
        self.window_s = window_s
        self.open: dict[tuple[str, str, str, int], _Aggregate] = {}

    def _window(self, gateway: str, route: str, pool: str, start: int) -> _Aggregate:
        key = (gateway, route, pool, start)
        agg = self.open.get(key)
        if agg is None:
            agg = self.open[key] = _Aggregate()
        return agg

    def add(self, gateway: str, record: LogRecord) -> None:
        start = int(record.start) - int(record.start) % self.window_s
        agg = self._window(gateway, record.route, record.pool, start)
        status = record.status
        if record.attempts > 1:
            agg.retries += record.attempts - 1
        if record.fallback_from:
            # The answering pool's window counts a fallback; the chosen pool's, that one
            # of its requests fell over (its connect failed: nothing else of it is logged).
            agg.fallbacks += 1
            self._window(gateway, record.route, record.fallback_from, start).fell_over += 1
        agg.bytes_out += record.bytes_out
        if record.ended_by == ENDED_BY_CLIENT:
            agg.client_disconnects += 1
            # Its duration is cut short by the client, so it is no sample of the pool's. Its
            # TTFT is one when the first body byte came before the hang-up: the pool did
            # answer then, and dropping it would bias the TTFT of a pool whose users stop
            # answers early ("stop generating") towards the rest. It gives a client no lever a
            # completed request does not: the time is the pool's own. One that left before
            # the first byte has no TTFT and adds none (so a slow pool whose clients give up
            # loses its slowest samples: the guard compares disconnect shares for that).
            if record.streamed and record.ttft_ms is not None:
                i = bucket_of(record.ttft_ms)
                agg.ttft[i] = agg.ttft.get(i, 0) + 1
        else:
            agg.requests += 1
            if status >= 500 or status == 0 or record.ended_by == ENDED_BY_POOL:
                agg.errors += 1
            elif status >= 400:
                agg.client_errors += 1
            i = bucket_of(record.duration_ms)
            agg.duration[i] = agg.duration.get(i, 0) + 1
            if record.streamed:
                agg.streamed += 1
                if record.ttft_ms is not None:
                    i = bucket_of(record.ttft_ms)
                    agg.ttft[i] = agg.ttft.get(i, 0) + 1
        if record.tier:
            agg.tiers[record.tier] = agg.tiers.get(record.tier, 0) + 1
        status_class = f"{status // 100}xx" if status else "no-answer"
        agg.flags[status_class] = agg.flags.get(status_class, 0) + 1
        flags = record.flags
        if flags and flags != "-":
            for flag in flags.split(","):
                agg.flags[flag] = agg.flags.get(flag, 0) + 1

    def take(self) -> list[Any]:
        """The open windows as WindowDeltas; the aggregator starts empty again."""
        from fleetctl.telemetry.models import Window
        from fleetctl.telemetry.services import WindowDelta

        deltas = []
        for (gateway, route, pool, start), agg in self.open.items():
            deltas.append(WindowDelta(
                Window.Source.GATEWAY, gateway, route, pool, self.window_s,
                datetime.fromtimestamp(start, tz=UTC),
                counts={"requests": agg.requests, "errors": agg.errors,
                        "client_errors": agg.client_errors,
                        "client_disconnects": agg.client_disconnects,
                        "retries": agg.retries, "fallbacks": agg.fallbacks,
                        "fell_over": agg.fell_over, "streamed": agg.streamed,
                        "bytes_out": agg.bytes_out},
                histograms={"ttft": {str(i): n for i, n in agg.ttft.items()},
                            "duration": {str(i): n for i, n in agg.duration.items()},
                            "flags": dict(agg.flags), "tiers": dict(agg.tiers)}))
        self.open = {}
        return deltas

    def reopen(self, deltas: list[Any]) -> None:
        """Put back windows a flush took but could not write, added to what came since."""
        for delta in deltas:
            key = (delta.source_name, delta.route, delta.pool, int(delta.start.timestamp()))
            agg = self.open.get(key) or _Aggregate()
            for name, value in delta.counts.items():
                setattr(agg, name, getattr(agg, name) + value)
            for name in ("ttft", "duration"):
                into = getattr(agg, name)
                for i, n in delta.histograms[name].items():
                    into[int(i)] = into.get(int(i), 0) + n
            for name in ("flags", "tiers"):
                into = getattr(agg, name)
                for key, n in delta.histograms.get(name, {}).items():
                    into[key] = into.get(key, 0) + n
            self.open[key] = agg


@dataclass
class Follower:
    """Where the ingester stands in one gateway's log file. `offset`/`inode` are those of
    the lines already aggregated; they reach the Cursor row at the next flush."""

    gateway: str
    path: str
    parse: Parser
    endpoints: Mapping[str, str] = field(default_factory=dict)
    inode: int | None = None
    offset: int = 0
    lines: int = 0
    malformed: int = 0
    rotations: int = 0
    truncations: int = 0
    last_error: str = ""
    last_read_at: datetime | None = None
    handle: Any = None

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def poll(self, aggregator: Aggregator, *, max_bytes: int = READ_CHUNK) -> int:
        """Read what complete lines there are (up to max_bytes); returns how many (blank and
        malformed ones included: `lines` counts every line consumed)."""
        self.last_read_at = datetime.now(tz=UTC)
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            # Mid-rotation, or the gateway has not written yet: finish what is open.
            read = self._drain_old(aggregator) if self.handle is not None else 0
            self.last_error = f"{self.path} does not exist (yet)"
            return read
        except OSError as exc:
            self.last_error = f"cannot read {self.path}: {exc}"
            return 0
        read = 0
        if self.handle is not None and os.fstat(self.handle.fileno()).st_ino != stat.st_ino:
            read += self._drain_old(aggregator)
        if self.handle is None:
            if self.inode is not None and self.inode != stat.st_ino:
                self.rotations += 1
                self.offset = 0
            elif stat.st_size < self.offset:
                self.truncations += 1
                self.offset = 0
            try:
                self.handle = open(self.path, "rb")  # noqa: SIM115 (kept open across polls)
            except OSError as exc:
                self.last_error = f"cannot open {self.path}: {exc}"
                return read
            self.inode = os.fstat(self.handle.fileno()).st_ino
        elif stat.st_size < self.offset:
            self.truncations += 1
            self.offset = 0
        self.last_error = ""
        return read + self._read(aggregator, max_bytes, final=False)

    def _drain_old(self, aggregator: Aggregator) -> int:
        """The path was rotated away (or removed): read the old file to its end, its last
        line too (the gateway will not complete it there), and let go of it."""
        read = 0
        while True:
            n = self._read(aggregator, READ_CHUNK, final=True)
            read += n
            if n == 0:
                break
        self.close()
        self.rotations += 1
        self.offset = 0
        self.inode = None
        return read

    def _read(self, aggregator: Aggregator, max_bytes: int, *, final: bool) -> int:
        handle = self.handle
        handle.seek(self.offset)
        data = handle.read(max_bytes)
        if not data:
            return 0
        end = data.rfind(b"\n")
        if end < 0:
            if final or len(data) >= MAX_LINE:
                end = len(data) - 1  # the whole rest is one (last, or monstrous) line
            else:
                return 0  # a partial line: wait for its end
        chunk = data[:end + 1]
        self.offset += end + 1
        parse, endpoints, gateway = self.parse, self.endpoints, self.gateway
        add = aggregator.add
        lines = chunk.splitlines()
        for line in lines:
            try:
                record = parse(line, endpoints)
            except ValueError:
                self.malformed += 1
                continue
            if record is not None:
                add(gateway, record)
        self.lines += len(lines)
        return len(lines)
