from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

# Residency is decided by jurisdiction, never by region name. Codes are ISO-3166 alpha-2,
# plus EU for the union's common regime.
JURISDICTIONS: dict[str, str] = {
    "AE": "United Arab Emirates", "AU": "Australia", "BR": "Brazil", "CA": "Canada",
    "CH": "Switzerland", "CN": "China", "DE": "Germany", "EU": "European Union",
    "FR": "France", "IN": "India", "JP": "Japan", "KR": "South Korea", "SA": "Saudi Arabia",
    "SG": "Singapore", "UK": "United Kingdom", "US": "United States", "ZA": "South Africa",
}
CURRENCIES = ("USD", "EUR", "GBP", "INR", "JPY", "SGD", "CHF", "AUD", "CAD")

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$",
    "Use 1–63 lowercase letters, digits and hyphens, starting with a letter or digit.",
)
model_id_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$",
    "A model id is letters, digits and . _ : / @ + - (no spaces), as callers send it.",
)


def validate_base_urls(value: object) -> None:
    from urllib.parse import urlsplit

    from fleetctl.core.destinations import host_spelling_problem

    if not isinstance(value, list) or not value:
        raise ValidationError("Give at least one base URL, as a list.")
    if len(value) > 16:
        raise ValidationError("At most 16 base URLs per pool.")
    for url in value:
        if not isinstance(url, str) or len(url) > 300:
            raise ValidationError(f"{url!r} is not a URL string of at most 300 characters.")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValidationError(f"{url!r}: only http:// and https:// endpoints are supported.")
        if not parts.hostname:
            raise ValidationError(f"{url!r} has no host name.")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValidationError(f"{url!r} has an invalid port.") from exc
        if parts.query or parts.fragment:
            raise ValidationError(f"{url!r}: a base URL takes no query or fragment.")
        if parts.username or parts.password:
            raise ValidationError(f"{url!r}: a base URL carries no user name or password.")
        # One spelling per address, so that residency compares servers, not strings.
        problem = host_spelling_problem(parts.hostname)
        if problem:
            raise ValidationError(f"{url!r}: {problem}.")
    if len(set(value)) != len(value):
        raise ValidationError("The same base URL is listed twice.")


