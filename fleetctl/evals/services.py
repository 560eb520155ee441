"""Writes for eval suites and eval runs: upload, install the bundled suites, retire; create a
run, cancel it, execute it (the `evals.run` task; runner.py does the work), take over runs
whose worker died (beat `evals.reap`) and finish a run (statistics, verdict, evidence).

A suite is immutable. Its pin is the SHA-256 of its canonical JSONL (suites.canonical_jsonl
of the description, the decoding and the items as validated): an upload whose canonical bytes
equal an existing version of that name IS that version (nothing stored); anything else is the
next version. Every error names the line or the field, and nothing is stored on any error.

A run is created with every row it will ever have: one EvalResult per (item, pool), status
`pending`, in interleaved order (item position x pools + pool position). The runner claims
rows, and writes each answer and its score with one conditional UPDATE on the claim token, so
a row is scored at most once whichever workers come and go (runner.py says how).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError
from fleetctl.evals.evidence import KIND
from fleetctl.evals.models import EvalItem, EvalResult, EvalRun, EvalRunPool, EvalSuite
from fleetctl.fleet.models import Pool, slug_validator
from migrations_plan import jobs

if TYPE_CHECKING:
    from fleetctl.evals.suites import ParsedSuite, SuiteItem
    from migrations_plan.models import Plan

log = logging.getLogger("fleetctl.evals")
PRODUCER = "eval"
ITEM_BATCH = 1000  # rows per bulk INSERT
_REF = re.compile(r"^(?P<name>[^@\s]+)@(?P<version>\d+)$")


def _system() -> Actor:
    return Actor.for_system(PRODUCER)


# --- suites -----------------------------------------------------------------------------------

class _TooLarge(Exception):
    pass


class _Capped:
    """The upload read line by line, refused once it passes EVAL_MAX_UPLOAD_BYTES (counted as
    read, so a huge file is never read whole)."""

    def __init__(self, fileobj: IO[bytes], limit: int) -> None:
        self._file = fileobj
        self._limit = limit
        self._read = 0

    def _count(self, data: bytes) -> bytes:
        self._read += len(data)
        if self._read > self._limit:
            raise _TooLarge
        return data

    def readline(self, limit: int = -1) -> bytes:
        return self._count(self._file.readline(limit))

    def read(self, size: int = -1) -> bytes:
        return self._count(self._file.read(size))

    def __iter__(self) -> Iterator[bytes]:
        while True:
            line = self.readline()
            if not line:
                return
            yield line


def _check_name(name: str) -> str:
    name = (name or "").strip()
    try:
        slug_validator(name)
    except ValidationError:
        raise ValidationError({"name": [
            f"{name!r} is not a suite name: use 1-63 lowercase letters, digits and hyphens, "
            f"starting with a letter or digit." if name else
            "Name the suite (1-63 lowercase letters, digits and hyphens)."]}) from None
    return name


def _too_large_message() -> str:
    limit = settings.EVAL_MAX_UPLOAD_BYTES
    return (f"The file is larger than {limit / 1024 / 1024:g} MiB "
            f"(EVAL_MAX_UPLOAD_BYTES); split the suite, or raise the limit.")


def suite_upload(*, actor: Actor, name: str, fileobj: IO[bytes],
                 description: str = "") -> tuple[EvalSuite, bool]:
    """Validate and store an uploaded suite (JSONL), streamed line by line. Returns (suite,
    created): the same content as an existing version of `name` is that version (False)."""
    from fleetctl.evals import suites

    actor.require(roles.JOBS, action="eval_suite.create", target="evals.suite")
    name = _check_name(name)
    try:
        parsed = suites.parse_suite(_Capped(fileobj, settings.EVAL_MAX_UPLOAD_BYTES),
                                    max_items=settings.EVAL_MAX_SUITE_ITEMS)
    except _TooLarge:
        raise ValidationError({"file": [_too_large_message()]}) from None
    except suites.SuiteError as exc:
        raise ValidationError({"file": exc.messages()}) from exc
    return _store_suite(actor=actor, name=name, parsed=parsed, description=description,
                        source=EvalSuite.Source.UPLOADED, generator={})


def _store_suite(*, actor: Actor, name: str, parsed: ParsedSuite, description: str,
                 source: str, generator: dict[str, Any]) -> tuple[EvalSuite, bool]:
    """The version of `name` with these canonical bytes: found, or made (items in one
    transaction). Two uploads racing for the next version: the loser tries again."""
    from fleetctl.evals import suites

    description = (description or "").strip() or parsed.description
    if len(description) > suites.MAX_DESCRIPTION_CHARS:
        raise ValidationError({"description": [
            f"At most {suites.MAX_DESCRIPTION_CHARS:,} characters; shorten it."]})
    decoding = suites.decoding_checked(parsed.decoding or {})
    sha = suites.digest(suites.canonical_jsonl(description, decoding, parsed.items))
    for _ in range(3):
        same = EvalSuite.objects.filter(name=name, sha256=sha).first()
        if same is not None:
            return same, False
        try:
            with transaction.atomic():
                newest = EvalSuite.objects.filter(name=name).order_by("-version").first()
                suite = EvalSuite(
                    name=name, version=(newest.version + 1) if newest else 1, sha256=sha,
                    description=description, source=source, generator=generator,
                    decoding=decoding, item_count=len(parsed.items),
                    tags=parsed.tag_counts(), scorers=parsed.scorer_counts(),
                    created_by=actor.label)
                suite.save()
                EvalItem.objects.bulk_create(
                    (EvalItem(suite=suite, position=n, item_id=i.item_id,
                              messages=i.messages, prompt=i.prompt or "",
                              references=list(i.references), scorer=i.scorer,
                              params=i.params, tags=list(i.tags), request=i.request)
                     for n, i in enumerate(parsed.items)), batch_size=ITEM_BATCH)
                audit_record(actor=actor, action="eval_suite.create", target=suite,
                             after={"name": name, "version": suite.version, "sha256": sha,
                                    "items": suite.item_count, "source": source,
                                    "scorers": suite.scorers, "generator": generator})
            return suite, True
        except IntegrityError:
            continue  # another upload took the version (or stored these bytes) first
    raise ConflictError(f"Suite {name} is being uploaded by someone else at the same time; "
                        f"try again.")


def suite_install_bundled(*, actor: Actor, names: Sequence[str] | None = None
                          ) -> list[EvalSuite]:
    """The suites fleetctl generates from fixed seeds (bundled.SUITES). Idempotent: the same
    bytes are the same version."""
    from fleetctl.evals import bundled, suites

    actor.require(roles.JOBS, action="eval_suite.create", target="evals.suite")
    wanted = list(bundled.SUITES) if names is None else list(names)
    unknown = [n for n in wanted if n not in bundled.SUITES]
    if unknown:
        raise ValidationError({"names": [f"No bundled suite {', '.join(unknown)}; bundled: "
                                         f"{', '.join(bundled.SUITES)}."]})
    out = []
    for name in wanted:
        spec = bundled.SUITES[name]
        parsed = suites.parse_suite(bundled.suite_lines(name))
        suite, _ = _store_suite(actor=actor, name=name, parsed=parsed,
                                description=str(spec.get("description") or ""),
                                source=EvalSuite.Source.BUNDLED,
                                generator={"family": spec["family"], "seed": spec["seed"],
                                           "n": spec["n"]})
        out.append(suite)
    return out


def suite_retire(*, actor: Actor, suite: EvalSuite) -> EvalSuite:
    """A retired suite starts no runs (runs made with it keep it). Idempotent."""
    actor.require(roles.JOBS, action="eval_suite.retire", target=suite)
    with transaction.atomic():
        now = timezone.now()
        changed = EvalSuite.objects.filter(pk=suite.pk, retired_at__isnull=True).update(
            retired_at=now, retired_by=actor.label)
        fresh = EvalSuite.objects.get(pk=suite.pk)
        if changed:
            audit_record(actor=actor, action="eval_suite.retire", target=fresh,
                         before={"retired": False}, after={"retired": True})
    return fresh


def suite_items(suite: EvalSuite) -> Iterator[SuiteItem]:
    from fleetctl.evals.suites import SuiteItem

    for row in EvalItem.objects.filter(suite=suite).order_by("position").iterator(2000):
        yield SuiteItem(item_id=row.item_id, messages=row.messages, prompt=row.prompt,
                        references=list(row.references), scorer=row.scorer,
                        params=dict(row.params), tags=list(row.tags),
                        request=dict(row.request))


def suite_jsonl(suite: EvalSuite) -> bytes:
    """The suite's canonical bytes: what its sha256 is of, and what a download returns."""
    from fleetctl.evals import suites

    return suites.canonical_jsonl(suite.description, dict(suite.decoding),
                                  list(suite_items(suite)))


