"""The "benchmark" evidence kind and its gate rules, registered with the plans engine.

A finished run records one `Evidence` row of kind "benchmark" per pool (services.py): the
highest SLO-passing concurrency, its output tokens/s, cost per 1M output tokens and the SLO it
was measured against, the hourly rate and currency the cost was computed with, what makes two
runs comparable (the trace's sha256, the SLO, the timing and window, the pools measured
together) and every counted level's latencies. The rules below read the newest still-valid
rows (the engine expires them when the pool's model revision, runtime version, driver label,
or a served model's quantisation or weight format changes).

Comparisons with the primary compare like with like: the latest run that measured both pools,
else the latest pair of runs on the same trace (by content) with the same SLO, timing and
window, said so in the summary; else insufficient data naming what differs. Costs in two
currencies are converted through the dated rates table (`fleet.selectors.convert`) or not
compared at all; a cost whose pool's hourly rate or currency changed since is not compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
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
RUN_HINT = "run both in one run (Benchmarks → New run, both pools)"

_NUMBER = {"type": ["number", "null"]}
_DECIMAL_TEXT = {"type": ["string", "null"], "pattern": r"^-?[0-9]+(\.[0-9]+)?$"}
DATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["run", "best_concurrency", "cost_per_1m", "slo"],
    "properties": {
        "run": {"type": "integer", "minimum": 1},
        "timing": {"enum": ["concurrency", "trace"]},
        "best_concurrency": {"type": ["integer", "null"], "minimum": 1},
        "best_speed": _NUMBER,
        "output_tokens_per_s": _NUMBER,
        "cost_per_1m": _DECIMAL_TEXT,
        "hourly_rate": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "measured_on": {"type": "string", "format": "date",
                        "pattern": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "binding": {"type": ["string", "null"]},
        "slo": {"type": "object", "required": ["ttft_p95_ms", "tpot_p95_ms", "error_rate"],
                "properties": {"ttft_p95_ms": {"type": "number"},
                               "tpot_p95_ms": {"type": "number"},
                               "error_rate": {"type": "number"}}},
        "window_s": {"type": "number"},
        "warmup_s": {"type": "number"},
        "client_bound": {"type": "boolean"},
        "trace": {"type": "string"},
        "trace_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "pools": {"type": "array", "items": {"type": "string"}},
        # How many endpoints the pool had when measured (capacity scales by it).
        "endpoints": {"type": "integer", "minimum": 1},
        "levels": {"type": "array", "items": {
            "type": "object", "required": ["concurrency", "speed", "verdict"],
            "properties": {"concurrency": {"type": ["integer", "null"]},
                           "speed": _NUMBER,
                           "verdict": {"type": "string"},
                           "ttft_p95_ms": _NUMBER, "tpot_p95_ms": _NUMBER,
                           "output_tokens_per_s": _NUMBER}}},
    },
}


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


# --- comparing the candidate with the primary -------------------------------------------------

def _slo_text(slo: dict[str, Any]) -> str:
    return (f"TTFT p95 {slo.get('ttft_p95_ms', '?'):g} ms, TPOT p95 "
            f"{slo.get('tpot_p95_ms', '?'):g} ms, errors {slo.get('error_rate', '?'):g}"
            if all(isinstance(slo.get(k), int | float)
                   for k in ("ttft_p95_ms", "tpot_p95_ms", "error_rate")) else "(unrecorded)")


def _differences(cand: Any, prim: Any, c_name: str, p_name: str) -> list[str]:
    """What makes two benchmark rows not comparable, as phrases; [] when they are."""
    c, p = cand.data, prim.data
    out = []
    if not c.get("trace_sha256") or not p.get("trace_sha256"):
        which = c_name if not c.get("trace_sha256") else p_name
        out.append(f"the trace of {which}'s run #{(c if which == c_name else p).get('run')} "
                   f"was not recorded by content")
    elif c["trace_sha256"] != p["trace_sha256"]:
        same_name = c.get("trace") == p.get("trace")
        out.append(f"{c_name} measured on trace {c.get('trace')}, {p_name} on trace "
                   f"{p.get('trace')}" + (" (same name, different content)" if same_name
                                          else ""))
    if (c.get("slo") or {}) != (p.get("slo") or {}):
        out.append(f"{c_name}'s run used the SLO {_slo_text(c.get('slo') or {})}, "
                   f"{p_name}'s {_slo_text(p.get('slo') or {})}")
    c_timing, p_timing = c.get("timing", "concurrency"), p.get("timing", "concurrency")
    if c_timing != p_timing:
        out.append(f"{c_name} at {c_timing} timing, {p_name} at {p_timing} timing")
    for key, what in (("window_s", "measurement window"), ("warmup_s", "warm-up")):
        if c.get(key) != p.get(key):
            out.append(f"{what} {c.get(key)} s for {c_name}, {p.get(key)} s for {p_name}")
    return out


@dataclass
class Pair:
    """The candidate's and the primary's benchmark rows a comparison reads."""

    cand: Any
    prim: Any

    @property
    def same_run(self) -> bool:
        run = self.cand.data.get("run")
        return run is not None and run == self.prim.data.get("run")

    @property
    def runs(self) -> list[int]:
        return [self.cand.data.get("run"), self.prim.data.get("run")]

    def describe(self) -> str:
        data = self.cand.data
        if self.same_run:
            return f"both measured in run #{data.get('run')}"
        return (f"from runs #{self.cand.data.get('run')} and #{self.prim.data.get('run')}, "
                f"same trace {data.get('trace')} and SLO")

    def numbers(self) -> dict[str, Any]:
        data = self.cand.data
        return {"runs": self.runs, "same_run": self.same_run, "trace": data.get("trace"),
                "trace_sha256": data.get("trace_sha256"), "slo": data.get("slo"),
                "timing": data.get("timing", "concurrency")}


def pair_with_primary(ctx: RuleContext, days: float) -> tuple[Pair | None, CheckResult | None]:
    """The latest run that measured both pools; else the latest comparable pair of runs
    (same trace content, SLO, timing and window); else (None, insufficient data saying what
    differs)."""
    c_name, p_name = ctx.candidate.name, ctx.primary.name
    cands, c_expired = ctx.evidence(KIND, pool=ctx.candidate, within_days=days)
    prims, p_expired = ctx.evidence(KIND, pool=ctx.primary, within_days=days)
    if not cands or not prims:
        whys = []
        for rows, expired, pool in ((cands, c_expired, ctx.candidate),
                                    (prims, p_expired, ctx.primary)):
            if not rows:
                whys.append(f"the latest benchmark of {pool.name} no longer counts: "
                            f"{expired[0][1]}" if expired else
                            f"no benchmark of {pool.name} yet: run one (Benchmarks → New run)")
        return None, CheckResult(INSUFFICIENT, _sentence("; ".join(whys)))
    by_run: dict[Any, Any] = {}
    for row in prims:
        if row.data.get("run") is not None:
            by_run.setdefault(row.data["run"], row)
    for row in cands:
        if row.data.get("run") is not None and row.data["run"] in by_run:
            return Pair(row, by_run[row.data["run"]]), None
    for c in cands:
        for p in prims:
            if not _differences(c, p, c_name, p_name):
                return Pair(c, p), None
    diffs = _differences(cands[0], prims[0], c_name, p_name)
    text = (f"no run measured both {c_name} and {p_name}, and their latest runs "
            f"(#{cands[0].data.get('run')} and #{prims[0].data.get('run')}) are not "
            f"comparable: {'; '.join(diffs)}: {RUN_HINT}")
    return None, CheckResult(INSUFFICIENT, _sentence(text),
                             {"runs": [cands[0].data.get("run"), prims[0].data.get("run")],
                              "differences": diffs},
                             [evidence_ref(cands[0]), evidence_ref(prims[0])])


def _stale(row: Any, pool: Any) -> str | None:
    """Why the cost a benchmark row recorded no longer holds for the pool (its hourly rate or
    currency changed since), or None."""
    from fleetctl.fleet.models import cost_stale_reason

    data = row.data
    source = f"run #{data.get('run')}"
    if data.get("hourly_rate") is not None:
        return cost_stale_reason(cost=data.get("cost_per_1m"), rate_then=data["hourly_rate"],
                                 currency_then=data.get("currency") or pool.currency,
                                 rate_now=pool.node_hourly_rate, currency_now=pool.currency,
                                 source=source)
    if pool.cost_source == source:  # recorded before evidence carried the rate
        return pool.cost_stale_reason
    return None


def _measured_on(row: Any) -> date:
    text = row.data.get("measured_on")
    return date.fromisoformat(text) if text else row.observed_at.date()


def _q(value: Decimal) -> str:
    return str(value.quantize(Decimal("0.0001")))


def cost_vs_primary(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    from fleetctl.fleet.selectors import NoRate, convert

    margin = ctx.plan.cost_margin_pct
    cand_pool, prim_pool = ctx.candidate, ctx.primary
    pair, refused = pair_with_primary(ctx, params["within_days"])
    if pair is None:
        assert refused is not None
        return refused
    cand, prim = pair.cand, pair.prim
    c_cost, p_cost = cand.data.get("cost_per_1m"), prim.data.get("cost_per_1m")
    refs = [evidence_ref(cand), evidence_ref(prim)]
    numbers: dict[str, Any] = pair.numbers()
    if c_cost is None or p_cost is None:
        missing = cand_pool.name if c_cost is None else prim_pool.name
        return CheckResult(FAIL if c_cost is None else INSUFFICIENT,
                           f"{missing}: no level met the SLO, so it has no cost per 1M "
                           f"({pair.describe()}).", numbers, refs)
    stale = [f"{pool.name}: {why}" for row, pool in ((cand, cand_pool), (prim, prim_pool))
             if (why := _stale(row, pool))]
    if stale:
        numbers["stale"] = stale
        return CheckResult(INSUFFICIENT, _sentence("the cost no longer holds: "
                                                   + "; ".join(stale)), numbers, refs)
    taxes = _taxes(ctx, numbers, c_cost, p_cost)
    if isinstance(taxes, CheckResult):
        return CheckResult(taxes.status, taxes.summary, numbers, refs)
    c_cost, p_cost, taxed = taxes
    c_cur = cand.data.get("currency") or cand_pool.currency
    p_cur = prim.data.get("currency") or prim_pool.currency
    numbers.update({"candidate_cost_per_1m": c_cost, "candidate_currency": c_cur,
                    "primary_cost_per_1m": p_cost, "primary_currency": p_cur,
                    "margin_pct": margin})
    compared = Decimal(str(c_cost))
    converted = ""
    if c_cur != p_cur:
        on = min(_measured_on(cand), _measured_on(prim))
        try:
            conversion = convert(amount=compared, from_currency=c_cur, to_currency=p_cur,
                                 on=on, max_age_days=params["max_rate_age_days"])
        except NoRate as exc:
            return CheckResult(INSUFFICIENT, _sentence(
                f"{cand_pool.name} costs {c_cost} {c_cur} and {prim_pool.name} {p_cost} "
                f"{p_cur} per 1M output tokens; two currencies are compared only through a "
                f"dated rate, and there is {exc}"), numbers, refs)
        compared = conversion.amount
        numbers["conversion"] = conversion.as_json()
        numbers["candidate_cost_converted"] = _q(compared)
        converted = f" = {_q(compared)} {p_cur} ({conversion.text})"
    limit = Decimal(str(p_cost)) * (1 + Decimal(str(margin)) / 100)
    numbers["limit"] = _q(limit)
    where = pair.describe()
    if compared > limit:
        return CheckResult(FAIL, f"{cand_pool.name} costs {c_cost} {c_cur}{converted} per 1M "
                                 f"output tokens, over {prim_pool.name}'s {p_cost} {p_cur} + "
                                 f"{margin:g} % ({where}{taxed}).", numbers, refs)
    return CheckResult(PASS, f"{cand_pool.name} {c_cost} {c_cur}{converted} vs "
                             f"{prim_pool.name} {p_cost} {p_cur} per 1M output tokens (limit "
                             f"{numbers['limit']} {p_cur}; {where}{taxed}).", numbers, refs)


def _taxes(ctx: RuleContext, numbers: dict[str, Any], c_cost: Any, p_cost: Any
           ) -> tuple[str, str, str] | CheckResult:
    """Both pools' benchmark costs with their interruption tax (fleet/interruption.py: applied
    when read, at the tax in force now), the bare costs and the taxes in `numbers`, and what to
    say of it; insufficient when an interruptible pool's tax is not measured."""
    from fleetctl.fleet.interruption import effective_rates

    taxes = effective_rates([ctx.candidate, ctx.primary], on=ctx.now)
    cand, prim = taxes[ctx.candidate.name], taxes[ctx.primary.name]
    if not (cand.interruptible or prim.interruptible):
        return c_cost, p_cost, ""
    numbers["interruption"] = {"candidate": cand.as_json(), "primary": prim.as_json()}
    numbers["bare_cost_per_1m"] = {"candidate": c_cost, "primary": p_cost}
    missing = [f"{tax.pool}: {tax.not_measured}" for tax in (cand, prim) if tax.not_measured]
    if missing:
        return CheckResult(INSUFFICIENT, _sentence("the cost is " + "; ".join(missing)), {})
    said = "; ".join(f"{tax.pool} {tax.text}" for tax in (cand, prim) if tax.text)
    return _q(cand.apply(c_cost) or Decimal(0)), _q(prim.apply(p_cost) or Decimal(0)), \
        f"; {said}"


