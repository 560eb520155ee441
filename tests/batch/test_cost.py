"""The cost arbitrage (fleetctl/batch/cost.py): the measured cost per 1M output tokens from a
soak's finished jobs and the pool's hourly rate, against the plan's prediction — in one
currency, or through a stated dated rate; never two currencies as one number.

The soak's jobs here are rows as finished jobs leave them (tokens and times chosen so the
arithmetic is exact); test_soak.py runs real ones."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from fleetctl.batch.cost import cost_per_1m, plan_arbitrage
from fleetctl.batch.models import BatchChunk, BatchComparison, BatchFile, BatchJob, Soak
from fleetctl.fleet.services import currency_rate_create
from migrations_plan import services as plans
from tests.conftest import SYSTEM
from tests.migrations_plan.conftest import world  # noqa: F401  (the plan fixture)

pytestmark = pytest.mark.django_db


def finished_job(soak: Soak, *, output_tokens: int, busy_s: float, drill: str = "") -> BatchJob:
    end = timezone.now()
    job = BatchJob.objects.create(
        input_file=soak.input_file, pool=soak.pool, plan=soak.plan, soak=soak, total=100,
        created_by="system:batch-soak", expires_at=end + timedelta(hours=1),
        state=BatchJob.State.COMPLETED, started_at=end - timedelta(seconds=busy_s),
        finished_at=end, drill=drill)
    BatchChunk.objects.create(job=job, number=0, first_index=0, last_index=99, first_line=1,
                              byte_start=0, byte_end=1, state=BatchChunk.State.DONE,
                              succeeded=100, output_tokens=output_tokens)
    return job


@pytest.fixture
def soaked(world):  # noqa: F811
    """A plan whose candidate (10.50 USD/h) ran a soak of one job: 35,000 output tokens in
    100 s = 350 tok/s, so 10.50 / (350 × 3600) × 1e6 = 8.3333 USD per 1M output tokens."""
    plan = world.plan()
    batch_file = BatchFile.objects.create(name="in.jsonl", sha256="0" * 64, path="x.jsonl",
                                          size_bytes=1, requests=100)
    now = timezone.now()
    soak = Soak.objects.create(plan=plan, pool=world.candidate, input_file=batch_file,
                               every_s=60, duration_s=600, started_at=now - timedelta(hours=1),
                               ends_at=now, state=Soak.State.PASSED, created_by="alice")
    finished_job(soak, output_tokens=35_000, busy_s=100)
    return world, plan, soak


def predict(people, plan, amount: str, currency: str) -> None:
    plans.plan_update(actor=people.actor("lead"), plan=plan, predicted_cost_per_1m=amount,
                      predicted_cost_currency=currency, predicted_cost_source="capacity plan")
    plan.refresh_from_db()


def test_the_formula_is_the_benchmarks():
    # One formula (fleetctl/fleet/costs.py): the pool's benchmark cost and the soak's measured
    # cost cannot drift apart.
    from fleetctl.bench.stats import cost_per_1m as benchmark_cost

    assert benchmark_cost is cost_per_1m
    assert cost_per_1m("10.50", 350) == Decimal("8.3333")


def test_same_currency_pass_and_fail_with_the_margin(soaked):
    people, plan, soak = soaked
    predict(people, plan, "8.50", "USD")
    answer = plan_arbitrage(plan, soak)
    assert answer.status == "pass" and answer.verdict == "pass"
    assert answer.measured == Decimal("8.3333") and answer.measured_currency == "USD"
    assert answer.output_tokens == 35_000 and answer.busy_seconds == pytest.approx(100)
    assert answer.conversion == ""
    assert "8.3333 USD" in answer.message and "8.50 USD" in answer.message

    predict(people, plan, "8.00", "USD")
    answer = plan_arbitrage(plan, soak)
    assert answer.status == "fail" and answer.verdict == "fail"
    assert "over the predicted 8.00 USD" in answer.message

    plans.plan_update(actor=people.actor("lead"), plan=plan, cost_margin_pct=5)
    plan.refresh_from_db()
    answer = plan_arbitrage(plan, soak)  # limit 8.40
    assert answer.status == "pass" and answer.limit == Decimal("8.4000")


def test_two_currencies_without_a_rate_are_not_compared(soaked):
    people, plan, soak = soaked
    predict(people, plan, "7.80", "EUR")
    answer = plan_arbitrage(plan, soak)
    assert answer.status == "insufficient" and answer.verdict == "info"
    assert answer.measured == Decimal("8.3333")  # measured, in its own currency
    assert answer.measured_compared is None and answer.limit is None
    assert "no USD/EUR rate" in answer.message and "Add one" in answer.message


def test_a_stale_rate_is_refused_as_the_fleets_conversion_refuses_it(soaked):
    # One conversion (fleet/selectors.py `convert`): a rate older than the limit is no rate.
    people, plan, soak = soaked
    predict(people, plan, "7.80", "EUR")
    old = timezone.localdate() - timedelta(days=40)
    currency_rate_create(actor=SYSTEM, from_currency="USD", to_currency="EUR",
                         rate="0.90", as_of=old, source="ECB")
    answer = plan_arbitrage(plan, soak)
    assert answer.status == "insufficient" and answer.measured_compared is None
    assert f"is as of {old:%Y-%m-%d}, 40 days before the measurement (limit 31)" \
        in answer.message
    assert answer.message.startswith("Measured 8.3333 USD per 1M output tokens, predicted")


def test_a_stated_conversion_through_the_newest_rate_either_direction(soaked):
    people, plan, soak = soaked
    predict(people, plan, "7.80", "EUR")
    today = timezone.localdate()
    currency_rate_create(actor=SYSTEM, from_currency="EUR", to_currency="USD",
                         rate="1.08", as_of=today - timedelta(days=3), source="ECB")
    answer = plan_arbitrage(plan, soak)
    # 8.3333 USD ÷ 1.08 = 7.7160 EUR ≤ 7.80 EUR
    assert answer.status == "pass"
    assert answer.measured_compared == Decimal("7.7160")
    assert answer.conversion == (f"1 USD = 0.925926 EUR, rate of "
                                 f"{today - timedelta(days=3):%Y-%m-%d} (the inverse of "
                                 f"1.08 USD/EUR)")
    assert "7.716 EUR" in answer.message and answer.conversion in answer.message
    assert answer.as_json()["conversion_rate"]["inverted"] is True

    currency_rate_create(actor=SYSTEM, from_currency="USD", to_currency="EUR",
                         rate="0.95", as_of=today - timedelta(days=1), source="ECB")
    answer = plan_arbitrage(plan, soak)  # the newer, direct rate: 8.3333 × 0.95 = 7.9166
    assert answer.status == "fail"
    assert answer.measured_compared == Decimal("7.9166")
    assert answer.conversion == f"1 USD = 0.95 EUR, rate of {today - timedelta(days=1):%Y-%m-%d}"


def test_a_drill_job_is_left_out_of_the_measured_cost(soaked):
    people, plan, soak = soaked
    predict(people, plan, "8.50", "USD")
    drill = finished_job(soak, output_tokens=35_000, busy_s=400, drill="kill-worker")
    answer = plan_arbitrage(plan, soak)
    assert answer.measured == Decimal("8.3333") and answer.left_out == [drill.pk]
    assert answer.status == "pass"


def test_nothing_to_judge_says_what_is_missing(soaked):
    people, plan, soak = soaked
    answer = plan_arbitrage(plan, soak)
    assert answer.status == "insufficient" and "has no predicted cost" in answer.message
    predict(people, plan, "8.50", "USD")
    empty = Soak.objects.create(plan=plan, pool=soak.pool, input_file=soak.input_file,
                                every_s=60, duration_s=600, ends_at=timezone.now(),
                                created_by="alice")
    answer = plan_arbitrage(plan, empty)
    assert answer.status == "insufficient"
    assert "no completed job with output tokens" in answer.message
    # Without a soak named, the plan's newest soak with a completed job is measured.
    assert plan_arbitrage(plan).soak_id == soak.pk


def test_a_new_prediction_judges_the_last_soak_again_and_the_check_follows_it(soaked):
    # Stage 3's check reads the newest cost-arbitrage row: changing the prediction after the
    # soak records a new one against the prediction now in force, never the stale verdict.
    from migrations_plan import evidence as ev
    from migrations_plan.models import Evidence

    people, plan, soak = soaked

    def check() -> str:
        return str(next(o for o in ev.evaluate_gate(plan, stage=3).outcomes
                        if o.check.key == "cost-arbitrage").status)

    predict(people, plan, "8.50", "USD")
    assert check() == ev.PASS
    predict(people, plan, "8.00", "USD")
    rows = Evidence.objects.filter(kind="cost-arbitrage", pool=soak.pool).order_by("id")
    assert [r.verdict for r in rows] == ["pass", "fail"]
    assert "judged again" in rows.last().source
    assert check() == ev.FAIL
    plans.plan_update(actor=people.actor("lead"), plan=plan, notes="no cost change")
    assert rows.count() == 2  # other terms do not touch the arbitrage


# --- per successful task (Plan.cost_unit) -------------------------------------------------------

def _with_failures(soak: Soak, *, succeeded: int, failed: int, retries: int) -> None:
    """The soak's one job: `succeeded` of its custom_ids answered, `failed` not, after
    `retries` retried attempts (the 35,000 output tokens are the successes')."""
    BatchChunk.objects.filter(job__soak=soak).update(succeeded=succeeded, failed=failed,
                                                     retries=retries)


def test_per_successful_task_counts_failures_and_retries_and_passes_or_fails(soaked):
    people, plan, soak = soaked
    predict(people, plan, "8.50", "USD")
    _with_failures(soak, succeeded=80, failed=20, retries=30)
    plans.plan_update(actor=people.actor("lead"), plan=plan, cost_unit="per_successful_task")
    plan.refresh_from_db()
    answer = plan_arbitrage(plan, soak)
    # Spend: 10.50 USD/h × 100 s = 0.29166667 USD, ÷ 80 custom_ids that succeeded.
    assert answer.unit == "per_successful_task"
    assert answer.spend == Decimal("0.29166667") and answer.measured == Decimal("0.00364583")
    assert (answer.succeeded, answer.failed, answer.retries) == (80, 20, 30)
    # Predicted: 8.50 per 1M × 35,000 / 80 = 437.5 output tokens per succeeded task.
    assert answer.output_tokens_per_success == 437.5
    assert answer.predicted == Decimal("0.00371875") and answer.predicted_per_1m == Decimal("8.5")
    assert answer.measured_per_1m == Decimal("8.3333")  # beside it, as ever
    assert answer.status == "pass" and answer.limit == Decimal("0.00371875")
    assert answer.message.startswith("Measured 0.00364583 USD per successful task, within "
                                     "the predicted 0.00371875 USD")
    assert "÷ 80 custom_ids that succeeded (20 failed, 30 retries)" in answer.message
    data = answer.as_json()
    assert (data["unit"], data["measured"], data["predicted"], data["predicted_cost_per_1m"],
            data["measured_cost_per_1m"], data["succeeded"], data["spend"]) == (
        "per_successful_task", "0.00364583", "0.00371875", "8.5000", "8.3333", 80, "0.29166667")

    # The same spend over fewer successes: each costs more, over the prediction (which
    # follows the successes' own tokens: 35,000 / 60 per task).
    _with_failures(soak, succeeded=60, failed=40, retries=90)
    answer = plan_arbitrage(plan, soak)
    assert answer.measured == Decimal("0.00486111")  # 0.29166667 ÷ 60
    assert answer.predicted == Decimal("0.00495833")  # 8.50 × 583.33 / 1e6
    assert answer.status == "pass"
    predict(people, plan, "8.00", "USD")
    answer = plan_arbitrage(plan, soak)
    assert answer.status == "fail" and answer.predicted == Decimal("0.00466667")
    assert "over the predicted 0.00466667 USD" in answer.message
    # Nothing succeeded: not judged, said.
    _with_failures(soak, succeeded=0, failed=100, retries=0)
    answer = plan_arbitrage(plan, soak)
    assert answer.status == "insufficient" and answer.measured is None
    assert "no completed job with a custom_id that succeeded" in answer.message


def test_per_task_a_wordier_candidate_fails_what_per_1m_passes(soaked):
    # The candidate is cheaper per token (8.3333 against a predicted 8.50 per 1M) but says
    # twice what the primary says per task: its compared pairs hold 400 tokens against the
    # primary's 200. Per task the prediction is at the primary's length, so it fails.
    people, plan, soak = soaked
    predict(people, plan, "8.50", "USD")
    _with_failures(soak, succeeded=80, failed=20, retries=30)
    job = soak.jobs.get()
    pairs = [(200, {"tokens_a": 150, "tokens_b": 300}), (200, {"tokens_a": 250, "tokens_b": 500}),
             # Not counted: the primary failed, or one side errored.
             (500, {"tokens_a": 1, "tokens_b": 900}),
             (200, {"tokens_a": 10, "tokens_b": 900, "errored_b": True})]
    for index, (status, outcome) in enumerate(pairs):
        BatchComparison.objects.create(job=job, index=index, custom_id=f"r{index}",
                                       primary_pool=plan.primary_pool, primary_status=status,
                                       outcome=outcome)
    assert plan_arbitrage(plan, soak).status == "pass"  # per 1M
    plans.plan_update(actor=people.actor("lead"), plan=plan, cost_unit="per_successful_task")
    plan.refresh_from_db()
    answer = plan_arbitrage(plan, soak)
    assert (answer.primary_length_ratio, answer.compared_pairs) == (0.5, 2)
    # 35,000 tokens / 80 successes = 437.5 per task; at the primary's length 218.75;
    # 8.50 per 1M × 218.75 / 1e6 = 0.00185938 against 0.29166667 / 80 = 0.00364583 spent.
    assert answer.predicted == Decimal("0.00185938") and answer.measured == Decimal("0.00364583")
    assert answer.status == "fail", answer.message
    assert "218.8 output tokens per task at the primary's length" in answer.message
    assert answer.as_json()["primary_length_ratio"] == 0.5


def test_the_unit_through_the_api_rejudges_and_a_bad_one_changes_nothing(soaked, client_for):
    from migrations_plan.models import Evidence, Plan

    people, plan, soak = soaked
    predict(people, plan, "8.00", "USD")  # a per-1M row: 8.3333 > 8.00, fail
    _with_failures(soak, succeeded=80, failed=20, retries=30)
    def rows() -> Any:
        return Evidence.objects.filter(kind="cost-arbitrage", pool=soak.pool).order_by("id")

    assert [(r.verdict, r.data["unit"]) for r in rows()] == [("fail", "per_1m_output_tokens")]
    lead = client_for("platform-lead", username="dora")
    url = f"/api/v1/plans/{plan.name}/"
    bad = lead.patch(url, {"cost_unit": "per_request", "cost_margin_pct": 10}, format="json")
    assert bad.status_code == 400
    [message] = bad.json()["error"]["fields"]["cost_unit"]
    assert message.startswith('Unknown cost unit "per_request"; one of per_1m_output_tokens, '
                              'per_successful_task')
    fresh = Plan.objects.get(pk=plan.pk)
    assert (fresh.cost_unit, fresh.cost_margin_pct) == ("per_1m_output_tokens", 0)
    assert rows().count() == 1
    with pytest.raises(Exception, match="Unknown cost unit 'per_request'"):
        plans.plan_update(actor=people.actor("lead"), plan=plan, cost_unit="per_request")

    answer = lead.patch(url, {"cost_unit": "per_successful_task", "cost_margin_pct": 5},
                        format="json")
    assert answer.status_code == 200, answer.json()
    assert answer.json()["cost_unit"] == "per_successful_task"
    # Judged again in the new unit and recorded: 0.00364583 ≤ 0.0035 × 1.05 = 0.003675.
    newest = rows().last()
    assert rows().count() == 2 and newest.verdict == "pass"
    assert newest.data["unit"] == "per_successful_task"
    assert newest.data["limit"] == "0.00367500"
    assert newest.source == (f"batch soak {soak.pk}, judged again: the plan's cost unit "
                             f"changed to per successful task")
    # The soak page and the plan's stage-3 panel say the unit.
    page = lead.get(f"/batch/soaks/{soak.pk}/").content.decode()
    assert "Measured, per successful task" in page and "80 custom_ids that succeeded" in page
