"""The evidence vocabulary and registry: the one set of statuses every check, gate, page
and API speaks, what a check answers (CheckResult, with references an approval binds to),
and the evidence kinds and rules apps register (migrations_plan/evidence.py says how a gate
reads them; callers import these names from there)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError

if TYPE_CHECKING:
    from migrations_plan.evidence import RuleContext

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
    # The judgement this row is one refresh of (a kind with `refreshed`): the same job, the
    # same verdict, the same pools' fingerprints. An approval is bound to it, not to the row
    # (evidence.snapshot_difference). "" for every other kind: bound to the row.
    judgement: str = ""

    @property
    def source_label(self) -> str:
        return source_label(self.origin, self.source)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ref": self.ref, "label": self.label, "version": self.version,
                "url": self.url,
                "observed_at": self.observed_at.isoformat() if self.observed_at else None,
                "expires_at": self.expires_at.isoformat() if self.expires_at else None,
                "origin": self.origin, "source": self.source, "source_url": self.source_url,
                "source_label": self.source_label,
                **({"judgement": self.judgement} if self.judgement else {})}


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
    # Its producer re-records one running judgement as samples arrive (a shadow run's judge):
    # a newer row of the same job, verdict and fingerprints is the same judgement with more
    # samples, and an approval bound to it holds (evidence.snapshot_difference).
    refreshed: bool = False

    @property
    def schema(self) -> dict[str, Any]:
        return self.data_schema if self.data_schema is not None else EMPTY_DATA_SCHEMA


def data_problems(kind: EvidenceKind, data: Any) -> list[str]:
    """What is wrong with `data` for `kind`, each problem with its JSON path ("$.slo.ttft")."""
    from jsonschema import Draft202012Validator

    from fleetctl.inference.schema import LOCAL_ONLY_REGISTRY

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

    from fleetctl.inference.schema import schema_problem

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
