"""Worker code for judging and purging: judge a run and record its evidence (beat
`shadow.judge`), keep the collectors' published runs in step, and purge stored text past
its retention (beat `shadow.purge`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Min, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from fleetctl.shadow import live, selectors, stats
from fleetctl.shadow.evidence import KIND
from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun
from fleetctl.shadow.services._shared import _fingerprints, _publish, _system, log
from fleetctl.traffic import mirror_auth

if TYPE_CHECKING:
    from migrations_plan.models import Evidence

# Evidence is recorded when the verdict changes (the confidence sequence crossed into another
# decision), else refreshed at most this often while pairs arrive, so the gate shows the
# grown sample. A refresh is the same judgement of the same run (same verdict, same pool
# fingerprints) with more pairs: an approval bound to it holds (docs/shadow.md). A pool that
# changed (an upgrade: fleet's report and change hooks, `pool_changed`) restarts the
# judgement on the pairs received since, recorded at once.
EVIDENCE_EVERY_S = 600
# The run verdict's evidence verdict: "insufficient" is evidence of nothing yet.
EVIDENCE_VERDICT = {"pass": "pass", "warn": "warn", "fail": "fail", "insufficient": "info"}
# Stage 4's "Quality unchanged" kind (registered by fleetctl/evals/evidence.py): a run judged
# while its plan is live records it too.
LIVE_QUALITY_KIND = "live-quality"


# --- judge and purge --------------------------------------------------------------------------

def _evidence_due(run: ShadowRun, judged: stats.RunJudgement,
                  prints: dict[str, dict[str, str]]) -> bool:
    from migrations_plan.models import Evidence

    last = Evidence.objects.filter(pk=run.evidence_id).values("observed_at", "data").first() \
        if run.evidence_id is not None else None
    data = (last["data"] if last else None) or {}
    # The judgement restarted (a pool changed, `_judging_basis`) since the last row: record
    # at once, even with no pair yet — the row says how many pairs came since and how many
    # are needed, and the gate reads it rather than a row measured on the old version.
    since = run.judged_since.isoformat() if run.judged_since else None
    if since is not None and data.get("since") != since:
        return True
    if judged.pairs == 0:
        return False
    if last is None or judged.verdict != run.verdict:
        return True
    grown = judged.pairs > int(data.get("pairs", 0))
    # Either pool's fingerprint differs from the last row's without restarting the judgement
    # (a field the pool reports for the first time): record on the fingerprints now.
    if grown and "fingerprints" in data and data["fingerprints"] != prints:
        return True
    stale = last["observed_at"] <= timezone.now() - timedelta(seconds=EVIDENCE_EVERY_S)
    return stale and grown


def _judging_basis(run: ShadowRun, prints: dict[str, dict[str, str]],
                   now: datetime) -> tuple[datetime | None, str]:
    """Since when, and why, the run's pairs are judged: (run.judged_since,
    run.judged_since_why) while neither pool changed since the fingerprints the judgement
    applies to; else (now, "<pool> changed to <what>") — the pairs received before were
    measured on what the pool was and are evidence of nothing about what it is now. Now, not
    when the pool changed: the change is seen here (at once through fleet's hooks, else at
    the next beat), and a pair received in between is left out rather than a pair measured
    on the old version let in. A field a pool reports for the first time is no change."""
    from migrations_plan.evidence import fingerprint_changes

    then = run.judged_fingerprints or _last_fingerprints(run) or prints
    for side in ("candidate", "primary"):
        changes = fingerprint_changes(then.get(side) or {}, prints[side])
        if changes:
            label, _, is_ = changes[0]
            pool = run.candidate if side == "candidate" else run.primary
            return now, f"{pool.name} changed to {label.split(' (')[0]} {is_ or '(none)'}"
    return run.judged_since, run.judged_since_why


def _last_fingerprints(run: ShadowRun) -> dict[str, Any]:
    """A run started before the judgement kept its fingerprints: its last row's."""
    from migrations_plan.models import Evidence

    if run.evidence_id is None:
        return {}
    data = Evidence.objects.filter(pk=run.evidence_id).values_list("data", flat=True).first()
    prints = (data or {}).get("fingerprints") if isinstance(data, dict) else None
    return prints if isinstance(prints, dict) else {}


def _since_summary(run: ShadowRun, judged: stats.RunJudgement) -> str:
    """The judgement's summary, saying first which pairs it rests on when it restarted."""
    if run.judged_since is None:
        return judged.summary
    since = f"{run.judged_since_why} at {run.judged_since:%Y-%m-%d %H:%M:%S} UTC"
    if judged.verdict == "insufficient":
        n = judged.metrics["divergence"].n if "divergence" in judged.metrics else judged.pairs
        head = f"{n} pairs since {since}; needs {run.min_pairs}."
        return f"{head} {judged.summary}" if n else head
    return f"Since {since}: {judged.summary}"


