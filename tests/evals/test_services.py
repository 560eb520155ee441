"""Eval suites and runs through their services, without a worker: uploads are all-or-nothing
and pinned by their canonical bytes (same content, same version; new content, the next one),
retiring, looking a suite up; run_create's refusals (each naming its field, nothing stored)
and the rows it makes (items x pools, interleaved); cancelling; finishing (statistics,
verdict, summary, evidence of the right kinds)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from fleetctl.evals import services, suites
from fleetctl.evals.models import EvalItem, EvalResult, EvalRun, EvalRunPool, EvalSuite
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from migrations_plan import evidence as ev
from migrations_plan.models import Evidence, Plan
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db

SYSTEM = Actor.for_system("eval-services-test")


def item(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": f"add-{i:03d}", "messages": [{"role": "user", "content": f"What is {i}+{i}?"}],
            "references": [str(2 * i)], "scorer": "numeric",
            "tags": ["arithmetic", f"parity:{'even' if i % 2 == 0 else 'odd'}"], **extra}


def jsonl(objs: list[Any], header: dict[str, Any] | None = None, **dumps: Any) -> io.BytesIO:
    lines = ([json.dumps(header, **dumps)] if header else []) + [json.dumps(o, **dumps)
                                                                  for o in objs]
    return io.BytesIO(("\n".join(lines) + "\n").encode())


HEADER = {"fleetctl_eval_suite": 1, "description": "additions",
          "decoding": {"temperature": 0, "seed": 7, "max_tokens": 16}}


def upload(name: str = "adds", n: int = 10, **kwargs: Any) -> tuple[EvalSuite, bool]:
    return services.suite_upload(actor=SYSTEM, name=name,
                                 fileobj=jsonl([item(i) for i in range(n)], HEADER), **kwargs)


# --- suites -----------------------------------------------------------------------------------

def test_an_upload_stores_the_items_pinned_by_the_sha256_of_their_canonical_bytes():
    suite, created = upload(n=12)
    assert created and (suite.name, suite.version, suite.item_count) == ("adds", 1, 12)
    assert suite.source == "uploaded" and suite.created_by == SYSTEM.label
    assert suite.decoding == {"max_tokens": 16, "seed": 7, "temperature": 0.0}
    assert suite.tags == {"arithmetic": 12, "parity:even": 6, "parity:odd": 6}
    assert suite.scorers == {"numeric": 12}
    rows = list(EvalItem.objects.filter(suite=suite).order_by("position"))
    assert [r.item_id for r in rows] == [f"add-{i:03d}" for i in range(12)]
    assert rows[3].references == ["6"] and rows[3].params["abs_tol"] == 0
    data = services.suite_jsonl(suite)
    assert suites.digest(data) == suite.sha256
    again = suites.parse_suite(io.BytesIO(data))
    assert [i.item_id for i in again.items] == [r.item_id for r in rows]
    event = AuditEvent.objects.get(action="eval_suite.create")
    assert event.after["sha256"] == suite.sha256 and event.after["items"] == 12


def test_the_same_content_written_differently_is_the_same_version():
    first, created = upload(n=5)
    # Keys in another order, other spacing, a default written out: the same suite.
    objs = [{**dict(reversed(list(item(i).items()))), "params": {"abs_tol": 0}}
            for i in range(5)]
    same, created_again = services.suite_upload(
        actor=SYSTEM, name="adds", fileobj=jsonl(objs, HEADER, indent=None,
                                                 separators=(" ,", " : ")))
    assert created and not created_again
    assert same.pk == first.pk and EvalSuite.objects.count() == 1
    assert EvalItem.objects.count() == 5
    assert AuditEvent.objects.filter(action="eval_suite.create").count() == 1


def test_new_content_is_the_next_version_and_the_old_one_is_kept():
    v1, _ = upload(n=5)
    v2, created = upload(n=6)
    assert created and (v1.version, v2.version) == (1, 2) and v1.sha256 != v2.sha256
    assert EvalItem.objects.filter(suite=v1).count() == 5
    assert EvalItem.objects.filter(suite=v2).count() == 6
    # Another name with the same content is its own suite, version 1.
    other, created = upload(name="adds-copy", n=5)
    assert created and other.version == 1 and other.sha256 == v1.sha256
    # Going back to the first content is the first version again.
    back, created = upload(n=5)
    assert not created and back.pk == v1.pk


def test_a_bad_line_anywhere_stores_nothing_and_every_error_names_its_line():
    objs: list[Any] = [item(i) for i in range(8)]
    objs[2] = {**item(2), "scorer": "telepathy"}
    objs[5] = {**item(5), "references": ["not a number"]}
    objs[6] = item(1)  # a duplicate id
    with pytest.raises(ValidationError) as caught:
        services.suite_upload(actor=SYSTEM, name="adds", fileobj=jsonl(objs, HEADER))
    messages = caught.value.message_dict["file"]
    assert [m.split(":")[0] for m in messages] == ["line 4", "line 7", "line 8"]
    assert "telepathy" in messages[0]
    assert "line 3" in messages[2]  # the duplicate names the first line too
    assert not EvalSuite.objects.exists() and not EvalItem.objects.exists()
    assert not AuditEvent.objects.filter(action="eval_suite.create").exists()


@pytest.mark.parametrize("body, expected", [
    (b"", "no items"),
    (b"{not json}\n", "line 1"),
    (json.dumps(HEADER).encode() + b"\n", "no items"),
    (b"\xff\xfe\n", "line 1"),
])
def test_files_that_are_not_suites_are_refused(body: bytes, expected: str):
    with pytest.raises(ValidationError) as caught:
        services.suite_upload(actor=SYSTEM, name="adds", fileobj=io.BytesIO(body))
    assert expected in " ".join(caught.value.message_dict["file"])
    assert not EvalSuite.objects.exists()


@pytest.mark.parametrize("name", ["", "Adds", "adds suite", "-adds", "a" * 64])
def test_a_bad_name_is_refused_naming_the_field(name: str):
    with pytest.raises(ValidationError) as caught:
        upload(name=name)
    assert "name" in caught.value.message_dict
    assert not EvalSuite.objects.exists()


def test_a_file_over_the_upload_limit_is_refused_before_it_is_read_whole(settings):
    settings.EVAL_MAX_UPLOAD_BYTES = 500
    with pytest.raises(ValidationError) as caught:
        upload(n=20)
    [message] = caught.value.message_dict["file"]
    assert "EVAL_MAX_UPLOAD_BYTES" in message
    assert not EvalSuite.objects.exists()


def test_more_items_than_allowed_is_refused(settings):
    settings.EVAL_MAX_SUITE_ITEMS = 3
    with pytest.raises(ValidationError) as caught:
        upload(n=5)
    assert "line" in caught.value.message_dict["file"][0]
    assert not EvalSuite.objects.exists()


def test_an_upload_needs_the_jobs_permission(make_user):
    viewer = Actor(user=make_user("vic", "viewer"))
    with pytest.raises(PermissionDeniedError):
        services.suite_upload(actor=viewer, name="adds", fileobj=jsonl([item(1)]))
    assert not EvalSuite.objects.exists()


def test_retiring_is_idempotent_and_lookup_skips_retired_versions():
    v1, _ = upload(n=5)
    v2, _ = upload(n=6)
    assert services.suite_lookup("adds").pk == v2.pk
    assert services.suite_lookup("adds@1").pk == v1.pk
    assert services.suite_lookup(str(v1.pk)).pk == v1.pk
    retired = services.suite_retire(actor=SYSTEM, suite=v2)
    assert retired.retired and retired.retired_by == SYSTEM.label
    again = services.suite_retire(actor=SYSTEM, suite=v2)
    assert again.retired_at == retired.retired_at
    assert AuditEvent.objects.filter(action="eval_suite.retire").count() == 1
    assert services.suite_lookup("adds").pk == v1.pk  # the newest in service
    assert services.suite_lookup("adds@2").pk == v2.pk  # named exactly: still found
    for ref in ("nope", "adds@9", "", "999999"):
        with pytest.raises(ValidationError) as caught:
            services.suite_lookup(ref)
        assert "suite" in caught.value.message_dict


def test_the_bundled_suites_install_once():
    [first] = services.suite_install_bundled(actor=SYSTEM, names=["fleetctl-choice"])
    [again] = services.suite_install_bundled(actor=SYSTEM, names=["fleetctl-choice"])
    assert first.pk == again.pk and first.version == 1 and first.item_count == 300
    assert first.source == "bundled" and first.generator["family"] == "choice"
    assert suites.digest(services.suite_jsonl(first)) == first.sha256
    with pytest.raises(ValidationError) as caught:
        services.suite_install_bundled(actor=SYSTEM, names=["fleetctl-poetry"])
    assert "names" in caught.value.message_dict


# --- runs -------------------------------------------------------------------------------------

@pytest.fixture
def pools(world: World, make_pool, system) -> dict[str, Pool]:  # noqa: F811
    other = make_pool(name="a100-us", base_urls=["http://127.0.0.1:9801",
                                                 "http://127.0.0.1:9802"])
    pool_model_create(actor=system, pool=other, model_id=MODEL, max_context_tokens=8192)
    bare = make_pool(name="no-model")
    return {"candidate": world.candidate, "primary": world.primary, "other": other,
            "bare": bare}


def lead(world: World) -> Actor:  # noqa: F811
    return world.actor("lead")


def test_a_run_has_one_pending_row_per_item_and_pool_interleaved(world, pools):  # noqa: F811
    suite, _ = upload(n=7)
    run = services.run_create(actor=lead(world), suite=suite, candidate=pools["candidate"],
                              primary=pools["primary"], others=[pools["other"]],
                              decoding={"max_tokens": 8}, concurrency=4, max_rps=20)
    assert run.status == "queued" and run.total == 21 and run.done == 0
    assert run.model_id == MODEL and run.suite_sha256 == suite.sha256
    assert run.decoding == {"max_tokens": 8, "seed": 7, "temperature": 0.0}
    assert run.plan is None and run.plan_stage is None and run.margin == 0.02
    run_pools = list(EvalRunPool.objects.filter(run=run).order_by("position"))
    assert [(rp.role, rp.pool.name) for rp in run_pools] == [
        ("candidate", "mi300x-us"), ("primary", "h200-us"), ("other", "a100-us")]
    assert run_pools[2].endpoints == ["http://127.0.0.1:9801", "http://127.0.0.1:9802"]
    assert run_pools[0].fingerprint["runtime_version"] == "rocm-6.4"
    assert run_pools[0].fingerprint["driver"] == "6.4.1"
    rows = list(EvalResult.objects.filter(run=run).order_by("position")
                .values_list("position", "item__position", "run_pool__position", "status"))
    assert [r[0] for r in rows] == list(range(21))
    assert all(pos == i * 3 + p and status == "pending" for pos, i, p, status in rows)
    event = AuditEvent.objects.get(action="eval_run.create")
    assert event.after["total"] == 21 and event.after["suite_sha256"] == suite.sha256


def test_a_plans_run_takes_its_pools_margin_and_stage(world, pools):  # noqa: F811
    plan = world.plan(quality_margin_pct=3)
    suite, _ = upload(n=4)
    run = services.run_create(actor=lead(world), suite=suite, plan=plan)
    assert run.plan == plan and run.plan_stage == 1 and run.margin == pytest.approx(0.03)
    assert {rp.role: rp.pool.pk for rp in run.run_pools.all()} == {
        "candidate": world.candidate.pk, "primary": world.primary.pk}
    assert run.total == 8


def refused(field: str, **kwargs: Any) -> str:
    runs, rows = EvalRun.objects.count(), EvalResult.objects.count()
    with pytest.raises(ValidationError) as caught:
        services.run_create(**kwargs)
    assert field in caught.value.message_dict, caught.value.message_dict
    assert (EvalRun.objects.count(), EvalResult.objects.count()) == (runs, rows)
    return " ".join(caught.value.message_dict[field])


def test_run_create_refuses_what_cannot_run_naming_the_field(world, pools):  # noqa: F811
    suite, _ = upload(n=4)
    base = {"actor": lead(world), "suite": suite, "candidate": pools["candidate"]}
    # A pool that does not serve the model, by its role.
    message = refused("others", **base, primary=pools["primary"], others=[pools["bare"]],
                      model_id=MODEL)
    assert "no-model does not serve" in message
    message = refused("primary", **base, primary=pools["bare"])
    assert "no-model does not serve" in message
    assert "does not serve" in refused("candidate", **base, model_id="other-model")
    # The same pool twice.
    assert "named twice" in refused("primary", **base, primary=pools["candidate"])
    assert "named twice" in refused("others", **base, primary=pools["primary"],
                                    others=[pools["other"], pools["other"]])
    # No endpoints to send to.
    Pool.objects.filter(pk=pools["other"].pk).update(base_urls=[])
    assert "no endpoints" in refused("others", **base, others=[Pool.objects.get(
        pk=pools["other"].pk)])
    # Settings out of range, decoding that is not decoding.
    assert refused("concurrency", **base, concurrency=0)
    assert refused("max_attempts", **base, max_attempts=11)
    assert "decoding.top_k" in refused("decoding", **base, decoding={"top_k": 5})
    assert "decoding.temperature" in refused("decoding", **base, decoding={"temperature": 9})
    # No candidate and no plan.
    assert refused("candidate", actor=lead(world), suite=suite)
    # A retired suite.
    services.suite_retire(actor=SYSTEM, suite=suite)
    assert "retired" in refused("suite", **base)


def test_a_plans_run_refuses_other_pools_and_another_margin(world, pools):  # noqa: F811
    plan = world.plan()
    suite, _ = upload(n=4)
    base = {"actor": lead(world), "suite": suite, "plan": plan}
    assert "migrates to mi300x-us" in refused("candidate", **base, candidate=pools["other"])
    assert "primary is h200-us" in refused("primary", **base, primary=pools["other"])
    assert "quality margin" in refused("margin", **base, margin=0.5)
    # The plan's own pools named again are fine.
    run = services.run_create(**base, candidate=world.candidate, primary=world.primary)
    assert run.total == 8


def test_starting_a_run_needs_the_jobs_permission(world, pools):  # noqa: F811
    suite, _ = upload(n=4)
    with pytest.raises(PermissionDeniedError):
        services.run_create(actor=world.actor("viewer"), suite=suite,
                            candidate=pools["candidate"])
    assert not EvalRun.objects.exists()


def test_cancelling_a_queued_run_once(world, pools):  # noqa: F811
    suite, _ = upload(n=4)
    run = services.run_create(actor=lead(world), suite=suite, candidate=pools["candidate"],
                              primary=pools["primary"])
    cancelled = services.run_cancel(actor=lead(world), run=run)
    assert cancelled.status == "cancelled" and cancelled.cancelled_by == "bob"
    assert cancelled.finished_at is not None
    assert AuditEvent.objects.filter(action="eval_run.cancel").count() == 1
    with pytest.raises(ConflictError):
        services.run_cancel(actor=lead(world), run=run)
    # A cancelled run is not driven: the runner does not take it.
    assert services.run_execute(run_id=run.pk).status == "cancelled"  # type: ignore[union-attr]
    assert not EvalResult.objects.filter(run=run).exclude(status="pending").exists()


# --- finishing --------------------------------------------------------------------------------

def answered(run: EvalRun, wrong: dict[str, set[int]]) -> EvalRun:
    """Every row answered as the runner writes it; item i wrong on the pools listed."""
    EvalRun.objects.filter(pk=run.pk).update(status="running", started_at=timezone.now())
    for row in EvalResult.objects.filter(run=run).select_related("run_pool", "item"):
        bad = row.item.position in wrong.get(row.run_pool.role, set())
        EvalResult.objects.filter(pk=row.pk).update(
            status="done", score=0.0 if bad else 1.0, text="x", http_status=200,
            scored_at=timezone.now())
    EvalRun.objects.filter(pk=run.pk).update(done=run.total)
    return EvalRun.objects.get(pk=run.pk)


def test_finishing_a_plans_run_records_eval_evidence_about_the_candidate(world, pools):  # noqa: F811
    plan = world.plan()
    suite, _ = upload(n=40)
    run = services.run_create(actor=lead(world), suite=suite, plan=plan, min_items=10)
    done = services.run_finish(answered(run, {"candidate": {1, 2}, "primary": {3}}))
    assert done.status == "complete" and done.finished_at is not None
    assert done.verdict in ("pass", "warn", "fail")
    assert done.summary.startswith("candidate − primary −2.5 pts [")
    assert done.summary.endswith(f"on 40 items; {done.verdict} (margin 2 pts)")
    assert done.stats["paired"]["n"] == 40
    assert set(done.stats["pools"]) == {"mi300x-us", "h200-us"}
    evidence = Evidence.objects.get(pk=done.evidence_id)
    assert (evidence.kind, evidence.pool_id) == ("eval", world.candidate.pk)
    assert evidence.source == f"eval run {run.pk}" and evidence.url == f"/evals/runs/{run.pk}/"
    assert evidence.model_id == MODEL and evidence.route == world.route
    data = evidence.data
    assert (data["run"], data["suite"], data["suite_version"], data["suite_sha256"]) == (
        run.pk, "adds", 1, suite.sha256)
    assert (data["candidate"], data["primary"], data["model"], data["stage"]) == (
        "mi300x-us", "h200-us", MODEL, 1)
    assert data["items"] == 40 and data["source"] == "eval" and data["margin"] == 0.02
    assert set(data["fingerprints"]) == {"mi300x-us", "h200-us"}
    assert done.live_evidence_id is None
    assert not Evidence.objects.filter(kind="live-quality").exists()
    # Finishing again does nothing more.
    assert services.run_finish(done).evidence_id == done.evidence_id
    assert Evidence.objects.filter(kind="eval").count() == 1


def test_a_run_made_in_stage_4_records_eval_never_live_quality(world, pools):  # noqa: F811
    """A fixed suite run while the plan is live is not live traffic: it records `eval` only,
    and stage 4's "Quality unchanged on live traffic" stays without evidence (only a stage-4
    shadow run of mirrored live requests feeds it)."""
    plan = world.plan()
    Plan.objects.filter(pk=plan.pk).update(stage=4, state="stage-4")
    plan = Plan.objects.get(pk=plan.pk)
    suite, _ = upload(n=20)
    run = services.run_create(actor=lead(world), suite=suite, plan=plan, min_items=5)
    assert run.plan_stage == 4
    done = services.run_finish(answered(run, {}))
    assert done.verdict in ("pass", "warn")  # 20 items: the interval is wide
    assert done.live_evidence_id is None
    assert not Evidence.objects.filter(kind="live-quality").exists()
    assert Evidence.objects.get(pk=done.evidence_id).kind == "eval"
    quality = ev.evaluate_gate(plan, stage=4).outcomes
    assert [o.status for o in quality if o.check.key == "quality"] == [ev.INSUFFICIENT]


def test_a_run_without_a_primary_records_no_evidence(world, pools):  # noqa: F811
    suite, _ = upload(n=10)
    run = services.run_create(actor=lead(world), suite=suite, candidate=pools["candidate"])
    done = services.run_finish(answered(run, {"candidate": {0}}))
    assert done.status == "complete" and done.verdict == "insufficient"
    assert done.evidence_id is None and not Evidence.objects.exists()
    assert "no primary" in done.summary


def test_a_cancelled_run_is_not_finished(world, pools):  # noqa: F811
    suite, _ = upload(n=10)
    run = services.run_create(actor=lead(world), suite=suite, candidate=pools["candidate"],
                              primary=pools["primary"])
    answered(run, {})
    services.run_cancel(actor=lead(world), run=run)
    done = services.run_finish(EvalRun.objects.get(pk=run.pk))
    assert done.status == "cancelled" and not done.verdict and done.evidence_id is None


# --- reads (selectors) ------------------------------------------------------------------------

def test_the_item_diff_is_the_items_scored_differently_side_by_side(
        world, pools, django_assert_max_num_queries):  # noqa: F811
    from fleetctl.evals import selectors

    suite, _ = upload(n=12)
    run = services.run_create(actor=lead(world), suite=suite, candidate=pools["candidate"],
                              primary=pools["primary"], others=[pools["other"]])
    answered(run, {"candidate": {1, 2, 5}, "primary": {2, 7}, "other": {0}})
    run = selectors.run_get(run.pk)
    with django_assert_max_num_queries(2):
        page = list(selectors.diff(run))
        rows = selectors.diff_rows(run, page)
    assert [(r["item"], r["direction"], r["delta"]) for r in rows] == [
        ("add-001", "regressed", -1.0), ("add-005", "regressed", -1.0),
        ("add-007", "improved", 1.0)]  # item 2: both wrong, item 0: only another pool
    first = rows[0]
    assert first["candidate"]["pool"] == "mi300x-us" and first["primary"]["pool"] == "h200-us"
    assert (first["candidate"]["score"], first["primary"]["score"]) == (0.0, 1.0)
    assert first["prompt"] == "What is 1+1?" and first["references"] == ["2"]
    assert [r.item.item_id for r in selectors.diff(run, direction="improved")] == ["add-007"]
    assert [r.item.item_id for r in selectors.diff(run, tag="parity:odd")] == [
        "add-001", "add-005", "add-007"]
    assert not selectors.diff(run, tag="parity").exists()  # a tag matches whole
    assert [r.item.item_id for r in selectors.diff(run, q="5+5")] == ["add-005"]
    assert selectors.diff_counts(run) == {"regressed": 2, "improved": 1}
    with pytest.raises(ValueError):
        selectors.diff(run, direction="sideways")
    alone = services.run_create(actor=lead(world), suite=suite, candidate=pools["candidate"])
    assert not selectors.diff(selectors.run_get(alone.pk)).exists()


def test_progress_and_results_read_in_a_bounded_number_of_queries(
        world, pools, django_assert_max_num_queries):  # noqa: F811
    from fleetctl.evals import selectors

    suite, _ = upload(n=30)
    for _ in range(3):
        run = services.run_create(actor=lead(world), suite=suite,
                                  candidate=pools["candidate"], primary=pools["primary"])
    EvalResult.objects.filter(run=run, position__lt=10).update(status="done", score=1.0)
    EvalResult.objects.filter(run=run, position__in=(3, 4)).update(error="timeout", score=0.0)
    EvalResult.objects.filter(run=run, position__in=(10, 11)).update(status="claimed")
    with django_assert_max_num_queries(3):
        listed = list(selectors.runs(pool="h200-us"))
        assert [[rp.pool.name for rp in selectors.run_pools(r)] for r in listed] == [
            ["mi300x-us", "h200-us"]] * 3
    run = selectors.run_get(run.pk)
    with django_assert_max_num_queries(1):
        progress = selectors.progress(run)
    assert (progress["done"], progress["claimed"], progress["pending"], progress["total"]) == (
        10, 2, 48, 60)
    assert progress["pools"][0] == {"pool": "mi300x-us", "role": "candidate",
                                    "endpoints": list(pools["candidate"].base_urls),
                                    "done": 5, "mean": pytest.approx(0.8), "errors": 1,
                                    "pending": 24, "claimed": 1}
    with django_assert_max_num_queries(1):
        got = list(selectors.results(run, pool="h200-us", tag="parity:even"))
        assert {r.run_pool.pool.name for r in got} == {"h200-us"}
    assert [r.item.item_id for r in got] == [f"add-{i:03d}" for i in range(0, 30, 2)]
    assert selectors.suite_items(suite, tag="parity:odd").count() == 15
    assert list(selectors.suites(retired=False)) == [suite]
    with pytest.raises(Exception, match="No eval run"):
        selectors.run_get(10**9)