def suite_lookup(ref: str) -> EvalSuite:
    """"name" (its newest version that is not retired), "name@3", or an id."""
    text = str(ref or "").strip()
    suite: EvalSuite | None = None
    if text.isdigit():
        suite = EvalSuite.objects.filter(pk=int(text)).first()
    if suite is None:
        match = _REF.match(text)
        if match is not None:
            suite = EvalSuite.objects.filter(name=match["name"],
                                             version=int(match["version"])).first()
        elif text:
            suite = (EvalSuite.objects.filter(name=text, retired_at__isnull=True)
                     .order_by("-version").first())
    if suite is None:
        names = list(EvalSuite.objects.filter(retired_at__isnull=True)
                     .order_by("name").values_list("name", flat=True).distinct()[:20])
        raise ValidationError({"suite": [
            f"No suite {text!r}; give a name (its newest version), name@version, or an id. "
            f"Suites: {', '.join(names) or 'none yet (upload one, or install the bundled ones)'}."
        ]})
    return suite


# --- runs -------------------------------------------------------------------------------------

def _decoding(suite: EvalSuite, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The suite's decoding with the run's overrides, each checked as a suite header's is."""
    from fleetctl.evals import suites

    try:
        return suites.decoding_checked({**(suite.decoding or {}), **(overrides or {})}
                                       if overrides is None or isinstance(overrides, dict)
                                       else overrides)
    except suites.FieldProblem as problem:
        raise ValidationError({"decoding": [str(problem)]}) from None


def _suite_in_service(suite: EvalSuite) -> EvalSuite:
    suite = EvalSuite.objects.get(pk=suite.pk)  # retired since it was read?
    if suite.retired:
        raise ValidationError({"suite": [
            f"Suite {suite.label} is retired (by {suite.retired_by or 'someone'}); runs use "
            f"suites in service: upload it again or pick another."]})
    if not suite.item_count:
        raise ValidationError({"suite": [f"Suite {suite.label} has no items."]})
    return suite


def _margin(plan: Plan | None, margin: float | None) -> float:
    """A plan's run is judged with the plan's quality margin; another names its own."""
    if plan is None:
        return 0.02 if margin is None else margin
    plan_margin = plan.quality_margin_pct / 100
    if margin is not None and abs(margin - plan_margin) > 1e-12:
        raise ValidationError({"margin": [
            f"Plan {plan.name}'s quality margin is {plan.quality_margin_pct:g} points; a "
            f"run for the plan is judged with it (change the plan's margin, or leave the "
            f"margin out)."]})
    return plan_margin


def run_create(*, actor: Actor, suite: EvalSuite, candidate: Pool | None = None,
               primary: Pool | None = None, others: Sequence[Pool] = (),
               plan: Plan | None = None, model_id: str = "", concurrency: int = 16,
               max_rps: float | None = None, timeout_s: float = 120, max_attempts: int = 3,
               decoding: dict[str, Any] | None = None, margin: float | None = None,
               confidence: float = 0.95, min_items: int = 100) -> EvalRun:
    """Queue a run of `suite` on the candidate, its primary and any other pools, each sent
    every item directly. With a plan, the candidate, the primary and the margin are the
    plan's (jobs.resolve_plan_targets). Every result row is made here. Nothing is stored
    when anything is refused."""
    actor.require(roles.JOBS, action="eval_run.create", target=plan or candidate or suite)
    suite = _suite_in_service(suite)
    targets = jobs.resolve_plan_targets(plan, noun="eval runs", candidate=candidate,
                                        primary=primary, others=others, model_id=model_id)
    run = EvalRun(plan=plan, plan_stage=plan.stage if plan is not None else None, suite=suite,
                  suite_sha256=suite.sha256, model_id=targets.model_id,
                  decoding=_decoding(suite, decoding), concurrency=concurrency,
                  max_rps=max_rps, timeout_s=timeout_s, max_attempts=max_attempts,
                  margin=_margin(plan, margin), confidence=confidence,
                  min_items=min_items, created_by=actor.label)
    run.full_clean()
    with transaction.atomic():
        run.save()
        run_pools = _rows(run, suite, targets)
        audit_record(actor=actor, action="eval_run.create", target=run, after={
            "suite": suite.label, "suite_sha256": suite.sha256, "model": run.model_id,
            "plan": plan.name if plan else None, "plan_stage": run.plan_stage,
            "pools": {rp.role if rp.role != "other" else f"other {rp.position}": rp.pool.name
                      for rp in run_pools},
            "total": run.total, "concurrency": concurrency, "max_rps": max_rps,
            "timeout_s": timeout_s, "max_attempts": max_attempts, "decoding": run.decoding,
            "margin": run.margin, "confidence": confidence, "min_items": min_items})
        transaction.on_commit(lambda: _enqueue(run.pk))
    return run


def _rows(run: EvalRun, suite: EvalSuite, targets: jobs.Targets) -> list[EvalRunPool]:
    """The run's pools (fingerprint and endpoints as they are now) and one pending result
    row per (item, pool), interleaved: item position x pools + pool position."""
    from migrations_plan.evidence import pool_fingerprint

    run_pools = EvalRunPool.objects.bulk_create([
        EvalRunPool(run=run, pool=t.pool, role=t.role, position=n,
                    fingerprint=pool_fingerprint(t.pool, [run.model_id]),
                    endpoints=jobs.endpoints_of(t.pool))
        for n, t in enumerate(targets.targets)])
    npools = len(run_pools)
    items = EvalItem.objects.filter(suite=suite).order_by("position").values_list(
        "pk", "position")
    total = 0
    batch: list[EvalResult] = []
    for item_pk, position in items.iterator(5000):
        for rp in run_pools:
            batch.append(EvalResult(run=run, run_pool=rp, item_id=item_pk,
                                    position=position * npools + rp.position))
        if len(batch) >= 5000:
            EvalResult.objects.bulk_create(batch)
            total += len(batch)
            batch = []
    EvalResult.objects.bulk_create(batch)
    total += len(batch)
    if not total:
        raise ValidationError({"suite": [f"Suite {suite.label} has no items."]})
    run.total = total
    run.save(update_fields=["total"])
    return run_pools


def _enqueue(run_id: int, *, expires_s: float | None = None) -> None:
    from fleetctl.evals.tasks import run

    if expires_s is None:
        run.delay(run_id)
    else:
        run.apply_async((run_id,), expires=expires_s)


def run_cancel(*, actor: Actor, run: EvalRun) -> EvalRun:
    """Queued or running -> cancelled. The runner sees it at its next heartbeat (within 2 s)
    and stops sending; what was scored is kept."""
    return jobs.cancel(actor, run, action="eval_run.cancel", noun="Eval run",
                       after=lambda fresh: {"done": fresh.done, "total": fresh.total})


def run_execute(*, run_id: int) -> EvalRun | None:
    """The `evals.run` task: drive the run to its end (runner.py), or return at once when
    another worker drives it (or it is over)."""
    from fleetctl.evals import runner

    return runner.execute(run_id)


def runs_reap() -> int:
    """Beat: a running run whose heartbeat is older than EVAL_HEARTBEAT_STALE_S (its worker
    died), and a queued run no worker took in that time, are enqueued again (policy RESUME);
    the worker that takes it over resumes it from its rows (runner.take). Returns how many
    were enqueued. Expiring with the stale period: while no worker consumes `evals`, the
    copies the reaper sends every 30 s lapse instead of piling up (the next reap sends a
    fresh one)."""
    stale_s = float(settings.EVAL_HEARTBEAT_STALE_S)
    return jobs.reap(EvalRun, policy=jobs.Reap.RESUME, stale_after_s=stale_s,
                     queued_after_s=stale_s,
                     resume=lambda run_id: _enqueue(run_id, expires_s=stale_s))


# --- finishing --------------------------------------------------------------------------------

def _pts(value: float) -> str:
    """Points with a sign, the minus a real one: +0.4, −1.1."""
    text = f"{value * 100:+.1f}"
    return text.replace("-", "−")


def summary_line(run: EvalRun, stats: dict[str, Any]) -> str:
    """"candidate − primary +0.4 pts [−1.1, +1.9] on 1,200 items; pass (margin 2 pts)"."""
    verdict = stats.get("verdict") or "insufficient"
    paired = stats.get("paired")
    margin = f"margin {run.margin * 100:g} pts"
    if not paired or paired.get("estimate") is None:
        return str(stats.get("summary") or f"{verdict}: no primary to compare with "
                                            f"({margin})")[:600]
    n = int(paired.get("n") or 0)
    lower, upper = paired.get("lower"), paired.get("upper")
    interval = (f" [{_pts(lower)}, {_pts(upper)}]"
                if lower is not None and upper is not None else "")
    return (f"candidate − primary {_pts(float(paired['estimate']))} pts{interval} on "
            f"{n:,} items; {verdict} ({margin})")[:600]


def _stat_rows(run: EvalRun) -> Iterator[dict[str, Any]]:
    rows = (EvalResult.objects.filter(run=run)
            .values_list("run_pool__pool__name", "item__item_id", "score", "status",
                         "item__tags").order_by("position"))
    for pool, item, score, status, tags in rows.iterator(5000):
        yield {"pool": pool, "item": item,
               "score": score if status == EvalResult.Status.DONE else None,
               "tags": list(tags or [])}


def run_statistics(run: EvalRun) -> dict[str, Any]:
    from fleetctl.evals import stats

    names = {rp.role: rp.pool.name for rp in run.run_pools.select_related("pool")}
    return stats.run_statistics(_stat_rows(run), candidate=names["candidate"],
                                primary=names.get("primary"), margin=run.margin,
                                confidence=run.confidence, min_items=run.min_items)


def run_finish(run: EvalRun) -> EvalRun:
    """Statistics, verdict and summary; `eval` evidence about the candidate when the run has a
    primary (never `live-quality`: a fixed suite is not live traffic, whatever the plan's
    stage). Once: only a running run is finished, in one transaction with its evidence
    (jobs.finish)."""
    figures = run_statistics(run)
    verdict = str(figures.get("verdict") or "insufficient")
    summary = summary_line(run, figures)

    def evidence(locked: EvalRun) -> dict[str, Any]:
        ids = _record_evidence(locked, figures, verdict, summary)
        return {"done": locked.done, "total": locked.total, "evidence": ids}

    return jobs.finish(run, actor=_system(), action="eval_run.finish", evidence=evidence,
                       fields={"verdict": verdict, "summary": summary, "stats": figures},
                       message=f"{verdict}: {summary}", after={"verdict": verdict})


def _record_evidence(run: EvalRun, figures: dict[str, Any], verdict: str,
                     summary: str) -> dict[str, int]:
    """The run's `eval` evidence about the candidate; none without a primary to compare
    with. (`live_evidence_id` stays empty: only a stage-4 shadow run records live-quality.)"""
    from fleetctl.evals import stats as stats_module
    from migrations_plan.services import evidence_record

    run_pools = list(run.run_pools.select_related("pool").order_by("position"))
    by_role = {rp.role: rp for rp in run_pools}
    if "primary" not in by_role:
        return {}
    route = (run.plan.routes.filter(model_id=run.model_id).order_by("name").first()
             if run.plan is not None else None)
    data = _evidence_data(run, run_pools, figures)
    row = evidence_record(
        actor=_system(), pool=by_role["candidate"].pool, kind=KIND,
        verdict=stats_module.verdict_for_evidence(verdict), summary=summary[:300],
        data=data, route=route, model_id=run.model_id,
        source=f"eval run {run.pk}", url=f"/evals/runs/{run.pk}/")
    run.evidence_id = row.pk
    run.save(update_fields=["evidence_id"])
    return {KIND: row.pk}


def _evidence_data(run: EvalRun, run_pools: list[EvalRunPool],
                   figures: dict[str, Any]) -> dict[str, Any]:
    names = {rp.role: rp.pool.name for rp in run_pools}
    paired = figures.get("paired") or {}
    return {
        "run": run.pk, "source": "eval", "stage": run.plan_stage,
        "suite": run.suite.name, "suite_version": run.suite.version,
        "suite_sha256": run.suite_sha256, "items": int(paired.get("n") or 0),
        "min_items": run.min_items, "margin": run.margin, "confidence": run.confidence,
        "candidate": names["candidate"], "primary": names.get("primary"),
        "model": run.model_id, "pools": figures.get("pools") or {}, "paired": paired,
        "tags": figures.get("tags") or {},
        "fingerprints": {rp.pool.name: dict(rp.fingerprint or {}) for rp in run_pools},
    }


def new_token() -> str:
    return uuid.uuid4().hex
