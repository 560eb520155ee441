"""The evidence registry and the gate engine.

An *evidence kind* is a name ("benchmark", "drain-rehearsal", …) with a label and a line on
what produces it. A *rule* belongs to a kind: it reads evidence (rows of `Evidence`, or the
records another app keeps, like drains or health transitions) and answers one of
pass / warn / fail / insufficient data, with the numbers it used and references to the
evidence. An app that produces evidence adds its kinds and rules with `register_kind` /
`register_rule` (the bench app does, for benchmark runs); the engine below never changes for
them.

A check's *evidence references* are what an approval binds to: each names a row and a
`version` that changes whenever what the row says changes. The snapshot hash covers the
plan's terms, every check's definition, status and references — not the live numbers (a pool
healthy for 30 h or for 31 h is the same evidence).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.utils import timezone

from migrations_plan.evidence_registry import (
    ATTESTED,
    AWAITING,
    BLOCKED_LABEL,
    BLOCKING,
    EMPTY_DATA_SCHEMA,
    EXTERNAL,
    FAIL,
    GATE_STATUSES,
    INSUFFICIENT,
    KINDS,
    LEGACY_STATUSES,
    MEASURED,
    ORIGINS,
    PASS,
    PENDING,
    REPORTED,
    RULES,
    STATUS_LABELS,
    STATUS_MEANINGS,
    STATUSES,
    WARN,
    CheckResult,
    EvidenceKind,
    EvidenceRef,
    Param,
    Rule,
    blocks_advance,
    data_problems,
    gate_status,
    normalise_status,
    register_kind,
    register_rule,
    source_label,
    status_label,
)

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Route
    from migrations_plan.models import Evidence, GateCheck, Plan

# The vocabulary and registry live in evidence_registry.py; callers read them from here.
__all__ = ["ANY_OBJECT", "ATTESTED", "AWAITING", "BLOCKED_LABEL", "BLOCKING", "EMPTY_DATA_SCHEMA",
           "EXTERNAL", "FAIL", "FINGERPRINT_LABELS", "GATE_STATUSES", "INSUFFICIENT", "KINDS",
           "LEGACY_STATUSES", "MEASURED", "ORIGINS", "PASS", "PENDING", "REPORTED", "RULES",
           "STATUSES", "STATUS_LABELS", "STATUS_MEANINGS", "WARN", "CheckOutcome", "CheckResult",
           "EvidenceKind", "EvidenceRef", "GateEvaluation", "Param", "Rule", "RuleContext",
           "blocks_advance", "data_problems", "data_schema", "duration_of", "evaluate_check",
           "evaluate_gate", "evidence_ref", "fingerprint_change",
           "fingerprint_changes", "gate_status", "honest",
           "normalise_status", "plan_terms", "pool_fingerprint", "register_kind", "register_rule",
           "reports_about", "snapshot_difference", "snapshot_hash", "source_label", "status_label"]


# --- what an evidence row carries in `data` ---------------------------------------------------

# A JSON object of any content (a sub-record of a row's `data`).
ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}


def data_schema(properties: dict[str, Any]) -> dict[str, Any]:
    """An evidence kind's `data_schema`: an object of these fields and no others. None is
    required, so rows written before their producer recorded data (with none) still read."""
    return {"type": "object", "additionalProperties": False, "properties": properties}


# --- figures shown against a limit ----------------------------------------------------------

def honest(value: float, limit: float, decimals: int = 1) -> str:
    """`value` written so that, read against `limit`, it compares as the real value does:
    rounded down (never more than it is), with as many decimals as keeping the comparison
    takes. "0.1 h of the 0.1 h required" is never shown while the requirement is unmet."""
    for places in range(decimals, 10):
        scale = 10 ** places
        shown = (math.floor(value * scale + 1e-9) if value != limit
                 else round(value * scale)) / scale
        if (shown < limit) == (value < limit) and (shown > limit) == (value > limit):
            return f"{shown:.{places}f}"
    return repr(value)


def duration_of(have_h: float, need_h: float) -> tuple[str, str]:
    """ "have" and "need" hours as shown side by side: minutes under two hours, else hours."""
    if need_h < 2:
        have_min, need_min = have_h * 60, need_h * 60
        return f"{honest(have_min, need_min, 0 if need_min >= 10 else 1)} min", f"{need_min:g} min"
    return f"{honest(have_h, need_h)} h", f"{need_h:g} h"


# --- what a pool "was" when evidence was measured ---------------------------------------------

FINGERPRINT_LABELS = {"model_revision": "model revision", "runtime_version": "runtime version",
                      "driver": "driver label", "quantisation": "quantisation",
                      "weight_format": "weight format",
                      "server_version": "server version (as the pool reports it)",
                      "served_revision": "weights revision (as the pool reports it)"}
# Fingerprint fields the pool's servers report of themselves (fleet/probe.py): one recorded
# before the probe had read it (empty) is unknown, not a change.
REPORTED_FIELDS = ("server_version", "served_revision")


def pool_fingerprint(pool: Pool, model_ids: list[str]) -> dict[str, str]:
    """Evidence measured on a pool stays valid while these stay the same."""
    from fleetctl.fleet.models import PoolModel

    served = {m: (revision, quantisation, weight_format)
              for m, revision, quantisation, weight_format in
              PoolModel.objects.filter(pool=pool, model_id__in=model_ids)
              .values_list("model_id", "revision", "quantisation", "weight_format")}
    models = sorted(model_ids)
    one = len(models) == 1

    def each(index: int) -> str:
        values = [served.get(m, ("", "", ""))[index] for m in models]
        return values[0] if one else ",".join(f"{m}={v}" for m, v in zip(models, values,
                                                                           strict=True))

    return {
        "model_revision": ",".join(f"{m}@{served.get(m, ('',))[0]}" for m in models),
        "runtime_version": pool.runtime_version,
        "driver": str((pool.labels or {}).get("driver", "")),
        "quantisation": each(1),
        "weight_format": each(2),
        "server_version": str((pool.reported or {}).get("server_version") or ""),
        # The weights revision each model's card reports (fleet/probe.py), "" until it does.
        "served_revision": _served_revision(pool, models),
    }


def _served_revision(pool: Pool, models: list[str]) -> str:
    served = (pool.reported or {}).get("model_revision") or {}
    if not isinstance(served, dict) or not any(served.get(m) for m in models):
        return ""
    return ",".join(f"{m}@{served.get(m) or ''}" for m in models)


def fingerprint_changes(then: dict[str, Any], now: dict[str, str]) -> list[tuple[str, str, str]]:
    """What of a pool measured at `then` differs `now`: (label, was, is) per field."""
    changes = []
    for key, label in FINGERPRINT_LABELS.items():
        if key in REPORTED_FIELDS and not then.get(key):
            continue  # measured before the pool reported it: not known to have changed
        if key in then and then.get(key) != now.get(key):
            changes.append((label, str(then.get(key) or ""), str(now.get(key) or "")))
    return changes


def fingerprint_change(then: dict[str, Any], now: dict[str, str]) -> str | None:
    """Why evidence measured at `then` no longer describes the pool, or None."""
    for label, was, is_ in fingerprint_changes(then, now)[:1]:
        return f"{label} changed from {was or '(none)'} to {is_ or '(none)'}"
    return None


# --- the context a rule reads -----------------------------------------------------------------

@dataclass
class RuleContext:
    plan: Plan
    candidate: Pool
    primary: Pool
    routes: list[Route]
    now: datetime
    # Read once per evaluation: fingerprints per pool, external reports per pool.
    cache: dict[Any, Any] = field(default_factory=dict)

    @property
    def model_ids(self) -> list[str]:
        return sorted({route.model_id for route in self.routes})

    def fingerprint(self, pool: Pool | None = None) -> dict[str, str]:
        pool = pool or self.candidate
        key = ("fingerprint", pool.pk)
        if key not in self.cache:
            self.cache[key] = pool_fingerprint(pool, self.model_ids)
        return dict(self.cache[key])

    def evidence(self, kind: str, *, pool: Pool | None = None, within_days: float | None = None
                 ) -> tuple[list[Evidence], list[tuple[Evidence, str]]]:
        """Rows of one kind about a pool, newest first: (still valid, [(expired, why)])."""
        from datetime import timedelta

        from migrations_plan.models import Evidence

        pool = pool or self.candidate
        rows = Evidence.objects.filter(kind=kind, pool=pool)
        if self.model_ids:
            rows = rows.filter(model_id__in=[*self.model_ids, ""])
        current = self.fingerprint(pool)
        valid: list[Evidence] = []
        expired: list[tuple[Evidence, str]] = []
        for row in rows.order_by("-observed_at", "-id")[:50]:
            if row.expires_at is not None and row.expires_at <= self.now:
                expired.append((row, f"expired at {row.expires_at:%Y-%m-%d %H:%M} UTC"))
                continue
            if within_days is not None and row.observed_at < self.now - timedelta(days=within_days):
                expired.append((row, f"older than {within_days:g} days"))
                continue
            change = fingerprint_change(row.pool_fingerprint, current)
            if change:
                expired.append((row, change))
                continue
            valid.append(row)
        return valid, expired


def evidence_ref(row: Evidence) -> EvidenceRef:
    external = row.kind == EXTERNAL
    return EvidenceRef(kind=row.kind, ref=f"evidence:{row.pk}", label=row.summary,
                       version=f"{row.pk}:{row.verdict}", url=row.url or "",
                       observed_at=row.observed_at, expires_at=row.expires_at,
                       origin=REPORTED if external else MEASURED,
                       source=row.reported_by if external else row.source,
                       source_url=row.url or "", judgement=judgement_of(row))


def judgement_of(row: Evidence) -> str:
    """What a row of a `refreshed` kind judges, as one string: kind, job (source), route,
    model, verdict and a digest of the fingerprints it was measured on (the pool's, and the
    `fingerprints` its data names: a shadow run's primary and candidate). Two rows with the
    same string are one judgement, the later with more samples. "" for other kinds."""
    kind = KINDS.get(row.kind)
    if kind is None or not kind.refreshed or not row.source:
        return ""
    prints = {"pool": row.pool_fingerprint or {},
              "data": (row.data or {}).get("fingerprints") if isinstance(row.data, dict)
              else None}
    digest = hashlib.sha256(json.dumps(prints, sort_keys=True, default=str).encode())
    return (f"{row.kind}|{row.source}|route:{row.route_id or ''}|{row.model_id}|"
            f"{row.verdict}|{digest.hexdigest()[:16]}")


def reports_about(ctx: RuleContext, kind: str, *, pool: Pool | None = None) -> list[Evidence]:
    """External reports about `kind` on a pool, newest first, still current (not expired, the
    pool unchanged since)."""
    from migrations_plan.models import Evidence

    pool = pool or ctx.candidate
    key = ("reports", pool.pk)
    if key not in ctx.cache:
        rows = Evidence.objects.filter(kind=EXTERNAL, pool=pool)
        if ctx.model_ids:
            rows = rows.filter(model_id__in=[*ctx.model_ids, ""])
        current = ctx.fingerprint(pool)
        ctx.cache[key] = [row for row in rows.order_by("-observed_at", "-id")[:200]
                          if (row.expires_at is None or row.expires_at > ctx.now)
                          and fingerprint_change(row.pool_fingerprint, current) is None]
    return [row for row in ctx.cache[key] if row.about == kind]


def _with_reports(result: CheckResult, rule: Rule, params: dict[str, Any],
                  ctx: RuleContext) -> CheckResult:
    """A check over a measured kind with no measured evidence that counts: what other systems
    reported about it is shown (and bound), but it stays insufficient data — an approver sees
    it and must justify."""
    kind = KINDS.get(str(params.get("kind", rule.kind)))
    if result.status != INSUFFICIENT or kind is None or not kind.measured:
        return result
    reports = reports_about(ctx, kind.name)
    if not reports:
        return result
    latest = reports[0]
    said = (f"reported by {latest.reported_by}: {latest.verdict} — not measured by fleetctl"
            f" ({latest.summary})")
    return CheckResult(INSUFFICIENT, f"{result.summary} {said[:1].upper()}{said[1:]}.",
                       {**result.numbers, "reported": {"by": latest.reported_by,
                                                       "verdict": latest.verdict}},
                       [*result.evidence, evidence_ref(latest)])


# --- evaluating a gate ------------------------------------------------------------------------

@dataclass
class CheckOutcome:
    check: GateCheck
    result: CheckResult

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def blocking(self) -> bool:
        return self.result.status in BLOCKING


@dataclass
class GateEvaluation:
    plan: Plan
    stage: int
    outcomes: list[CheckOutcome]
    at: datetime

    @property
    def status(self) -> str:
        return gate_status(o.status for o in self.outcomes)

    @property
    def blocks_advance(self) -> bool:
        return blocks_advance(self.status)

    @property
    def blockers(self) -> list[CheckOutcome]:
        return [o for o in self.outcomes if o.blocking]

    @property
    def needs_justification(self) -> list[CheckOutcome]:
        return [o for o in self.outcomes if o.status in (WARN, INSUFFICIENT)]

    @property
    def passed(self) -> int:
        return sum(1 for o in self.outcomes if o.status == PASS)

    def snapshot(self) -> dict[str, Any]:
        """What an approval binds to (stored whole; `bound` is the hashed part)."""
        return {
            "stage": self.stage,
            "evaluated_at": self.at.isoformat(),
            "status": self.status,
            "terms": plan_terms(self.plan),
            "checks": [
                {"id": o.check.pk, "key": o.check.key, "title": o.check.title,
                 "kind": o.check.kind, "rule": o.check.rule, "params": o.check.params,
                 "status": o.status, "summary": o.result.summary,
                 "numbers": o.result.numbers,
                 "evidence": [ref.as_json() for ref in o.result.evidence]}
                for o in self.outcomes
            ],
        }

    def hash(self) -> str:
        return snapshot_hash(self.snapshot())


def plan_terms(plan: Plan) -> dict[str, Any]:
    from migrations_plan.models import CostUnit

    return {
        "candidate": plan.candidate_pool_id, "primary": plan.primary_pool_id,
        "slo_ttft_p95_ms": plan.slo_ttft_p95_ms, "slo_tpot_p95_ms": plan.slo_tpot_p95_ms,
        "slo_error_rate": plan.slo_error_rate, "latency_margin_pct": plan.latency_margin_pct,
        "cost_margin_pct": plan.cost_margin_pct, "quality_margin_pct": plan.quality_margin_pct,
        # The arbitrage's unit is a term too, named only when it is not the default, so the
        # approvals given before plans had a unit still bind to the same terms.
        **({"cost_unit": plan.cost_unit}
           if plan.cost_unit != CostUnit.PER_1M_OUTPUT_TOKENS else {}),
    }


def _bound_ref(ref: dict[str, Any]) -> str:
    """What of one evidence ref an approval binds to: its judgement when it has one (a
    refreshed kind: a newer row of the same judgement binds alike), else the row and its
    version."""
    judgement = ref.get("judgement")
    return f"judgement:{judgement}" if judgement else f"{ref['ref']}@{ref['version']}"


def _bound(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {
        "stage": snapshot["stage"],
        "terms": snapshot["terms"],
        "checks": [
            {"key": c["key"], "rule": c["rule"], "params": c["params"],
             "status": normalise_status(c["status"]),
             "evidence": sorted(_bound_ref(e) for e in c["evidence"])}
            for c in snapshot["checks"]
        ],
    }


def snapshot_hash(snapshot: dict[str, Any]) -> str:
    canonical = json.dumps(_bound(snapshot), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def snapshot_difference(old: dict[str, Any], new: dict[str, Any], now: datetime) -> str | None:
    """Why an approval that saw `old` no longer holds when the gate now looks like `new`.

    Evidence of a refreshed kind (a running shadow run's) binds by its judgement: the
    approval holds while the check's status is the same and its evidence is the same
    judgement — same job, route, model, verdict and fingerprints — with only more samples,
    the newer row not expired. It goes stale when the status changes, the evidence expires,
    or the evidence is another job's or was measured on other fingerprints."""
    current = {_bound_ref(ref): ref for check in new["checks"] for ref in check["evidence"]
               if ref.get("judgement")}
    for check in old["checks"]:
        for ref in check["evidence"]:
            # A judgement still current is judged by its newest row's expiry.
            ref = current.get(_bound_ref(ref), ref) if ref.get("judgement") else ref
            expires = ref.get("expires_at")
            if expires and datetime.fromisoformat(expires) <= now:
                return f"evidence {ref['label']!r} of check {check['title']!r} expired at {expires}"
    if old["terms"] != new["terms"]:
        changed = sorted(k for k in old["terms"] if old["terms"][k] != new["terms"].get(k))
        return f"the plan's terms changed ({', '.join(changed)})"
    before = {c["key"]: c for c in _bound(old)["checks"]}
    after = {c["key"]: c for c in _bound(new)["checks"]}
    titles = {c["key"]: c["title"] for c in [*old["checks"], *new["checks"]]}
    for key in sorted(set(before) - set(after)):
        return f"check {titles[key]!r} was removed from the gate"
    for key in sorted(set(after) - set(before)):
        return f"check {titles[key]!r} was added to the gate"
    for key in sorted(before):
        was, now_ = before[key], after[key]
        if was["params"] != now_["params"]:
            return f"the thresholds of check {titles[key]!r} changed"
        if was["status"] != now_["status"]:
            return (f"check {titles[key]!r} went from {status_label(was['status'])} to "
                    f"{status_label(now_['status'])}")
        if was["evidence"] != now_["evidence"]:
            refreshed = any(e.startswith("judgement:") for e in was["evidence"])
            return (f"the evidence behind check {titles[key]!r} changed"
                    + (" (another run or job, or measured on other fingerprints)"
                       if refreshed else ""))
    if _bound(old) != _bound(new):
        return "the gate changed"
    return None


def evaluate_check(check: GateCheck, ctx: RuleContext) -> CheckResult:
    from migrations_plan.models import GateCheck

    if check.kind == GateCheck.Kind.ATTESTED:
        return _evaluate_attested(check)
    rule = RULES.get(check.rule)
    if rule is None:
        return CheckResult(FAIL, f"Unknown rule {check.rule!r}: nothing can evaluate this "
                                 f"check. Remove it or fix its rule.")
    try:
        params = rule.clean_params(check.params)
    except ValidationError as exc:
        return CheckResult(FAIL, f"Invalid parameters: {'; '.join(exc.messages)}")
    return _with_reports(rule.evaluate(ctx, params), rule, params, ctx)


def _evaluate_attested(check: GateCheck) -> CheckResult:
    attestation = next((a for a in check.attestations.all() if a.withdrawn_at is None), None)
    if attestation is None:
        return CheckResult(AWAITING, f"Awaiting attestation by a {check.attest_role}.")
    who = attestation.by.get_username()
    return CheckResult(
        PASS, f"Attested by {who} ({attestation.role}): {attestation.note}",
        numbers={"attested_by": who, "attested_at": attestation.at.isoformat()},
        evidence=[EvidenceRef(kind="attestation", ref=f"attestation:{attestation.pk}",
                              label=attestation.note[:80],
                              version=str(attestation.pk), observed_at=attestation.at,
                              origin=ATTESTED, source=who)],
    )


def evaluate_gate(plan: Plan, *, stage: int | None = None, now: datetime | None = None
                  ) -> GateEvaluation:
    """Every live check of one stage (default: the plan's current one), evaluated now."""
    stage = stage or plan.stage
    now = now or timezone.now()
    checks = list(plan.checks.filter(stage=stage, removed_at__isnull=True)
                  .prefetch_related("attestations__by").order_by("position", "id"))
    ctx = RuleContext(plan=plan, candidate=plan.candidate_pool, primary=plan.primary_pool,
                      routes=list(plan.routes.select_related("primary_pool").order_by("name")),
                      now=now)
    outcomes = [CheckOutcome(check=c, result=evaluate_check(c, ctx)) for c in checks]
    return GateEvaluation(plan=plan, stage=stage, outcomes=outcomes, at=now)
