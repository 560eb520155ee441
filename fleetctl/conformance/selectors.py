"""Reads for the conformance probe: the run list, one run with its cases side by side."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from fleetctl.conformance import cases as suite
from fleetctl.conformance import services
from fleetctl.conformance.models import ConformanceCase, ConformanceRun, RoutingProbe


def run_list() -> QuerySet[ConformanceRun]:
    return ConformanceRun.objects.select_related("pool", "primary", "plan")


def run_get(*, run_id: int) -> ConformanceRun | None:
    return run_list().filter(pk=run_id).first()


def runs_with_cases() -> QuerySet[ConformanceRun]:
    """The runs, each with its case rows and their pools (the API's run detail)."""
    return run_list().prefetch_related("cases__pool")


def run_cases(*, run: ConformanceRun) -> QuerySet[ConformanceCase]:
    return ConformanceCase.objects.filter(run=run).select_related("pool").order_by(
        "position", "role", "endpoint")


@dataclass
class CaseLine:
    """One case of the suite on the run page: its rows on each endpoint of the pool under
    test and on the reference, side by side."""

    key: str
    title: str
    required: bool
    sends: str
    judges: str
    status: str  # the pool under test's, worst over its endpoints; "" while not judged
    pool_rows: list[ConformanceCase] = field(default_factory=list)
    primary_row: ConformanceCase | None = None
    parity: bool = False
    cells: list[ConformanceCase | None] = field(default_factory=list)  # per endpoint, in order


def endpoint_key(url: str) -> str:
    """How a base URL is stored on a case row (the probe's base URL)."""
    return url.rstrip("/").removesuffix("/v1")


def case_lines(*, run: ConformanceRun) -> list[CaseLine]:
    rows = list(run_cases(run=run))
    lines = []
    for case in services.cases_for(run):
        mine = [r for r in rows if r.key == case.key and r.role == ConformanceCase.Role.POOL]
        theirs = next((r for r in rows if r.key == case.key
                       and r.role == ConformanceCase.Role.PRIMARY), None)
        status = max((r.status for r in mine), key=lambda s: services.SEVERITY[s], default="")
        by_endpoint = {r.endpoint: r for r in mine}
        cells = [by_endpoint.get(endpoint_key(url)) for url in run.pool.base_urls or []]
        lines.append(CaseLine(key=case.key, title=case.title,
                              required=services.required(run, case), sends=case.sends,
                              judges=case.judges, status=status, pool_rows=mine,
                              primary_row=theirs, parity=case.parity, cells=cells))
    return lines


def progress(*, run: ConformanceRun) -> dict[str, Any]:
    endpoints = len(run.pool.base_urls or [])
    cases = services.cases_for(run)
    planned = sum(endpoints + (0 if c.parity or run.primary_id is None else 1) for c in cases)
    done = ConformanceCase.objects.filter(run=run).count()
    return {"done": done, "planned": planned,
            "percent": round(100 * done / planned) if planned else None}


def suite_table() -> list[suite.Case]:
    return list(suite.CASES)


def routing_probe_list() -> QuerySet[RoutingProbe]:
    return RoutingProbe.objects.select_related("route", "plan").order_by("-created_at", "-id")


def routing_probe_get(*, probe_id: int) -> RoutingProbe | None:
    return RoutingProbe.objects.select_related("route", "plan").filter(pk=probe_id).first()
