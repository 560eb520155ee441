"""Following real files with the real Envoy parser: windows, cursors, rotation, truncation,
partial lines, malformed lines."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fleetctl.telemetry import histogram
from fleetctl.telemetry.ingest import LEASE_SOURCE, Ingester
from fleetctl.telemetry.models import Cursor, Window
from fleetctl.traffic.models import Gateway
from tests.telemetry.lines import envoy_line

T0 = 1_800_000_000.0  # a window boundary (divisible by 10)

pytestmark = pytest.mark.django_db


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "access.log"
    Gateway.objects.create(name="gw-a", kind="envoy", admin_address="http://127.0.0.1:1",
                           options={"access_log": str(path)})
    return path


def _write(path: Path, *lines: bytes, mode: str = "ab") -> None:
    with open(path, mode) as fp:
        fp.write(b"".join(lines))


def _cursor() -> Cursor:
    """The one file's cursor (not the ingester's lease row)."""
    return Cursor.objects.exclude(source_name=LEASE_SOURCE).get()


def _totals() -> dict[str, int]:
    rows = Window.objects.filter(source=Window.Source.GATEWAY)
    return {"requests": sum(r.requests for r in rows), "errors": sum(r.errors for r in rows)}


def test_lines_become_windows_per_route_pool_and_window(log_file: Path) -> None:
    _write(log_file,
           envoy_line(start=T0 + 1, route="chat", pool="pa", ttft_ms=50, duration_ms=900),
           envoy_line(start=T0 + 2, route="chat", pool="pa", status=503, attempts=3,
                      ttft_ms=None, streamed=False, flags="URX,UF"),
           envoy_line(start=T0 + 3, route="chat", pool="pa", status=429, streamed=False),
           envoy_line(start=T0 + 4, route="chat", pool="pa", status=0, ttft_ms=None,
                      flags="UC"),
           envoy_line(start=T0 + 12, route="chat", pool="pa"),
           envoy_line(start=T0 + 5, route="code", pool="pb", bytes_out=10))
    assert Ingester(window_s=10).once() == 6
    first = Window.objects.get(route="chat", pool="pa", start__second=T0 % 60)
    assert (first.source, first.source_name, first.resolution_s) == ("gateway", "gw-a", 10)
    assert first.start.timestamp() == T0
    assert (first.requests, first.errors, first.client_errors, first.retries,
            first.streamed) == (4, 2, 1, 2, 2)
    # TTFT of streamed answers that have one; duration of every request.
    assert histogram.count(first.ttft) == 1 and histogram.count(first.duration) == 4
    assert first.ttft == {str(histogram.bucket_of(50)): 1}
    assert first.flags == {"2xx": 1, "5xx": 1, "4xx": 1, "no-answer": 1, "URX": 1, "UF": 1,
                           "UC": 1}
    assert Window.objects.get(route="chat", pool="pa", start__gt=first.start).requests == 1
    assert Window.objects.get(route="code", pool="pb").bytes_out == 10
    cursor = Cursor.objects.get(source_name="gw-a", path=str(log_file))
    assert cursor.offset == log_file.stat().st_size and cursor.lines == 6
    assert cursor.inode == log_file.stat().st_ino and cursor.last_read_at is not None


def test_flushes_add_and_a_new_ingester_resumes_from_the_cursor(log_file: Path) -> None:
    _write(log_file, *(envoy_line(start=T0 + i % 10) for i in range(5)))
    Ingester(window_s=10).once()
    _write(log_file, *(envoy_line(start=T0 + i % 10) for i in range(7)))
    Ingester(window_s=10).once()  # a restart: only the new lines
    assert Window.objects.get().requests == 12
    assert _cursor().lines == 12


def test_a_partial_last_line_waits_for_its_end(log_file: Path) -> None:
    line = envoy_line(start=T0 + 1)
    _write(log_file, line, line[:20])
    ingester = Ingester(window_s=10)
    assert ingester.once() == 1
    assert _cursor().offset == len(line)
    _write(log_file, line[20:])
    assert ingester.once() == 1
    assert Window.objects.get().requests == 2 and _cursor().malformed == 0


def test_malformed_lines_are_counted_never_fatal(log_file: Path) -> None:
    _write(log_file, b"not json at all\n", b'{"start": "x"}\n', b"\n",
           envoy_line(start=T0 + 1), b'{"route": "chat"}\n', envoy_line(start=T0 + 2))
    Ingester(window_s=10).once()
    cursor = _cursor()
    assert cursor.malformed == 3 and cursor.lines == 6
    assert Window.objects.get().requests == 2


def test_rotation_finishes_the_old_file_then_reads_the_new(log_file: Path) -> None:
    ingester = Ingester(window_s=10)
    _write(log_file, envoy_line(start=T0 + 1))
    ingester.once()
    _write(log_file, envoy_line(start=T0 + 2), envoy_line(start=T0 + 3))  # not read yet
    os.rename(log_file, log_file.with_suffix(".1"))
    _write(log_file, envoy_line(start=T0 + 4), mode="wb")  # the gateway reopened the path
    ingester.once()
    assert _totals()["requests"] == 4
    cursor = _cursor()
    assert cursor.rotations == 1 and cursor.inode == log_file.stat().st_ino
    assert cursor.offset == log_file.stat().st_size


def test_rotation_while_down_starts_the_new_file_from_zero(log_file: Path) -> None:
    _write(log_file, envoy_line(start=T0 + 1))
    Ingester(window_s=10).once()
    os.rename(log_file, log_file.with_suffix(".1"))
    _write(log_file, envoy_line(start=T0 + 2), envoy_line(start=T0 + 3), mode="wb")
    Ingester(window_s=10).once()
    assert _totals()["requests"] == 3 and _cursor().rotations == 1


def test_truncation_reads_again_from_the_start(log_file: Path) -> None:
    ingester = Ingester(window_s=10)
    _write(log_file, *(envoy_line(start=T0 + 1) for _ in range(3)))
    ingester.once()
    os.truncate(log_file, 0)
    _write(log_file, envoy_line(start=T0 + 2))
    ingester.once()
    cursor = _cursor()
    assert _totals()["requests"] == 4 and cursor.truncations == 1
    assert cursor.offset == log_file.stat().st_size


def test_a_missing_file_is_reported_then_followed_when_it_appears(log_file: Path) -> None:
    ingester = Ingester(window_s=10)
    ingester.once()
    assert "does not exist" in _cursor().last_error
    _write(log_file, envoy_line(start=T0 + 1))
    ingester.once()
    assert _cursor().last_error == "" and _totals()["requests"] == 1


def test_gateways_without_a_log_or_a_parser_are_skipped(tmp_path: Path) -> None:
    Gateway.objects.create(name="no-log", kind="envoy", admin_address="http://127.0.0.1:1")
    Gateway.objects.create(name="k8s", kind="gateway-api", admin_address="ns/gw",
                           options={"access_log": str(tmp_path / "x.log")})
    ingester = Ingester(window_s=10)
    ingester.once()
    assert ingester.followers == {}
    assert not Cursor.objects.exclude(source_name=LEASE_SOURCE).exists()


def test_nginx_lines_name_their_pool_through_the_gateways_desired_state(
        make_pool: Any, tmp_path: Path) -> None:
    from fleetctl.fleet.services import pool_health_record, pool_model_create
    from fleetctl.traffic import services
    from tests.conftest import SYSTEM

    model = "llama-3.1-8b-instruct"
    pools = [make_pool(name="primary", base_urls=["http://localhost:18001"]),
             make_pool(name="cand", base_urls=["http://127.0.0.1:18002"])]
    for pool in pools:
        pool_model_create(actor=SYSTEM, pool=pool, model_id=model, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = services.route_create(actor=SYSTEM, name="llama", model_id=model,
                                  primary_pool=pools[0], weights={"primary": 80, "cand": 20})
    path = tmp_path / "nginx.log"
    Gateway.objects.create(name="gw-nginx", kind="nginx", admin_address="http://127.0.0.1:1",
                           options={"access_log": str(path)}).routes.set([route])

    def line(upstream: str) -> bytes:
        return json.dumps({"msec": T0 + 1.5, "request_time": 0.5, "route": "route-llama",
                           "upstream": upstream, "status": 200, "bytes": 10,
                           "header_time": "0.100", "ctype": "text/event-stream"}).encode() + b"\n"

    # nginx logs the address it connected to: localhost is resolved to 127.0.0.1.
    _write(path, line("127.0.0.1:18001"), line("127.0.0.1:18002"), line("10.9.9.9:1"))
    Ingester(window_s=10).once()
    assert dict(Window.objects.values_list("pool", "requests")) == {"primary": 1, "cand": 1,
                                                                     "": 1}
    assert set(Window.objects.values_list("route", flat=True)) == {"llama"}


def test_a_request_the_client_abandoned_is_counted_apart_and_in_no_figure_of_the_pool(
        log_file: Path) -> None:
    # As a real Envoy logs them (tests/traffic/envoy/test_access_log.py): a hang-up before
    # the answer (status 0, DC), one after the first token (200, DC, a first byte), a pool
    # that broke off its answer (200, UPE), a failed connect the client then gave up on
    # (0, DC with UF: the pool's), and two answers that went well.
    _write(log_file,
           envoy_line(start=T0 + 1, status=0, ttft_ms=None, streamed=False, flags="DC",
                      duration_ms=300, bytes_out=0),
           envoy_line(start=T0 + 2, status=200, ttft_ms=400, flags="DC", duration_ms=405),
           envoy_line(start=T0 + 3, status=200, ttft_ms=9, flags="UPE", duration_ms=209),
           envoy_line(start=T0 + 4, status=0, ttft_ms=None, streamed=False, flags="DC,UF"),
           envoy_line(start=T0 + 5, ttft_ms=40, duration_ms=120),
           envoy_line(start=T0 + 6, ttft_ms=50, duration_ms=130))
    Ingester(window_s=10).once()
    window = Window.objects.get(route="chat", pool="pa")
    assert window.client_disconnects == 2
    # Neither hang-up is a request the pool is judged on, nor an error; the broken answer and
    # the failed connect are the pool's errors.
    assert (window.requests, window.errors, window.client_errors, window.streamed) == (
        4, 2, 0, 3)
    # Their durations were cut short by the client: none is a sample. The TTFT of the one
    # that had its first token before hanging up is.
    assert histogram.count(window.duration) == 4
    assert histogram.count(window.ttft) == 4
    assert window.ttft[str(histogram.bucket_of(400))] == 1
    assert window.flags["DC"] == 3 and window.flags["no-answer"] == 2
