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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.utils import timezone

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Route
    from migrations_plan.models import Evidence, GateCheck, Plan

PASS = "pass"
WARN = "warn"
INSUFFICIENT = "insufficient"
PENDING = "pending"  # an attested check nobody has attested yet: blocks like a failure
FAIL = "fail"
STATUSES = (PASS, WARN, INSUFFICIENT, PENDING, FAIL)
BLOCKING = frozenset({FAIL, PENDING})
STATUS_LABELS = {PASS: "pass", WARN: "warn", INSUFFICIENT: "insufficient data",
                 PENDING: "awaiting attestation", FAIL: "fail"}


@dataclass(frozen=True)
class EvidenceRef:
    """One piece of evidence a check used. `version` changes whenever what it says changes."""

    kind: str
    ref: str  # e.g. "drain:12", "evidence:40", "attestation:3"
    label: str
    version: str
    url: str = ""
    observed_at: datetime | None = None
    expires_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ref": self.ref, "label": self.label, "version": self.version,
                "url": self.url,
                "observed_at": self.observed_at.isoformat() if self.observed_at else None,
                "expires_at": self.expires_at.isoformat() if self.expires_at else None}


@dataclass
class CheckResult:
    status: str
    summary: str
    numbers: dict[str, Any] = field(default_factory=dict)
    evidence: list[EvidenceRef] = field(default_factory=list)


@dataclass(frozen=True)
class Param:
    type: type  # float, int or str
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    choices: Callable[[], list[str]] | None = None


