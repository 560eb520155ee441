"""A plan's migration report (issue 29, "write it down"; docs/cost.md, "The migration
report"): one document built from the rows — the method (trace, SLO, sweep), per-backend
conformance, evals and the divergence catalogue, soak and drill, ramps and drain timings,
costs and the business case, every stage move and every approval with the evidence hash it
saw.

`build(plan, generated_at)` returns plain data (`Report`: sections of tables of strings),
read through the apps' selectors. Each section is one function registered with `@section`;
a new section is one such function (and, when a table is not enough, one template named by
its `template`). Everything is ordered by time then id, and every time is written in UTC,
so the same rows and the same generation time give the same document, byte for byte: the
generation time is the only input that is not a row. `rows_sha256` hashes the report's data
without it; it is printed in the document and pins the PDF's /ID.

Rendering: `render_html` (the Django template `economics/report.html`, also used for the
PDF with the print stylesheet `static/report.css`) and `render_pdf` (WeasyPrint). WeasyPrint
needs Pango at run time; without it `render_pdf` raises `UnavailableError` (503) naming the
packages, and the HTML still renders.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.staticfiles import finders
from django.template.loader import render_to_string
from django.urls import reverse

from fleetctl.batch import selectors as batch
from fleetctl.core.errors import UnavailableError
from fleetctl.economics import selectors as economics
from fleetctl.fleet.interruption import effective_rate
from fleetctl.ramps import selectors as ramps
from fleetctl.shadow import selectors as shadow
from fleetctl.telemetry.cost import live_cost
from fleetctl.traffic import selectors as traffic
from migrations_plan import selectors as plans
from migrations_plan.models import STAGE_NAMES, Evidence, Plan

# What the PDF needs besides the Python package (Debian/Ubuntu names).
PDF_SYSTEM_PACKAGES = ("libpango-1.0-0", "libpangoft2-1.0-0")
# The live cost covers this many days before the generation time (windows are kept 30).
LIVE_COST_DAYS = 30
# The divergence catalogue lists this many of the plan's shadow run's most divergent pairs.
DIVERGENT_PAIRS = 20
NOT_MEASURED = "not measured"


@dataclass
class Table:
    caption: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    empty: str = "No rows."


@dataclass
class Section:
    key: str
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # A template of its own ("economics/report/_<key>.html"); "" draws the tables.
    template: str = ""


@dataclass
class Report:
    plan: str
    title: str
    generated_at: str
    sections: list[Section]
    rows_sha256: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


SectionFn = Callable[[Plan, datetime], Section]
SECTIONS: list[tuple[int, SectionFn]] = []


def section(order: int) -> Callable[[SectionFn], SectionFn]:
    """Register a section builder; sections appear by `order` (then name)."""

    def register(fn: SectionFn) -> SectionFn:
        if fn not in (f for _, f in SECTIONS):
            SECTIONS.append((order, fn))
            SECTIONS.sort(key=lambda item: (item[0], item[1].__name__))
        return fn

    return register


# --- formatting: one way for every section --------------------------------------------------

def when(value: datetime | None) -> str:
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def num(value: Any, places: int | None = None) -> str:
    if value is None or value == "":
        return "—"
    if places is not None and isinstance(value, int | float):
        return f"{value:,.{places}f}"
    return str(value)


def ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f} ms"


def _evidence(plan: Plan, kinds: Sequence[str]) -> list[Evidence]:
    return plans.plan_evidence(plan=plan, kinds=kinds)


def _evidence_table(plan: Plan, caption: str, kinds: Sequence[str] | None,
                    rows: list[Evidence] | None = None) -> Table:
    role = {plan.candidate_pool_id: "candidate", plan.primary_pool_id: "primary"}
    return Table(caption, ["Observed", "Pool", "Kind", "Verdict", "Summary", "Source"],
                 [[when(row.observed_at), f"{row.pool.name} ({role.get(row.pool_id, '')})",
                   row.kind, row.verdict, row.summary, row.source]
                  for row in (rows if rows is not None else _evidence(plan, kinds or []))],
                 empty="No evidence of this kind about the candidate or the primary.")


# --- the sections ----------------------------------------------------------------------------

@section(10)
def plan_overview(plan: Plan, at: datetime) -> Section:
    routes = ", ".join(sorted(r.name for r in plan.routes.all()))
    facts = [
        ["Candidate", f"{plan.candidate_pool.name} ({plan.candidate_pool.accelerator}, "
                      f"{plan.candidate_pool.runtime})"],
        ["Primary", f"{plan.primary_pool.name} ({plan.primary_pool.accelerator}, "
                    f"{plan.primary_pool.runtime})"],
        ["Routes", routes or "—"],
        ["State", f"{plan.get_state_display()} (stage {plan.stage}, {plan.stage_name}, "
                  f"entered {when(plan.stage_entered_at)})"],
        ["SLO per pool", f"TTFT p95 ≤ {plan.slo_ttft_p95_ms:g} ms, TPOT p95 ≤ "
                         f"{plan.slo_tpot_p95_ms:g} ms, error rate ≤ {plan.slo_error_rate:g}"
                         + (f", E2E p95 ≤ {plan.slo_e2e_p95_ms:g} ms"
                            if plan.slo_e2e_p95_ms else "")],
        ["Margins", f"latency {plan.latency_margin_pct:g} %, cost {plan.cost_margin_pct:g} %, "
                    f"quality {plan.quality_margin_pct:g} points"],
        ["Approvals per gate", str(plan.required_approvals)],
        ["Created", f"{when(plan.created_at)} by {plan.created_by.username}; owner "
                    f"{plan.owner.username}"],
    ]
    moves = sorted(plans.plan_moves(plan=plan), key=lambda m: (m.at, m.pk))
    return Section("plan", f"Plan {plan.name}", tables=[
        Table("The plan", ["", ""], facts),
        Table("Stage moves", ["At", "Move", "From → to", "By", "Reason", "Gate snapshot hash"],
              [[when(m.at), m.kind, f"{m.from_state} → {m.to_state}", m.by, m.reason,
                m.snapshot_hash or "—"] for m in moves], empty="The plan has not moved yet."),
    ])


@section(20)
def method(plan: Plan, at: datetime) -> Section:
    runs = []
    sweeps = []
    for row in _evidence(plan, ["benchmark"]):
        d = row.data or {}
        slo = d.get("slo") or {}
        load = (f"speed {d['best_speed']:g}×" if d.get("best_speed") is not None
                else f"concurrency {d.get('best_concurrency')}"
                if d.get("best_concurrency") is not None else "none passed")
        runs.append([when(row.observed_at), row.pool.name, num(d.get("run")),
                     f"{d.get('trace', '—')} (sha256 {d.get('trace_sha256') or '—'})",
                     f"TTFT p95 {num(slo.get('ttft_p95_ms'))} ms, TPOT p95 "
                     f"{num(slo.get('tpot_p95_ms'))} ms, errors {num(slo.get('error_rate'))}",
                     f"{d.get('timing', '—')}, window {num(d.get('window_s'))} s, warm-up "
                     f"{num(d.get('warmup_s'))} s", load,
                     num(d.get("output_tokens_per_s"), 1),
                     f"{d['cost_per_1m']} {d.get('currency', '')}" if d.get("cost_per_1m")
                     else NOT_MEASURED])
        for level in d.get("levels") or []:
            sweeps.append([num(d.get("run")), row.pool.name,
                           f"speed {level['speed']:g}×" if level.get("speed") is not None
                           else f"concurrency {level.get('concurrency')}",
                           str(level.get("verdict", "")), num(level.get("ttft_p95_ms"), 1),
                           num(level.get("tpot_p95_ms"), 2),
                           num(level.get("output_tokens_per_s"), 1)])
    return Section(
        "method", "Method: traces, SLO and sweep",
        intro="Each benchmark replays a recorded trace against the pools and sweeps the load; a "
              "level passes only if TTFT p95, TPOT p95 and the error rate (errors counted) all "
              "meet the SLO with enough samples. Cost per 1M output tokens = hourly rate ÷ "
              "output tokens per second × 1e6 ÷ 3600 at the highest passing level.",
        tables=[Table("Benchmark runs", ["Observed", "Pool", "Run", "Trace", "SLO", "Timing",
                                         "Highest passing load", "Output tok/s",
                                         "Cost per 1M"], runs,
                      empty="No benchmark of the candidate or the primary yet."),
                Table("Sweep: every counted level", ["Run", "Pool", "Load", "Verdict",
                                                     "TTFT p95 ms", "TPOT p95 ms",
                                                     "Output tok/s"], sweeps,
                      empty="No levels recorded.")])


@section(30)
def conformance(plan: Plan, at: datetime) -> Section:
    return Section("conformance", "Per-backend conformance",
                   intro="The OpenAI-contract conformance probe and the routing-policy probe, "
                         "per pool.",
                   tables=[_evidence_table(plan, "Conformance results",
                                           ["conformance", "routing-policy"])])


@section(40)
def evals_and_divergence(plan: Plan, at: datetime) -> Section:
    catalogue = []
    run = shadow.run_for_plan(plan)
    if run is not None:
        for pair in shadow.pairs_most_divergent(run, limit=DIVERGENT_PAIRS):
            s = pair.signal or {}
            catalogue.append([when(pair.received_at), pair.request_hash[:16],
                              f"{pair.divergence_score:.3f}",
                              num(s.get("first_divergence")), num(s.get("edit_distance")),
                              num(s.get("length_ratio")),
                              "yes" if pair.noise_diverged else "no",
                              "yes" if pair.candidate_error else "no"])
    return Section(
        "evals", "Evaluations and the divergence catalogue",
        intro="Eval suites run on each backend in turn, and shadow traffic compared against the "
              "primary's own repeat (the noise floor).",
        tables=[_evidence_table(plan, "Eval, shadow and live-quality results",
                                ["eval", "shadow", "live-quality"]),
                Table(f"Divergence catalogue: the {DIVERGENT_PAIRS} most divergent pairs of "
                      f"shadow run {run.pk if run else '—'}",
                      ["Received", "Request sha256", "Divergence", "First divergent token",
                       "Edit distance", "Length ratio", "Primary vs itself diverged",
                       "Candidate error"], catalogue,
                      empty="No shadow run of this plan.")])


@section(50)
def soak_and_drill(plan: Plan, at: datetime) -> Section:
    return Section("soak", "Soak and drill",
                   intro="Batch soaks on the candidate, the checkpoint-and-resume drill and the "
                         "measured cost arbitrage.",
                   tables=[_evidence_table(plan, "Soak, drill and arbitrage results",
                                           ["soak", "checkpoint-resume", "cost-arbitrage"])])


@section(60)
def ramps_and_drains(plan: Plan, at: datetime) -> Section:
    ramp_rows, event_rows = [], []
    for ramp in ramps.plan_ramps(plan):
        took = ((ramp.finished_at - ramp.created_at).total_seconds()
                if ramp.finished_at else None)
        ramp_rows.append([str(ramp.pk), ramp.route.name, ramp.pool.name,
                          " → ".join(f"{step['percent']:g}" for step in ramp.steps),
                          ramp.state, when(ramp.created_at), when(ramp.finished_at),
                          "—" if took is None else f"{took:,.0f} s"])
        event_rows += [[when(e.at), str(ramp.pk), e.get_kind_display(),
                        num(e.percent), e.message] for e in ramp.events.all()]
    drain_rows = []
    for drain in traffic.drains_of_pool(pool=plan.candidate_pool, routes=list(plan.routes.all())):
        drain_rows.append([str(drain.pk), when(drain.requested_at), drain.requested_by,
                           drain.reason, drain.status, ms(drain.verified_ms),
                           ms(None if drain.in_flight_zero_at is None else
                              (drain.in_flight_zero_at - drain.requested_at).total_seconds()
                              * 1000), ms(drain.duration_ms)])
    return Section(
        "ramps", "Ramps and drain timings",
        intro="Every ramp of the plan with its steps and events, and every drain that took the "
              "candidate's weight off the plan's routes, timed from the request: every gateway "
              "verified, the last in-flight stream closed, complete.",
        tables=[Table("Ramps", ["Ramp", "Route", "Pool", "Steps %", "State", "Started",
                                "Finished", "Took"], ramp_rows, empty="No ramp yet."),
                Table("Ramp events", ["At", "Ramp", "Event", "Percent", "Message"], event_rows,
                      empty="No ramp events."),
                _evidence_table(plan, "Per-pool SLO at each ramp step", ["ramp-slo"]),
                Table("Drains of the candidate", ["Drain", "Requested", "By", "Reason",
                                                  "Status", "Gateways verified",
                                                  "In-flight zero", "Complete"], drain_rows,
                      empty="No drain of the candidate on the plan's routes yet.")])


@section(70)
def costs(plan: Plan, at: datetime) -> Section:
    live_rows: list[list[str]] = []
    per_success: list[list[str]] = []
    since = at - timedelta(days=LIVE_COST_DAYS)
    for role, pool in (("candidate", plan.candidate_pool), ("primary", plan.primary_pool)):
        live = live_cost(pool=pool.name, since=since, until=at, breakdown=False)
        live_rows.append([f"{pool.name} ({role})", live.hourly_rate + " " + live.currency,
                          num(live.output_tokens), num(live.hours, 2),
                          f"{live.cost} {live.currency}" if live.cost else NOT_MEASURED,
                          f"{live.cost_per_1m} {live.currency}" if live.cost_per_1m
                          else f"{NOT_MEASURED}: {live.not_measured}",
                          f"{live.benchmark_cost_per_1m} {live.currency}"
                          if live.benchmark_cost_per_1m else NOT_MEASURED,
                          "—" if live.utilisation is None else f"{live.utilisation:.0%}"])
        # Cost per successful request from the same read (section "per-success" shows it).
        per_success.append([f"{pool.name} ({role})", num(live.requests),
                            num(live.failed_requests), num(live.retries),
                            "—" if live.error_rate is None else f"{live.error_rate:.1%}",
                            f"{live.cost_per_success} {live.currency}"
                            if live.cost_per_success else live.per_success_not_measured])
    _inputs, case = economics.case_of(plan, now=at)
    n = case.numbers
    c = n.get("comparison") or {}
    figures = [
        ["Verdict", case.verdict_words],
        ["Headline", case.headline],
        [f"{plan.primary_pool.name} per 1M output tokens",
         f"{c['primary_cost_per_1m']} {c.get('primary_currency', '')}"
         if c.get("primary_cost_per_1m") else NOT_MEASURED],
        [f"{plan.candidate_pool.name} per 1M output tokens",
         f"{c['candidate_cost_per_1m']} {c.get('candidate_currency', '')}"
         + (f" = {c['candidate_cost_converted']} {c.get('primary_currency', '')}"
            if c.get("candidate_cost_converted") else "")
         if c.get("candidate_cost_per_1m") else NOT_MEASURED],
        ["Arbitrage per 1M", f"{n['arbitrage_per_1m']} {case.currency}"
         if n.get("arbitrage_per_1m") else NOT_MEASURED],
        ["Expected volume", f"{n['expected_mtokens_per_month']} M output tokens a month"
         if n.get("expected_mtokens_per_month") else "not set"],
        ["Arbitrage per year", f"{n['arbitrage_per_year']} {case.currency}"
         if n.get("arbitrage_per_year") else NOT_MEASURED],
        ["Ops burden per year", f"{n['burden_weeks']} engineer-weeks × "
         f"{n['engineer_cost_per_year']} ÷ {n['working_weeks']} = {n['burden_per_year']} "
         f"{case.currency}" if n.get("burden_per_year") else NOT_MEASURED],
        ["Break-even volume", f"{n['break_even_mtokens_per_month']} M output tokens a month"
         if n.get("break_even_mtokens_per_month") else "—"],
    ]
    burden = [[r["title"], r["weeks"], r["means"]] for r in case.burden_rows]
    notes = [f"{r[:1].upper()}{r[1:]}" for r in case.reasons]
    notes += [f"What would change it: {line}" for line in case.changes]
    return Section(
        "costs", "Costs and the business case",
        intro=f"Live cost over the {LIVE_COST_DAYS} days before this report (tokens the pools "
              f"served × their rate over the same time) beside the benchmark's figure, and the "
              f"business case judged at the report's time. Amounts of the case in "
              f"{case.currency}.",
        tables=[Table("Live cost per pool", ["Pool", "Hourly rate", "Output tokens",
                                             "Hours metered", "Cost", "Live per 1M",
                                             "Benchmark per 1M", "Utilisation"], live_rows),
                Table("Live cost per successful request",
                      ["Pool", "Requests", "Failed", "Retries", "Error rate",
                       "Per successful request"], per_success),
                Table("The business case", ["", ""], figures),
                Table("Ops burden (engineer-weeks a year)", ["Row", "Weeks", "Means"], burden)],
        notes=notes)


@section(75)
def cost_per_success_and_tax(plan: Plan, at: datetime) -> Section:
    """What succeeded for the money in batch work (failures and retries paid for; the live
    figure is in "costs", from the same read as the live cost) and the interruption tax in
    every figure of an interruptible pool (docs/cost.md)."""
    tax_rows = []
    for role, pool in (("candidate", plan.candidate_pool), ("primary", plan.primary_pool)):
        tax = effective_rate(pool)
        tax_rows.append([f"{pool.name} ({role})",
                         "yes" if tax.interruptible else "no",
                         tax.text or "none: not interruptible"])
    job_rows = []
    taxes: dict[int, Any] = {}  # each pool's tax read once, however many jobs ran on it
    for job in batch.plan_soak_jobs(plan.pk):
        job_tax = taxes.get(job.pool_id)
        if job_tax is None:
            job_tax = taxes[job.pool_id] = effective_rate(job.pool)
        tc = batch.job_task_cost(job, batch.job_progress(job, now=at), tax=job_tax)
        job_rows.append([f"job {job.pk}", tc.pool, num(tc.attempts), num(tc.succeeded),
                         num(tc.failed), num(tc.retries),
                         f"{tc.spend} {tc.currency}" if tc.spend else NOT_MEASURED,
                         f"{tc.cost_per_success} {tc.currency}" if tc.cost_per_success
                         else tc.not_measured])
    return Section(
        "per-success", "Cost per successful task and the interruption tax",
        intro=f"Failures and retries are paid for: spend ÷ what succeeded, per batch job of the "
              f"plan's soaks (live traffic's in the costs above). Stage 3's arbitrage is judged "
              f"per {plan.get_cost_unit_display()} (the plan's unit). An interruptible pool's "
              f"rate carries its interruption tax, priced by its own newest passed drill.",
        tables=[Table("Interruption tax", ["Pool", "Interruptible", "Tax"], tax_rows),
                Table("Batch jobs of the plan's soaks: cost per custom_id that succeeded",
                      ["Job", "Pool", "Attempts", "Succeeded", "Failed", "Retries", "Spend",
                       "Per success"], job_rows, empty="The plan has no soak jobs.")])


@section(80)
def approvals(plan: Plan, at: datetime) -> Section:
    rows, seen = [], []
    for approval in sorted(plans.plan_approvals(plan=plan), key=lambda a: (a.at, a.pk)):
        state = ("voided " + when(approval.voided_at) + f": {approval.void_reason}"
                 if approval.voided_at else "used " + when(approval.used_at)
                 if approval.used_at else "standing")
        rows.append([str(approval.pk), f"{approval.stage} ({STAGE_NAMES[approval.stage]})",
                     approval.by.username, when(approval.at), approval.gate_status_label,
                     approval.justification or "—", approval.snapshot_hash, state])
        seen += [[str(approval.pk), e["check_title"] or e["check"], e["check_status"],
                  e["label"] or e["ref"], e["source"]] for e in approval.evidence_seen]
    return Section(
        "approvals", "Approvals and the evidence each saw",
        intro="Every sign-off of every gate, with the sha256 of the evidence snapshot it bound "
              "to (the snapshot is kept on the approval; an auditor recomputes the hash).",
        tables=[Table("Approvals", ["Approval", "Stage", "By", "At", "Gate then",
                                    "Justification", "Evidence sha256", "Now"], rows,
                      empty="No approval yet."),
                Table("Evidence each approval saw", ["Approval", "Check", "Status then",
                                                     "Evidence", "Source"], seen,
                      empty="No evidence bound yet.")])


# Kinds a section above writes down; every other kind goes to "Other evidence".
COVERED_KINDS = {"benchmark", "conformance", "routing-policy", "eval", "shadow", "live-quality",
                 "soak", "checkpoint-resume", "cost-arbitrage", "ramp-slo"}


@section(90)
def other_evidence(plan: Plan, at: datetime) -> Section:
    rows = plans.plan_evidence(plan=plan, other_than=sorted(COVERED_KINDS))
    return Section("other", "Other evidence",
                   intro="Evidence of other kinds about the two pools (reported by other "
                         "systems, or kinds without a section of their own).",
                   tables=[_evidence_table(plan, "Other evidence", None, rows)])


# --- building and rendering ------------------------------------------------------------------

def build(plan: Plan, generated_at: datetime) -> Report:
    sections = [fn(plan, generated_at) for _, fn in SECTIONS]
    report = Report(plan=plan.name, title=f"Migration report: {plan.name}",
                    generated_at=when(generated_at), sections=sections)
    data = report.as_json()
    data.pop("generated_at")
    data.pop("rows_sha256")
    report.rows_sha256 = hashlib.sha256(
        json.dumps(data, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return report


def links(name: str) -> dict[str, str]:
    """The page's links (never in the PDF): back to the plan and its business case, the PDF."""
    return {"plan": reverse("plans:detail", args=[name]),
            "business_case": reverse("economics:business-case", args=[name]),
            "pdf": reverse("economics:report-pdf", args=[name])}


