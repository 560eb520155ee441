"""A plan's business case inputs (docs/cost.md, "The business case"): the ops burden of a
second backend as engineer-weeks per year, row by row, the cost of an engineer-year, the
volume the plan expects, and an override reason (capacity or residency). The verdict is
computed from these and the plan's benchmark evidence (case.py); the last verdict is kept
here so a change of it can be recorded on the plan's timeline."""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from fleetctl.fleet.models import CURRENCIES
from migrations_plan.models import Plan

# The seed's table ("The ops burden nobody budgets for"), its seven rows: field, title, what
# it means, and the default engineer-weeks per year with why.
BURDEN_ROWS: list[tuple[str, str, str, Decimal, str]] = [
    ("driver_runtime_weeks", "Driver and runtime matrix",
     "kernel, driver, runtime and framework versions kept jointly compatible per vendor, "
     "re-verified on every upgrade", Decimal("6.0"),
     "platform team, continuously: about one week per quarterly upgrade plus drift"),
    ("images_weeks", "Per-vendor container images",
     "a second image lineage to build, scan, sign and patch; its own CVE triage",
     Decimal("4.0"), "build and security, every release: a few days per monthly release"),
    ("quantisation_weeks", "Quantisation artefacts",
     "formats and kernels differ per backend; each checkpoint re-quantised and re-checked",
     Decimal("4.0"), "ML engineering, every model update: about one week per update, 4 a year"),
    ("numerics_weeks", "Divergent numerics",
     "the full evaluation suite run and its divergences triaged per backend per release",
     Decimal("4.0"), "evaluation, per backend per release"),
    ("observability_weeks", "Observability parity",
     "device metrics, memory accounting, failure signatures, dashboards and alert thresholds",
     Decimal("3.0"), "SRE, once per backend plus drift: the once is spread over the years"),
    ("oncall_weeks", "On-call mental models",
     "responders trained on a second set of failure modes, runbooks kept current",
     Decimal("4.0"), "everyone on the rota, permanently: a few hours each per month"),
    ("forecasting_weeks", "Capacity forecasting",
     "a second quota conversation, commitment structure and renewal cycle",
     Decimal("2.0"), "whoever owns the budget, per renewal"),
]
BURDEN_FIELDS = [row[0] for row in BURDEN_ROWS]
MAX_WEEKS = Decimal("52")  # one row: more than a person-year is a typo, not a burden
MAX_ENGINEER_COST = Decimal("10000000")  # per engineer-year, in any currency we know
# Expected output tokens per month, in millions: 1 thousand tokens to 10 trillion.
MIN_VOLUME_M = Decimal("0.001")
MAX_VOLUME_M = Decimal("10000000")
MAX_PEAK_DAYS = 30  # the telemetry keeps 30 days


def _weeks_field(default: Decimal) -> models.DecimalField:
    return models.DecimalField(max_digits=5, decimal_places=1, default=default,
                               validators=[MinValueValidator(Decimal("0")),
                                           MaxValueValidator(MAX_WEEKS)])


class BusinessCase(models.Model):
    class Override(models.TextChoices):
        NONE = "", "none"
        CAPACITY = "capacity", "capacity: the primary cannot be had where it is needed"
        RESIDENCY = "residency", "residency: a regulator or contract pins the jurisdiction"

    plan = models.OneToOneField(Plan, on_delete=models.CASCADE, related_name="business_case")
    driver_runtime_weeks = _weeks_field(BURDEN_ROWS[0][3])
    images_weeks = _weeks_field(BURDEN_ROWS[1][3])
    quantisation_weeks = _weeks_field(BURDEN_ROWS[2][3])
    numerics_weeks = _weeks_field(BURDEN_ROWS[3][3])
    observability_weeks = _weeks_field(BURDEN_ROWS[4][3])
    oncall_weeks = _weeks_field(BURDEN_ROWS[5][3])
    forecasting_weeks = _weeks_field(BURDEN_ROWS[6][3])
    engineer_cost_per_year = models.DecimalField(
        max_digits=12, decimal_places=2, default=Decimal("150000"),
        validators=[MinValueValidator(Decimal("1")), MaxValueValidator(MAX_ENGINEER_COST)],
        help_text="What one engineer-year costs, loaded (salary, overheads).")
    engineer_cost_currency = models.CharField(max_length=3, default="USD",
                                              choices=[(c, c) for c in CURRENCIES])
    expected_mtokens_per_month = models.DecimalField(
        max_digits=14, decimal_places=3, null=True, blank=True,
        validators=[MinValueValidator(MIN_VOLUME_M), MaxValueValidator(MAX_VOLUME_M)],
        help_text="Output tokens per month the plan expects to move, in millions.")
    override = models.CharField(max_length=10, choices=Override.choices, blank=True,
                                default="")
    override_reason = models.TextField(blank=True, help_text=(
        "Why capacity or residency decides regardless of cost (required with an override)."))
    peak_days = models.PositiveSmallIntegerField(
        default=7, validators=[MinValueValidator(1), MaxValueValidator(MAX_PEAK_DAYS)],
        help_text="Days of live telemetry the peak demand is taken over.")
    # The last judgment recorded (services.business_case_judge).
    verdict = models.CharField(max_length=20, blank=True, editable=False)
    verdict_text = models.TextField(blank=True, editable=False)
    judged_at = models.DateTimeField(null=True, blank=True, editable=False)
    updated_by = models.CharField(max_length=150, blank=True, editable=False)
    updated_at = models.DateTimeField(default=timezone.now, editable=False)

    def __str__(self) -> str:
        return f"business case of {self.plan.name}"

    @property
    def burden_weeks(self) -> Decimal:
        return sum((getattr(self, name) for name in BURDEN_FIELDS), Decimal("0"))