def _evidence_data(run: ShadowRun, judged: stats.RunJudgement, counters: dict[str, int],
                   window: tuple[datetime | None, datetime | None],
                   prints: dict[str, dict[str, str]]) -> dict[str, Any]:
    first, last = window
    return {
        "run": run.pk, "mode": run.mode, "pairs": judged.pairs, "min_pairs": run.min_pairs,
        "margin": run.margin, "confidence": run.confidence,
        "window": {"from": first.isoformat() if first else None,
                   "to": last.isoformat() if last else None},
        "since": run.judged_since.isoformat() if run.judged_since else None,
        "since_why": run.judged_since_why,
        "metrics": judged.metrics_dict(), "gated": list(stats.GATED),
        "counters": {k: v for k, v in counters.items() if v >= 0},
        "primary": run.primary.name, "candidate": run.candidate.name,
        "fingerprints": prints,
        "route": run.route.name if run.route else None, "model": run.model_id,
    }


def _record_live_quality(run: ShadowRun, judged: stats.RunJudgement,
                         shadow: Evidence) -> None:
    """In stage 4 the mirrored requests are live traffic, so the judgement also speaks to the
    stage-4 check "Quality unchanged": record it as `live-quality` evidence too (the kind the
    evals app registers; shadow may not import evals, hence the name). The same verdict and
    summary as the `shadow` row, with the gated metrics' intervals."""
    from migrations_plan.services import evidence_record

    data = {"run": run.pk, "source": "shadow", "stage": 4, "items": judged.pairs,
            "min_items": run.min_pairs, "margin": run.margin, "confidence": run.confidence,
            "candidate": run.candidate.name, "primary": run.primary.name,
            "model": run.model_id,
            "metrics": {name: m for name, m in judged.metrics_dict().items()
                        if name in stats.GATED},
            "fingerprints": (shadow.data or {}).get("fingerprints", {})}
    evidence_record(actor=_system(), pool=run.candidate, kind=LIVE_QUALITY_KIND,
                    verdict=shadow.verdict, summary=shadow.summary, data=data,
                    route=run.route, model_id=run.model_id, source=f"shadow run {run.pk}",
                    url=f"/shadow/runs/{run.pk}/")


def _since(run: ShadowRun) -> QuerySet[ShadowPair]:
    """The run's pairs the judgement counts: those received after it last restarted."""
    pairs = ShadowPair.objects.filter(run=run)
    return pairs if run.judged_since is None else pairs.filter(received_at__gt=run.judged_since)


def judged_sequence(run: ShadowRun) -> tuple[
        list[tuple[dict[str, Any], dict[str, Any]]], tuple[datetime | None, datetime | None]]:
    """The pairs the run is judged on, in the order they were made, and when the first and
    the last of them were received: the first pair of each distinct request (a prompt asked
    a hundred times diverges, or not, a hundred times alike, and counted a hundred times it
    would narrow the interval as if it were a hundred different requests), the first
    SHADOW_JUDGE_WINDOW_PAIRS distinct requests at most.

    Append-only, so each look extends the sequence the last look judged and the confidence
    sequence (stats.judge_pairs) sees one growing sample, never a window that slides and
    draws its noise again — the reason a verdict over "the newest pair of each request"
    wandered across the margin on every refresh. A request asked again adds nothing; the
    cost of a look is one grouped index scan plus at most the cap of rows.

    Only the pairs received since the judgement last restarted (`run.judged_since`: a pool
    changed) count: the sequence starts again from the first of them."""
    firsts = (_since(run).values("request_hash")
              .annotate(first=Min("id")).order_by("first")
              .values_list("first", flat=True)[:settings.SHADOW_JUDGE_WINDOW_PAIRS])
    rows = list(ShadowPair.objects.filter(pk__in=firsts).order_by("id")
                .values_list("noise", "signal", "received_at"))
    pairs = [(noise, signal) for noise, signal, _ in rows]
    received = [at for _, _, at in rows]
    return pairs, ((min(received), max(received)) if received else (None, None))


def run_judge(*, run: ShadowRun) -> ShadowJudgement:
    """Judge the run's pairs (stats.judge_pairs over `judged_sequence`), store the
    judgement, fold the Redis counters into the run, and record `shadow` evidence about the
    candidate when the verdict changed, or EVIDENCE_EVERY_S passed with new pairs, or the
    judgement restarted because a pool changed (`_judging_basis`)."""
    from migrations_plan.services import evidence_record

    run = ShadowRun.objects.select_related("route", "candidate", "primary", "plan").get(pk=run.pk)
    now = timezone.now()
    prints = _fingerprints(run)
    run.judged_since, run.judged_since_why = _judging_basis(run, prints, now)
    pairs, window = judged_sequence(run)
    # Latency is descriptive, not judged: the newest SHADOW_JUDGE_WINDOW_PAIRS pairs (since
    # the judgement restarted), what the three sides answer like now.
    sides = list(_since(run).order_by("-received_at", "-id")
                 .values_list("sides", flat=True)[:settings.SHADOW_JUDGE_WINDOW_PAIRS])
    judged = stats.judge_pairs(pairs, margin=run.margin, min_pairs=run.min_pairs,
                               confidence=run.confidence)
    judged = replace(judged, summary=_since_summary(run, judged))
    counters = selectors.live_counters(run)
    with transaction.atomic():
        judgement = ShadowJudgement.objects.create(
            run=run, at=now, pairs=judged.pairs, verdict=judged.verdict,
            metrics=judged.metrics_dict(), counters=counters,
            latency=stats.latency_summary(sides))
        evidence_id = run.evidence_id
        if _evidence_due(run, judged, prints):
            evidence = evidence_record(
                actor=_system(), pool=run.candidate, kind=KIND,
                verdict=EVIDENCE_VERDICT[judged.verdict], summary=judged.summary,
                data=_evidence_data(run, judged, counters, window, prints), route=run.route,
                model_id=run.model_id, source=f"shadow run {run.pk}",
                url=f"/shadow/runs/{run.pk}/")
            evidence_id = evidence.pk
            if run.plan.stage == 4:
                _record_live_quality(run, judged, evidence)
        ShadowRun.objects.filter(pk=run.pk).update(
            verdict=judged.verdict, summary=judged.summary[:600], counters=counters,
            judged_at=now, evidence_id=evidence_id, judged_fingerprints=prints,
            judged_since=run.judged_since, judged_since_why=run.judged_since_why[:300])
    return judgement