def render_html(report: Report, generated_at: datetime, *, pdf: bool = False,
                links: dict[str, str] | None = None) -> str:
    return render_to_string("economics/report.html", {
        "report": report, "iso_time": generated_at.astimezone(UTC).isoformat(),
        "pdf": pdf, "links": links or {}})


def _weasyprint() -> Any:
    """The WeasyPrint module, or UnavailableError naming what to install (the package
    imports Pango through cffi when imported: a missing library is an OSError then)."""
    packages = " ".join(PDF_SYSTEM_PACKAGES)
    try:
        import weasyprint
    except ImportError as exc:
        raise UnavailableError(f"The PDF cannot be made here: the Python package weasyprint is "
                               f"not installed ({exc}). Install it (pip install weasyprint) "
                               f"and the system packages {packages}; the HTML report at the "
                               f"same address without .pdf works meanwhile.") from exc
    except OSError as exc:
        raise UnavailableError(f"The PDF cannot be made here: WeasyPrint cannot load its system "
                               f"libraries ({exc}). Install {packages} (apt-get install "
                               f"{packages}); the HTML report works meanwhile.") from exc
    return weasyprint


def render_pdf(report: Report, generated_at: datetime) -> bytes:
    """The PDF of the same template with the print stylesheet. Its created/modified dates
    are the generation time (the template's dcterms meta), its /ID the rows hash: nothing
    else varies."""
    weasyprint = _weasyprint()
    html = render_html(report, generated_at, pdf=True)
    stylesheet = finders.find("css/report.css")
    document = weasyprint.HTML(string=html, base_url=None)
    return bytes(document.write_pdf(
        stylesheets=[weasyprint.CSS(filename=stylesheet)] if stylesheet else None,
        pdf_identifier=hashlib.sha256(
            (report.rows_sha256 + report.generated_at).encode()).hexdigest()[:32].encode()))


# A made PDF is kept this long by its rows hash (PDF_CACHE_S; the page links it).
PDF_CACHE_S = 3600


def pdf_download(plan: Plan, at: datetime) -> tuple[bytes, str]:
    """The report's PDF and its file name, made at `at` or, when a PDF of the same rows was
    made within PDF_CACHE_S, that one (it says when it was generated; nothing it writes down
    changed since). Making one takes seconds for a month of history; asking again is a
    build and a cache read."""
    from django.core.cache import cache

    report = build(plan, at)
    key = f"fleetctl:report-pdf:{plan.pk}:{report.rows_sha256}"
    kept = cache.get(key)
    if isinstance(kept, tuple) and len(kept) == 2:
        return kept[0], kept[1]
    body = render_pdf(report, at)
    name = f"migration-report-{plan.name}-{at:%Y%m%dT%H%M%SZ}.pdf"
    cache.set(key, (body, name), PDF_CACHE_S)
    return body, name