def _shown(value: float, limit: float) -> str:
    """`value` with as many decimals as it takes to compare with `limit` as it really does."""
    for places in range(1, 7):
        text = f"{value:.{places}f}"
        if (float(text) > limit) == (value > limit) and \
                (float(text) == limit) == (value == limit):
            return text
    return repr(value)


def _load(level: dict[str, Any]) -> str:
    return (f"trace speed {level['speed']:g}×" if level.get("speed") is not None
            else f"concurrency {level.get('concurrency')}")


def _load_key(level: dict[str, Any]) -> tuple[float, float]:
    return (float(level.get("concurrency") or 0), float(level.get("speed") or 0))


def latency_vs_primary(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    margin = ctx.plan.latency_margin_pct
    pair, refused = pair_with_primary(ctx, params["within_days"])
    if pair is None:
        assert refused is not None
        return refused
    refs = [evidence_ref(pair.cand), evidence_ref(pair.prim)]
    numbers: dict[str, Any] = pair.numbers() | {"margin_pct": margin}
    where = pair.describe()
    c_name, p_name = ctx.candidate.name, ctx.primary.name
    missing = [name for row, name in ((pair.cand, c_name), (pair.prim, p_name))
               if "levels" not in row.data]
    if missing:
        return CheckResult(INSUFFICIENT, f"The benchmark of {' and '.join(missing)} "
                                         f"({where}) recorded no per-level latencies: re-run "
                                         f"it.", numbers, refs)
    c_levels = {_load_key(lv): lv for lv in pair.cand.data["levels"]}
    p_levels = {_load_key(lv): lv for lv in pair.prim.data["levels"]}
    common = sorted(set(c_levels) & set(p_levels))
    numbers["levels_measured_by_both"] = [_load(c_levels[k]) for k in common]
    both = [k for k in common if c_levels[k].get("verdict") == "pass"
            and p_levels[k].get("verdict") == "pass"
            and c_levels[k].get("ttft_p95_ms") is not None
            and p_levels[k].get("ttft_p95_ms") is not None
            and c_levels[k].get("tpot_p95_ms") is not None
            and p_levels[k].get("tpot_p95_ms") is not None]
    if not both:
        lost = [k for k in common if p_levels[k].get("verdict") == "pass"
                and c_levels[k].get("verdict") == "fail"]
        if lost:
            return CheckResult(FAIL, f"{c_name} failed the SLO at {_load(c_levels[lost[0]])}, "
                                     f"where {p_name} met it ({where}).", numbers, refs)
        measured = ", ".join(numbers["levels_measured_by_both"]) or "none"
        return CheckResult(INSUFFICIENT, f"No level that both {c_name} and {p_name} passed "
                                         f"({where}; both measured: {measured}): run both at "
                                         f"the same levels.", numbers, refs)
    key = both[-1]
    c, p = c_levels[key], p_levels[key]
    factor = 1 + margin / 100
    figures: dict[str, dict[str, Any]] = {}
    over = []
    for metric, label in (("ttft_p95_ms", "TTFT p95"), ("tpot_p95_ms", "TPOT p95")):
        limit = float(p[metric]) * factor
        mine = float(c[metric])
        figures[metric] = {"candidate": mine, "primary": float(p[metric]),
                           "limit": round(limit, 6)}
        text = (f"{label} {_shown(mine, limit)} vs {_shown(float(p[metric]), limit)} ms "
                f"(limit {_shown(limit, mine)})")
        if mine > limit:
            over.append(text)
        figures[metric]["text"] = text
    numbers.update({"level": _load(c), "concurrency": c.get("concurrency"),
                    "speed": c.get("speed"), **figures})
    at = f"at {_load(c)}, the highest level both passed ({where})"
    if over:
        return CheckResult(FAIL, f"{c_name} is slower than {p_name} + {margin:g} % {at}: "
                                 f"{'; '.join(over)}.", numbers, refs)
    return CheckResult(PASS, f"{c_name} within {p_name} + {margin:g} % {at}: "
                             f"{figures['ttft_p95_ms']['text']}, "
                             f"{figures['tpot_p95_ms']['text']}.", numbers, refs)


# --- the same figures on another day ---------------------------------------------------------

def _comparable(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Why two benchmark rows of one pool do not measure the same thing, or None."""
    for key, what in (("timing", "timing"), ("slo", "SLO"), ("window_s", "window"),
                      ("trace_sha256", "trace")):
        if a.get(key) != b.get(key):
            return f"a different {what}"
    return None


def repeated(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    """The candidate's newest benchmark and an earlier one at least `min_gap_hours` before it,
    on the same trace, SLO, timing and window, agree: the same highest SLO-passing level, and
    output tokens/s there within `tolerance_pct` of each other. One good day is a sample; the
    same figures on another day are a measurement."""
    gap_h, tolerance = params["min_gap_hours"], params["tolerance_pct"]
    valid, _ = ctx.evidence(KIND, pool=ctx.candidate, within_days=params["within_days"])
    numbers: dict[str, Any] = {"min_gap_hours": gap_h, "tolerance_pct": tolerance}
    if not valid:
        _, why = _latest(ctx, ctx.candidate, params["within_days"])
        return CheckResult(INSUFFICIENT, _sentence(why or ""), numbers)
    newest = valid[0]
    earlier = [row for row in valid[1:]
               if (newest.observed_at - row.observed_at).total_seconds() >= gap_h * 3600
               and _comparable(newest.data, row.data) is None]
    if not earlier:
        due = newest.observed_at + timedelta(hours=gap_h)
        return CheckResult(INSUFFICIENT, f"One day's benchmark of {ctx.candidate.name} (run "
                                         f"{newest.data.get('run')}): repeat it on the same "
                                         f"trace and SLO at least {gap_h:g} h later (from "
                                         f"{due:%Y-%m-%d %H:%M} UTC).", numbers,
                           [evidence_ref(newest)])
    first = earlier[0]
    refs = [evidence_ref(newest), evidence_ref(first)]
    a, b = first.data, newest.data
    hours = (newest.observed_at - first.observed_at).total_seconds() / 3600
    speeds = [x.get("output_tokens_per_s") for x in (a, b)]
    numbers.update({"runs": [a.get("run"), b.get("run")], "hours_apart": round(hours, 1),
                    "best_concurrency": [a.get("best_concurrency"), b.get("best_concurrency")],
                    "output_tokens_per_s": speeds})
    where = f"runs {a.get('run')} and {b.get('run')}, {hours:.1f} h apart"
    if a.get("best_concurrency") != b.get("best_concurrency") or None in speeds:
        return CheckResult(FAIL, f"The repeat disagrees ({where}): the highest level meeting "
                                 f"the SLO was {a.get('best_concurrency')} then "
                                 f"{b.get('best_concurrency')}.", numbers, refs)
    low, high = sorted(float(x) for x in speeds)  # type: ignore[arg-type]
    spread = 100.0 * (high - low) / high if high else 0.0
    numbers["spread_pct"] = round(spread, 2)
    if spread > tolerance:
        return CheckResult(FAIL, f"The repeat disagrees ({where}): {low:,.0f} vs {high:,.0f} "
                                 f"output tokens/s at concurrency {b.get('best_concurrency')}, "
                                 f"{spread:.1f} % apart (tolerance {tolerance:g} %).",
                           numbers, refs)
    return CheckResult(PASS, f"Repeated ({where}): concurrency {b.get('best_concurrency')} "
                             f"both times, output tokens/s {spread:.1f} % apart (tolerance "
                             f"{tolerance:g} %).", numbers, refs)


def register() -> None:
    register_kind(EvidenceKind(KIND, "benchmark sweep", "benchmark runs (fleetctl bench)",
                               data_schema=DATA_SCHEMA))
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
        "the primary's times (1 + the plan's cost margin), measured in one run (or runs on "
        "the same trace with the same SLO and timing); two currencies are converted through "
        "a dated rate no older than the limit, or not compared.",
        {"within_days": Param(float, 30.0, "oldest acceptable run, days", 0.01, 365),
         "max_rate_age_days": Param(float, 31.0, "oldest acceptable exchange rate, days "
                                                 "before the measurement", 0, 3650)},
        cost_vs_primary))
    register_rule(Rule(
        "benchmark.latency_vs_primary", KIND, "TTFT and TPOT p95 ≤ primary × (1 + latency margin)",
        "At the highest concurrency both pools passed, in one run (or runs on the same trace "
        "with the same SLO and timing), the candidate's TTFT p95 and TPOT p95 are at most the "
        "primary's times (1 + the plan's latency margin).",
        {"within_days": Param(float, 30.0, "oldest acceptable run, days", 0.01, 365)},
        latency_vs_primary))
    register_rule(Rule(
        "benchmark.repeated", KIND, "Benchmark repeated ≥ {min_gap_hours:g} h apart, within "
        "{tolerance_pct:g} %",
        "The candidate's newest benchmark and an earlier one at least the gap before it, on "
        "the same trace, SLO, timing and window, found the same highest SLO-passing "
        "concurrency and output tokens/s there within the tolerance.",
        {"min_gap_hours": Param(float, 24.0, "least time between the two runs, hours", 0.01,
                                24 * 365),
         "tolerance_pct": Param(float, 10.0, "most the two throughputs may differ, %", 0.1,
                                100),
         "within_days": Param(float, 30.0, "oldest acceptable run, days", 0.01, 365)},
        repeated))