def publications_reconcile() -> None:
    """Make what the collectors read in Redis match the running mirror runs: a Redis that
    restarted empty (the demo's embedded one, a failover) forgets every run, and the
    collectors would count the route's copies as unmatched for as long as the run lasts; a
    publication whose run is no longer running is taken down."""
    running = {run.route.name: run for run in ShadowRun.objects.select_related("route").filter(
        status=ShadowRun.Status.RUNNING, mode=ShadowRun.Mode.MIRROR, route__isnull=False)
        if run.route is not None}
    if running:
        # Cheap (one read, one write), and a Redis that restarted empty lost these too.
        mirror_auth.publish_quietly()
    held = live.published()
    for name, run in running.items():
        expected = live.RunConfig(run.pk, float(run.max_rps), int(run.max_tokens_per_day))
        if held.get(name) != expected:
            log.warning("shadow run %s was not published for route %s; publishing it again",
                        run.pk, name)
            _publish(run)
            if not any(live.counters(run.pk).values()):
                # Redis lost the counters too: carry on from what the judge last folded in,
                # so what comes next adds to them instead of hiding under them.
                stored = {k: int(v) for k, v in (run.counters or {}).items()
                          if k in live.COUNTER_FIELDS and int(v) > 0}
                if stored:
                    live.count(run.pk, **stored)
    for name in set(held) - set(running):
        log.warning("route %s was published for shadow run %s, which is not running; taking "
                    "it down", name, held[name].run)
        live.unpublish_run(name)


def runs_judge() -> int:
    """Beat: judge every running run; one run's failure does not stop the others. Running
    mirror runs are published again first if Redis lost them."""
    try:
        publications_reconcile()
    except Exception:
        log.exception("shadow runs could not be checked against what the collectors read")
    return _judge_each(ShadowRun.objects.filter(status=ShadowRun.Status.RUNNING))


def pool_changed(pool_id: int, changes: list[str]) -> int:
    """Fleet's report and change hooks (the pool reports an upgrade, or a registry edit
    changed its fingerprint): judge at once each running run the pool is the candidate or
    the primary of: its judgement restarts from the pairs received from now on
    (`_judging_basis`) and its `shadow` evidence is recorded on the new fingerprints now
    (`_evidence_due`), not at the next refresh up to EVIDENCE_EVERY_S later."""
    return _judge_each(ShadowRun.objects.filter(status=ShadowRun.Status.RUNNING).filter(
        Q(candidate_id=pool_id) | Q(primary_id=pool_id)).order_by("pk"))


def _judge_each(runs: Iterable[ShadowRun]) -> int:
    judged = 0
    for run in runs:
        try:
            run_judge(run=run)
            judged += 1
        except Exception:
            log.exception("shadow run %s could not be judged", run.pk)
    return judged


def _without_tokens(column: str) -> RawSQL:
    """The comparison JSON less its divergent tokens (text), in the database's own dialect:
    jsonb on PostgreSQL, the JSON1 functions on SQLite (the demo's database)."""
    if connection.vendor == "postgresql":
        return RawSQL(f"{column} - 'token_a' - 'token_b'", ())
    return RawSQL(f"json_remove({column}, '$.token_a', '$.token_b')", ())


def pairs_purge(now: datetime | None = None) -> int:
    """Beat: empty the stored text (content, and the divergent tokens in the comparisons)
    of pairs received longer ago than their run's retention. Metrics and hashes stay."""
    now = now or timezone.now()
    purged = 0
    for hours in (ShadowRun.objects.filter(pairs__content_purged_at__isnull=True)
                  .values_list("retention_hours", flat=True).distinct()):
        purged += ShadowPair.objects.filter(
            run__retention_hours=hours, content_purged_at__isnull=True,
            received_at__lt=now - timedelta(hours=hours)).update(
            content={}, content_purged_at=now,
            noise=_without_tokens("noise"), signal=_without_tokens("signal"))
    if purged:
        log.info("shadow: purged the text of %s pairs past their retention", purged)
    return purged
