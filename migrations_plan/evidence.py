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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.utils import timezone

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Route
    from migrations_plan.models import Evidence, GateCheck, Plan

# --- one status vocabulary: checks, gates, the API, the CLI, metrics and approvals -------------

PASS = "pass"
WARN = "warn"
INSUFFICIENT = "insufficient"
AWAITING = "awaiting-attestation"  # an attested check nobody has attested yet: blocks
FAIL = "fail"
PENDING = AWAITING  # the name this status had before
# Worst first: a gate's status is the worst of its checks'.
STATUSES = (FAIL, AWAITING, INSUFFICIENT, WARN, PASS)
GATE_STATUSES = STATUSES
BLOCKING = frozenset({FAIL, AWAITING})
STATUS_LABELS = {PASS: "pass", WARN: "warn", INSUFFICIENT: "insufficient data",
                 AWAITING: "awaiting attestation", FAIL: "fail"}
STATUS_MEANINGS = {
    FAIL: "a check fails: the gate cannot be approved or advanced",
    AWAITING: "no check fails, but an attested check is not attested yet: the gate cannot be "
              "approved or advanced until it is",
    INSUFFICIENT: "no check fails, but one lacks the evidence it needs: approving takes a "
                  "written justification",
    WARN: "no check fails or lacks evidence, but one warns: approving takes a written "
          "justification",
    PASS: "every check passes",
}
# "Blocked" means exactly this everywhere it is shown: the gate cannot be approved or advanced.
BLOCKED_LABEL = "blocked"
# Values stored before the vocabulary was one: read as today's.
LEGACY_STATUSES = {"pending": AWAITING}


def normalise_status(status: str) -> str:
    return LEGACY_STATUSES.get(status, status)


def status_label(status: str) -> str:
    return STATUS_LABELS.get(normalise_status(status), status)


def gate_status(statuses: Iterable[str]) -> str:
    """A gate's status from its checks' statuses: the worst of them (no check: pass)."""
    seen = {normalise_status(s) for s in statuses}
    return next((status for status in STATUSES if status in seen), PASS)


def blocks_advance(status: str) -> bool:
    return normalise_status(status) in BLOCKING


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
    # Where it comes from: measured by fleetctl, reported by another system, attested by a
    # person (ORIGINS), and who: the job, the system named, the person.
    origin: str = "measured"
    source: str = ""
    source_url: str = ""  # the job's run, the report's URL

    @property
    def source_label(self) -> str:
        return source_label(self.origin, self.source)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ref": self.ref, "label": self.label, "version": self.version,
                "url": self.url,
                "observed_at": self.observed_at.isoformat() if self.observed_at else None,
                "expires_at": self.expires_at.isoformat() if self.expires_at else None,
                "origin": self.origin, "source": self.source, "source_url": self.source_url,
                "source_label": self.source_label}


MEASURED = "measured"
REPORTED = "reported"
ATTESTED = "attested"
ORIGINS = (MEASURED, REPORTED, ATTESTED)
_ORIGIN_WORDS = {MEASURED: "measured by", REPORTED: "reported by", ATTESTED: "attested by"}


def source_label(origin: str, source: str) -> str:
    """ "measured by benchmark run 12", "reported by grafana-slo-bot", "attested by ana"."""
    who = source.removeprefix("system:") if origin == MEASURED else source
    return f"{_ORIGIN_WORDS.get(origin, origin)} {who or 'fleetctl'}"


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
    refuse: Callable[[Any], str | None] | None = None  # why a value is refused, or None


# A kind that declares no data schema takes no data: an empty object, nothing else.
EMPTY_DATA_SCHEMA: dict[str, Any] = {"type": "object", "maxProperties": 0}
EXTERNAL = "external"


@dataclass(frozen=True)
class EvidenceKind:
    """An evidence kind. `measured` kinds are written only by fleetctl's own jobs
    (`services.evidence_record`, which the API does not expose); the one kind that is not
    measured, `external`, is what another system reports (`services.evidence_report`, the
    API) and never satisfies a check over a measured kind. `data_schema` is the JSON Schema
    each row's `data` must match when written; none declared means no data at all
    (`EMPTY_DATA_SCHEMA`)."""

    name: str
    label: str
    produced_by: str  # what produces it; "" when nothing in this version does
    data_schema: dict[str, Any] | None = None
    measured: bool = True

    @property
    def schema(self) -> dict[str, Any]:
        return self.data_schema if self.data_schema is not None else EMPTY_DATA_SCHEMA


def data_problems(kind: EvidenceKind, data: Any) -> list[str]:
    """What is wrong with `data` for `kind`, each problem with its JSON path ("$.slo.ttft")."""
    from jsonschema import Draft202012Validator

    from fleetctl.core.compare import LOCAL_ONLY_REGISTRY

    # Reported data is walked here by jsonschema itself (its messages and paths are the ones
    # shown), with the registry that fetches nothing: the default one would fetch a "$ref"
    # to a URL or a file.
    validator = Draft202012Validator(kind.schema, registry=LOCAL_ONLY_REGISTRY)
    problems = []
    for error in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path)):
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                             for p in error.absolute_path)
        if kind.data_schema is None and error.validator == "maxProperties":
            message = (f"the {kind.name} kind declares no data schema, so it takes no data "
                       f"(send {{}} or leave data out)")
        else:
            message = error.message
        problems.append(f"{path}: {message}")
    return problems[:20]


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
                    if isinstance(value, str) and not value.strip():
                        raise ValidationError({"params": [f"{name}: required ({spec.help})."]})
                    if not isinstance(value, str):
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
            refusal = spec.refuse(value) if spec.refuse is not None else None
            if refusal:
                raise ValidationError({"params": [f"{name}: {refusal}"]})
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
    a kind whose producer registered it, whichever app loads first. A data schema that is not
    a valid JSON Schema is refused here, not at the first write."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    from fleetctl.core.compare import schema_problem

    problem = schema_problem(kind.schema)  # as every schema: self-contained, and shallow
    if problem is not None:
        raise ValueError(f"evidence kind {kind.name!r}: its data schema: {problem}")
    try:
        Draft202012Validator.check_schema(kind.schema)
    except SchemaError as exc:
        raise ValueError(f"evidence kind {kind.name!r}: its data schema is not valid JSON "
                         f"Schema: {exc.message}") from exc
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
                      "weight_format": "weight format"}


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
                       source_url=row.url or "")


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
            {"key": c["key"], "rule": c["rule"], "params": c["params"],
             "status": normalise_status(c["status"]),
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
            return (f"check {titles[key]!r} went from {status_label(was['status'])} to "
                    f"{status_label(now_['status'])}")
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