def endpoint_key(url: str) -> str:
    """One spelling per endpoint URL, for display and for matching what a gateway reports:
    scheme, lower-case host, explicit port, path without a trailing slash. Whether two URLs
    reach the same *server* (residency) is core.destinations.same_server_keys: by address."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    port = port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}" \
           f"{parts.path.rstrip('/')}"


def validate_labels(value: object) -> None:
    if not isinstance(value, dict):
        raise ValidationError(
            'Labels are an object of text keys and values, e.g. {"driver": "550"}.'
        )
    if len(value) > 50:
        raise ValidationError("At most 50 labels.")
    for key, item in value.items():
        if not isinstance(item, str) or not key or len(key) > 63 or len(item) > 200:
            raise ValidationError(
                f"Label {key!r}: keys are 1–63 characters and values are text up to 200."
            )


# Names that would collide with dashboard paths (/pools/new/).
RESERVED_POOL_NAMES = frozenset({"new"})


def validate_pool_name(value: str) -> None:
    if value in RESERVED_POOL_NAMES:
        raise ValidationError(f"{value!r} is reserved; pick another pool name.")


RECLAIMS_MAX = 720  # reclaims a month: one an hour is the most a reclaim model may expect


class Region(models.Model):
    code = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=100)
    jurisdiction = models.CharField(
        max_length=2, choices=sorted(JURISDICTIONS.items()),
        help_text="Where data may legally be processed; residency pins match on this.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return f"{self.code} ({self.jurisdiction})"


class Pool(models.Model):
    class Runtime(models.TextChoices):
        CUDA = "cuda", "NVIDIA CUDA"
        ROCM = "rocm", "AMD ROCm"
        TPU = "tpu", "Google TPU"
        GAUDI = "gaudi", "Intel Gaudi"
        OTHER = "other", "other"

    class LatencyClass(models.TextChoices):
        INTERACTIVE = "interactive", "interactive"
        STANDARD = "standard", "standard"
        BATCH = "batch", "batch"

    class Health(models.TextChoices):
        UNKNOWN = "unknown", "unknown"
        HEALTHY = "healthy", "healthy"
        UNHEALTHY = "unhealthy", "unhealthy"

    name = models.CharField(
        max_length=63, unique=True, validators=[slug_validator, validate_pool_name]
    )
    runtime = models.CharField(max_length=8, choices=Runtime.choices)
    runtime_version = models.CharField(max_length=64, blank=True)
    accelerator = models.CharField(max_length=64, help_text="e.g. H200, MI300X, TPU v5e")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="pools")
    base_urls = models.JSONField(validators=[validate_base_urls])
    latency_class = models.CharField(
        max_length=12, choices=LatencyClass.choices, default=LatencyClass.STANDARD
    )
    max_context_tokens = models.PositiveIntegerField(validators=[MinValueValidator(256)])
    node_hourly_rate = models.DecimalField(
        max_digits=12, decimal_places=4, validators=[MinValueValidator(Decimal("0"))]
    )
    currency = models.CharField(max_length=3, choices=[(c, c) for c in CURRENCIES], default="USD")
    labels = models.JSONField(default=dict, blank=True, validators=[validate_labels])
    # Interruptible capacity (spot, preemptible): the provider may reclaim a node. Its tax
    # (fleet/interruption.py) prices each reclaim with the pool's own measured drill and the
    # standby kept, and goes into every cost figure of the pool. Blank when not interruptible.
    interruptible = models.BooleanField(
        default=False, help_text="The provider may reclaim its nodes (spot, preemptible).")
    reclaims_per_month = models.DecimalField(
        max_digits=6, decimal_places=2, null=True, blank=True,
        help_text="Expected reclaims a month (above 0, at most 720: one an hour); "
                  "interruptible pools only.")
    standby_pct = models.DecimalField(
        max_digits=5, decimal_places=2, null=True, blank=True,
        help_text="Idle capacity kept beside the serving capacity to absorb a reclaim, in % "
                  "of it (0-100; 25 = one spare node per four); interruptible pools only.")

    # Derived from the latest passing benchmark; never typed in (bench services set it).
    cost_per_1m_output_tokens = models.DecimalField(
        max_digits=14, decimal_places=4, null=True, blank=True, editable=False
    )
    cost_measured_at = models.DateTimeField(null=True, blank=True, editable=False)
    # What the cost was computed with: a later change of the hourly rate or the currency
    # leaves the cost stale (`cost_stale_reason`) until a benchmark measures it again.
    cost_hourly_rate = models.DecimalField(
        max_digits=12, decimal_places=4, null=True, blank=True, editable=False
    )
    cost_currency = models.CharField(max_length=3, blank=True, editable=False)
    cost_source = models.CharField(max_length=100, blank=True, editable=False,
                                   help_text='Where the cost comes from, e.g. "run #12".')

    # Health, kept on the row so lists never scan the history.
    health_state = models.CharField(
        max_length=10, choices=Health.choices, default=Health.UNKNOWN, editable=False
    )
    health_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    consecutive_failures = models.PositiveIntegerField(default=0, editable=False)
    consecutive_successes = models.PositiveIntegerField(default=0, editable=False)
    last_probe_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_probe_latency_ms = models.FloatField(null=True, blank=True, editable=False)
    last_probe_error = models.TextField(blank=True, editable=False)
    # What the pool's servers last reported of themselves (fleet/probe.py: server version,
    # each model's max_model_len), kept across probes that report nothing; `reported_at`:
    # when what they report last changed (an upgrade nobody registered shows here first).
    reported = models.JSONField(default=dict, blank=True, editable=False)
    reported_at = models.DateTimeField(null=True, blank=True, editable=False)

    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(node_hourly_rate__gte=0), name="pool_rate_not_negative"
            ),
            models.CheckConstraint(
                condition=models.Q(interruptible=False, reclaims_per_month__isnull=True,
                                   standby_pct__isnull=True)
                | models.Q(interruptible=True, reclaims_per_month__gt=0,
                           reclaims_per_month__lte=RECLAIMS_MAX, standby_pct__gte=0,
                           standby_pct__lte=100),
                name="pool_reclaim_model_valid"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """An interruptible pool needs its reclaim model; another pool has none (cleared)."""
        if not self.interruptible:
            self.reclaims_per_month = self.standby_pct = None
            return
        errors = {}
        if self.reclaims_per_month is None:
            errors["reclaims_per_month"] = (
                "An interruptible pool needs its expected reclaims a month (above 0, at most "
                "720), e.g. 4 for about one a week.")
        elif not 0 < Decimal(str(self.reclaims_per_month)) <= RECLAIMS_MAX:
            errors["reclaims_per_month"] = (
                f"Reclaims a month must be above 0 and at most {RECLAIMS_MAX} (one an hour); "
                f"got {self.reclaims_per_month}.")
        if self.standby_pct is None:
            errors["standby_pct"] = (
                "An interruptible pool needs the standby it keeps to absorb a reclaim, in % "
                "of its capacity (0-100; 0 for none).")
        elif not 0 <= Decimal(str(self.standby_pct)) <= 100:
            errors["standby_pct"] = (f"Standby must be between 0 and 100 %; got "
                                     f"{self.standby_pct}.")
        if errors:
            raise ValidationError(errors)

    @property
    def jurisdiction(self) -> str:
        return self.region.jurisdiction

    @property
    def cost_stale_reason(self) -> str | None:
        """Why the derived cost no longer describes the pool (its hourly rate or currency
        changed since the benchmark it comes from), or None."""
        return cost_stale_reason(
            cost=self.cost_per_1m_output_tokens, rate_then=self.cost_hourly_rate,
            currency_then=self.cost_currency, rate_now=self.node_hourly_rate,
            currency_now=self.currency, source=self.cost_source)


def money(value: Decimal | str | float | None) -> str:
    """A rate or price as people write it: at least two decimals, no trailing zeros beyond
    them (39.8000 -> 39.80, 1.08500000 -> 1.085)."""
    if value is None:
        return "—"
    number = Decimal(str(value))
    text = format(number.normalize(), "f")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"


def cost_stale_reason(*, cost: object, rate_then: Decimal | str | None, currency_then: str,
                      rate_now: Decimal | str, currency_now: str, source: str = "") -> str | None:
    """Why a cost computed at `rate_then` `currency_then` no longer holds at the rate now."""
    if cost is None or rate_then is None or not currency_then:
        return None
    after = f" after {source}" if source else ""
    if currency_then != currency_now:
        return (f"currency changed from {currency_then} to {currency_now}{after} (the cost was "
                f"computed at {money(rate_then)} {currency_then}/h); re-run the benchmark")
    if Decimal(str(rate_then)) != Decimal(str(rate_now)):
        return (f"hourly rate changed from {money(rate_then)} to {money(rate_now)} "
                f"{currency_now}{after}; re-run the benchmark")
    return None


class CurrencyRate(models.Model):
    """One dated exchange rate: 1 `from_currency` = `rate` `to_currency` as of a day. Costs of
    pools in different currencies are compared only through these rows, never as raw
    numbers."""

    from_currency = models.CharField(max_length=3, choices=[(c, c) for c in CURRENCIES])
    to_currency = models.CharField(max_length=3, choices=[(c, c) for c in CURRENCIES])
    rate = models.DecimalField(
        max_digits=18, decimal_places=8, validators=[MinValueValidator(Decimal("0.00000001"))],
        help_text="How many to_currency one from_currency buys, e.g. 1.08 (USD per EUR).",
    )
    as_of = models.DateField(help_text="The day the rate is for.")
    source = models.CharField(max_length=200, blank=True,
                              help_text="Where the rate comes from, e.g. a central bank's "
                                        "reference rate.")
    created_by = models.CharField(max_length=150, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-as_of", "from_currency", "to_currency", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["from_currency", "to_currency", "as_of"],
                                    name="one_rate_per_pair_and_day"),
            models.CheckConstraint(condition=models.Q(rate__gt=0), name="rate_positive"),
            models.CheckConstraint(condition=~models.Q(from_currency=models.F("to_currency")),
                                   name="rate_between_two_currencies"),
        ]

    def __str__(self) -> str:
        return f"{self.label} as of {self.as_of:%Y-%m-%d}"

    @property
    def label(self) -> str:
        """"1.08 USD/EUR": to-currency per one from-currency."""
        return f"{money(self.rate)} {self.to_currency}/{self.from_currency}"

    def clean(self) -> None:
        if self.from_currency and self.from_currency == self.to_currency:
            raise ValidationError({"to_currency": "A rate is between two different currencies."})


class PoolModel(models.Model):
    """A model a pool serves, with the revision and quantisation it serves it at."""

    class Quantisation(models.TextChoices):
        BF16 = "bf16", "bf16"
        FP16 = "fp16", "fp16"
        FP8 = "fp8", "fp8"
        INT8 = "int8", "int8 (W8A8)"
        INT4_AWQ = "int4-awq", "int4 AWQ"
        INT4_GPTQ = "int4-gptq", "int4 GPTQ"
        GGUF = "gguf", "GGUF"
        OTHER = "other", "other"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="models")
    model_id = models.CharField(max_length=200, validators=[model_id_validator])
    revision = models.CharField(max_length=100, blank=True, help_text="e.g. a commit hash")
    quantisation = models.CharField(
        max_length=12, choices=Quantisation.choices, default=Quantisation.BF16
    )
    weight_format = models.CharField(max_length=32, blank=True, help_text="e.g. safetensors")
    max_context_tokens = models.PositiveIntegerField(validators=[MinValueValidator(256)])
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["pool__name", "model_id"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "model_id"], name="one_entry_per_pool_model"),
        ]

    def __str__(self) -> str:
        return f"{self.model_id} on {self.pool.name}" if self.pool_id else self.model_id

    def clean(self) -> None:
        if self.pool_id and self.max_context_tokens and (
            self.max_context_tokens > self.pool.max_context_tokens
        ):
            raise ValidationError({
                "max_context_tokens": (
                    f"{self.max_context_tokens} exceeds the pool's maximum context "
                    f"({self.pool.max_context_tokens})."
                )
            })


class HealthCheck(models.Model):
    """One probe of one pool. Pruned after HEALTH_HISTORY_DAYS."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="health_checks")
    checked_at = models.DateTimeField(default=timezone.now)
    ok = models.BooleanField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    models_seen = models.JSONField(default=list, blank=True)
    reported = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-checked_at", "-id"]
        indexes = [models.Index(fields=["pool", "-checked_at"])]

    def __str__(self) -> str:
        return f"{self.pool_id} {'ok' if self.ok else 'fail'} at {self.checked_at:%H:%M:%S}"


class HealthTransition(models.Model):
    """A flip of a pool's health state: the history people ask about after an incident."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="health_transitions")
    at = models.DateTimeField(default=timezone.now)
    from_state = models.CharField(max_length=10, choices=Pool.Health.choices)
    to_state = models.CharField(max_length=10, choices=Pool.Health.choices)
    reason = models.TextField(blank=True)
    health_check = models.ForeignKey(
        HealthCheck, on_delete=models.SET_NULL, null=True, blank=True
    )

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["pool", "-at"])]

    def __str__(self) -> str:
        return f"{self.pool_id}: {self.from_state} → {self.to_state}"