@dataclass(frozen=True)
class EvidenceKind:
    name: str
    label: str
    produced_by: str  # what produces it; "" when nothing in this version does


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str
    label: str  # a sentence with {param} placeholders, e.g. "healthy for {hours} h"
    description: str
    params: dict[str, Param]
    evaluate: Callable[[RuleContext, dict[str, Any]], CheckResult]

    def clean_params(self, raw: Any) -> dict[str, Any]:
        """Defaults filled in, types and ranges checked; errors name the parameter."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ValidationError({"params": ["Parameters are an object, e.g. {\"hours\": 24}."]})
        unknown = sorted(set(raw) - set(self.params))
        if unknown:
            known = ", ".join(sorted(self.params)) or "none"
            raise ValidationError({"params": [
                f"Rule {self.name} has no parameter {', '.join(unknown)} (it takes: {known})."]})
        clean: dict[str, Any] = {}
        for name, spec in self.params.items():
            value = raw.get(name, spec.default)
            try:
                if spec.type is str:
                    if not isinstance(value, str) or not value.strip():
                        raise ValueError
                    value = value.strip()
                else:
                    if isinstance(value, bool):
                        raise ValueError
                    value = spec.type(value)
            except (TypeError, ValueError):
                raise ValidationError({"params": [
                    f"{name}: expected {spec.type.__name__}, got {value!r}."]}) from None
            if spec.min is not None and value < spec.min:
                raise ValidationError({"params": [f"{name}: at least {spec.min:g}."]})
            if spec.max is not None and value > spec.max:
                raise ValidationError({"params": [f"{name}: at most {spec.max:g}."]})
            if spec.choices is not None and value not in spec.choices():
                raise ValidationError({"params": [
                    f"{name}: {value!r} is not one of {', '.join(spec.choices())}."]})
            clean[name] = value
        return clean

    def title(self, params: dict[str, Any]) -> str:
        try:
            return self.label.format(**params)
        except (KeyError, IndexError, ValueError):
            return self.label


KINDS: dict[str, EvidenceKind] = {}
RULES: dict[str, Rule] = {}


def register_kind(kind: EvidenceKind) -> EvidenceKind:
    """Register (or replace) a kind. A placeholder (nothing produces it yet) never replaces
    a kind whose producer registered it, whichever app loads first."""
    existing = KINDS.get(kind.name)
    if existing is not None and existing.produced_by and not kind.produced_by:
        return existing
    KINDS[kind.name] = kind
    return kind


def register_rule(rule: Rule) -> Rule:
    if rule.kind not in KINDS:
        raise LookupError(f"register evidence kind {rule.kind!r} before rule {rule.name!r}")
    RULES[rule.name] = rule
    return rule


# --- what a pool "was" when evidence was measured ---------------------------------------------

FINGERPRINT_LABELS = {"model_revision": "model revision", "runtime_version": "runtime version",
                      "driver": "driver label"}


def pool_fingerprint(pool: Pool, model_ids: list[str]) -> dict[str, str]:
    """Evidence measured on a pool stays valid while these stay the same."""
    from fleetctl.fleet.models import PoolModel

    revisions = dict(PoolModel.objects.filter(pool=pool, model_id__in=model_ids)
                     .values_list("model_id", "revision"))
    return {
        "model_revision": ",".join(f"{m}@{revisions.get(m, '')}" for m in sorted(model_ids)),
        "runtime_version": pool.runtime_version,
        "driver": str((pool.labels or {}).get("driver", "")),
    }


def fingerprint_change(then: dict[str, Any], now: dict[str, str]) -> str | None:
    """Why evidence measured at `then` no longer describes the pool, or None."""
    for key, label in FINGERPRINT_LABELS.items():
        if key in then and then.get(key) != now.get(key):
            return f"{label} changed from {then.get(key) or '(none)'} to {now.get(key) or '(none)'}"
    return None


# --- the context a rule reads -----------------------------------------------------------------

@dataclass
class RuleContext:
    plan: Plan
    candidate: Pool
    primary: Pool
    routes: list[Route]
    now: datetime

    @property
    def model_ids(self) -> list[str]:
        return sorted({route.model_id for route in self.routes})

    def fingerprint(self, pool: Pool | None = None) -> dict[str, str]:
        return pool_fingerprint(pool or self.candidate, self.model_ids)

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
    return EvidenceRef(kind=row.kind, ref=f"evidence:{row.pk}", label=row.summary,
                       version=f"{row.pk}:{row.verdict}", url=row.url or "",
                       observed_at=row.observed_at, expires_at=row.expires_at)


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
        statuses = {o.status for o in self.outcomes}
        if statuses & BLOCKING:
            return FAIL
        if INSUFFICIENT in statuses:
            return INSUFFICIENT
        if WARN in statuses:
            return WARN
        return PASS

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
    return {
        "candidate": plan.candidate_pool_id, "primary": plan.primary_pool_id,
        "slo_ttft_p95_ms": plan.slo_ttft_p95_ms, "slo_tpot_p95_ms": plan.slo_tpot_p95_ms,
        "slo_error_rate": plan.slo_error_rate, "latency_margin_pct": plan.latency_margin_pct,
        "cost_margin_pct": plan.cost_margin_pct, "quality_margin_pct": plan.quality_margin_pct,
    }


def _bound(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {
        "stage": snapshot["stage"],
        "terms": snapshot["terms"],
        "checks": [
            {"key": c["key"], "rule": c["rule"], "params": c["params"], "status": c["status"],
             "evidence": sorted(f"{e['ref']}@{e['version']}" for e in c["evidence"])}
            for c in snapshot["checks"]
        ],
    }


def snapshot_hash(snapshot: dict[str, Any]) -> str:
    canonical = json.dumps(_bound(snapshot), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def snapshot_difference(old: dict[str, Any], new: dict[str, Any], now: datetime) -> str | None:
    """Why an approval that saw `old` no longer holds when the gate now looks like `new`."""
    for check in old["checks"]:
        for ref in check["evidence"]:
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
            return (f"check {titles[key]!r} went from {STATUS_LABELS.get(was['status'])} to "
                    f"{STATUS_LABELS.get(now_['status'])}")
        if was["evidence"] != now_["evidence"]:
            return f"the evidence behind check {titles[key]!r} changed"
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
    return rule.evaluate(ctx, params)


def _evaluate_attested(check: GateCheck) -> CheckResult:
    attestation = next((a for a in check.attestations.all() if a.withdrawn_at is None), None)
    if attestation is None:
        return CheckResult(PENDING, f"Awaiting attestation by a {check.attest_role}.")
    who = attestation.by.get_username()
    return CheckResult(
        PASS, f"Attested by {who} ({attestation.role}): {attestation.note}",
        numbers={"attested_by": who, "attested_at": attestation.at.isoformat()},
        evidence=[EvidenceRef(kind="attestation", ref=f"attestation:{attestation.pk}",
                              label=f"{who}: {attestation.note[:80]}",
                              version=str(attestation.pk), observed_at=attestation.at)],
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
