"""The "benchmark" evidence kind and its gate rules, registered with the plans engine.

A finished run records one `Evidence` row of kind "benchmark" per pool (services.py): the
highest SLO-passing concurrency, its output tokens/s, cost per 1M output tokens and the SLO it
was measured against. The rules below read the newest still-valid row (the engine expires it
when the pool's model revision, runtime version or driver label changes)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from migrations_plan.evidence import (
    FAIL,
    INSUFFICIENT,
    PASS,
    CheckResult,
    EvidenceKind,
    Param,
    Rule,
    RuleContext,
    evidence_ref,
    register_kind,
    register_rule,
)

KIND = "benchmark"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _latest(ctx: RuleContext, pool: Any, days: float) -> tuple[Any, str | None]:
    valid, expired = ctx.evidence(KIND, pool=pool, within_days=days)
    if valid:
        return valid[0], None
    if expired:
        return None, f"the latest benchmark of {pool.name} no longer counts: {expired[0][1]}"
    return None, f"no benchmark of {pool.name} yet: run one (Benchmarks → New run)"


def _slo_looser(data: dict[str, Any], ctx: RuleContext) -> str | None:
    slo = data.get("slo") or {}
    plan = ctx.plan
    looser = [name for name, mine in (("ttft_p95_ms", plan.slo_ttft_p95_ms),
                                      ("tpot_p95_ms", plan.slo_tpot_p95_ms),
                                      ("error_rate", plan.slo_error_rate))
              if slo.get(name) is None or float(slo[name]) > mine]
    if looser:
        return (f"the benchmark's SLO is looser than the plan's on {', '.join(looser)} "
                f"(run it with the plan's SLO)")
    return None


def meets_slo(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    row, why = _latest(ctx, ctx.candidate, params["within_days"])
    if row is None:
        return CheckResult(INSUFFICIENT, _sentence(why or ""))
    data = row.data
    if data.get("timing") == "trace":
        return CheckResult(INSUFFICIENT, _sentence(
            f"the latest benchmark of {ctx.candidate.name} was measured at trace timing; the "
            f"rule needs a concurrency sweep"), {"run": data.get("run"),
                                                 "best_speed": data.get("best_speed")},
            [evidence_ref(row)])
    looser = _slo_looser(data, ctx)
    best = data.get("best_concurrency")
    numbers = {"best_concurrency": best, "required": params["min_concurrency"],
               "output_tokens_per_s": data.get("output_tokens_per_s"),
               "binding": data.get("binding"), "run": data.get("run")}
    if looser:
        return CheckResult(INSUFFICIENT, _sentence(looser), numbers,
                           [evidence_ref(row)])
    if best is None:
        return CheckResult(FAIL, f"No level met the SLO ({row.summary}).", numbers,
                           [evidence_ref(row)])
    if best < params["min_concurrency"]:
        return CheckResult(FAIL, f"Meets the SLO up to concurrency {best}, below the "
                                 f"{params['min_concurrency']:g} required.", numbers,
                           [evidence_ref(row)])
    return CheckResult(PASS, f"Meets the SLO at concurrency {best} (≥ "
                             f"{params['min_concurrency']:g}): {row.summary}", numbers,
                       [evidence_ref(row)])


def cost_vs_primary(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    margin = ctx.plan.cost_margin_pct
    cand, why_c = _latest(ctx, ctx.candidate, params["within_days"])
    prim, why_p = _latest(ctx, ctx.primary, params["within_days"])
    if cand is None or prim is None:
        return CheckResult(INSUFFICIENT, _sentence("; ".join(w for w in (why_c, why_p) if w)))
    c_cost, p_cost = cand.data.get("cost_per_1m"), prim.data.get("cost_per_1m")
    refs = [evidence_ref(cand), evidence_ref(prim)]
    if c_cost is None or p_cost is None:
        missing = ctx.candidate.name if c_cost is None else ctx.primary.name
        return CheckResult(FAIL if c_cost is None else INSUFFICIENT,
                           f"{missing}: no level met the SLO, so it has no cost per 1M.",
                           {}, refs)
    limit = Decimal(str(p_cost)) * (1 + Decimal(str(margin)) / 100)
    numbers = {"candidate_cost_per_1m": c_cost, "primary_cost_per_1m": p_cost,
               "margin_pct": margin, "limit": str(limit.quantize(Decimal("0.0001")))}
    if Decimal(str(c_cost)) > limit:
        return CheckResult(FAIL, f"{ctx.candidate.name} costs {c_cost} per 1M output tokens, "
                                 f"over {ctx.primary.name}'s {p_cost} + {margin:g} %.",
                           numbers, refs)
    return CheckResult(PASS, f"{ctx.candidate.name} {c_cost} vs {ctx.primary.name} {p_cost} "
                             f"per 1M output tokens (limit {numbers['limit']}).", numbers, refs)


def register() -> None:
    register_kind(EvidenceKind(KIND, "benchmark sweep", "benchmark runs (fleetctl bench)"))
    register_rule(Rule(
        "benchmark.meets_slo", KIND, "Benchmark meets the SLO at concurrency ≥ {min_concurrency:g}",
        "The candidate's latest benchmark, run with an SLO at least as strict as the plan's, "
        "found a passing level at or above the concurrency required.",
        {"min_concurrency": Param(float, 8.0, "lowest useful concurrency", 1, 4096),
         "within_days": Param(float, 30.0, "oldest acceptable run, days", 0.01, 365)},
        meets_slo))
    register_rule(Rule(
        "benchmark.cost_vs_primary", KIND, "Cost per 1M ≤ primary × (1 + cost margin)",
        "The candidate's cost per 1M output tokens at its highest SLO-passing level is at most "
        "the primary's times (1 + the plan's cost margin).",
        {"within_days": Param(float, 30.0, "oldest acceptable run, days", 0.01, 365)},
        cost_vs_primary))
