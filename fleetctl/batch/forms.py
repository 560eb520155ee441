"""Dashboard forms for batch jobs and soaks: the new-job form (upload an input file or pick
one already uploaded, the pool, limits, the completion window, a drill, the comparison
sample), a person's actions on a job or a soak (always with a reason: they are manual
interventions), the plan page's "Start a soak", and the jobs list's filters.

The forms read what was typed; the services (fleetctl/batch/services.py, soak.py) judge it
with the database in hand (the file's lines against the pool's models, the plan's stage) and
their errors are put back on the form by the view.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from fleetctl.batch.models import ACTIVE_STATES, DEFAULT_CHUNK_SIZE, BatchFile, BatchJob
from fleetctl.core.forms import reason_field

REASON_REQUIRED = ("Say why: the reason goes in the timeline and the audit log, and a soak "
                   "counts it as a manual intervention.")
FILE_CHOICES = 50
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _reason() -> forms.CharField:
    return reason_field(error_messages={"required": REASON_REQUIRED})


def _concurrency(**kwargs: Any) -> forms.IntegerField:
    """A job's requests in flight (as BatchJob.concurrency: 1 to 256)."""
    return forms.IntegerField(label="Concurrency", min_value=1, max_value=256, **kwargs)


def _rate_limit(**kwargs: Any) -> forms.FloatField:
    """A job's requests started per second, at most; empty: no limit."""
    return forms.FloatField(label="Rate limit, requests/s", min_value=0.01, required=False,
                            **kwargs)


def parse_duration(text: str) -> int:
    """"90" or "90s", "15m", "24h", "7d" → seconds (as the CLI's --window reads them)."""
    match = _DURATION.match(text or "")
    if not match:
        raise ValidationError(f"{text!r} is not a duration: write e.g. 90s, 15m, 24h or 7d.")
    return round(float(match.group(1)) * _UNIT_S[(match.group(2) or "s").lower()])


def duration_text(seconds: int | float | None) -> str:
    """Seconds as the shortest exact duration: 86400 → "24h", 90 → "90s"."""
    if seconds is None:
        return ""
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0 and (unit != "d" or seconds >= 2 * 86400):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class DurationField(forms.Field):
    """A duration typed as "15m", "24h" (seconds in cleaned_data), within [min_s, max_s]."""

    widget = forms.TextInput

    def __init__(self, *args: Any, min_s: int, max_s: int, **kwargs: Any) -> None:
        self.min_s, self.max_s = min_s, max_s
        super().__init__(*args, **kwargs)

    def widget_attrs(self, widget: forms.Widget) -> dict[str, Any]:
        return {**super().widget_attrs(widget), "maxlength": "20", "size": "8",
                "placeholder": "e.g. 15m, 24h"}

    def to_python(self, value: Any) -> Any:
        text = str(value or "").strip()
        if not text:
            return None
        if len(text) > 20:
            raise ValidationError("Too long for a duration: write e.g. 90s, 15m, 24h or 7d.")
        seconds = parse_duration(text)
        if not self.min_s <= seconds <= self.max_s:
            raise ValidationError(f"{text} is outside {duration_text(self.min_s)} to "
                                  f"{duration_text(self.max_s)}.")
        return seconds


def _file_choices() -> list[tuple[str, str]]:
    files = (BatchFile.objects.filter(deleted_at__isnull=True)
             .order_by("-created_at", "-id")[:FILE_CHOICES])
    return [("", "— upload a file above —")] + [
        (str(f.pk), f"#{f.pk} {f.name} · {f.requests:,} requests · "
                    f"{f.created_at:%Y-%m-%d %H:%M} by {f.uploaded_by}") for f in files]


class InputFileMixin(forms.Form):
    """Either a new upload (validated whole by the service: nothing stored on a bad line) or
    a file uploaded before."""

    file = forms.FileField(
        required=False, label="Input file (JSONL)",
        help_text="OpenAI Batch format: one request a line with custom_id, method POST, url "
                  "/v1/chat/completions, /v1/completions or /v1/embeddings, and body. A bad "
                  "line refuses the whole file, named by its line number.")
    input_file = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="…or one uploaded before")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["input_file"].choices = _file_choices()  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not data.get("file") and not data.get("input_file") and "file" not in self.errors:
            self.add_error("file", "Upload an input file, or pick one uploaded before.")
        if data.get("file") and data.get("input_file"):
            self.add_error("input_file", "Upload a file or pick one, not both.")
        return data


DRILL_CHOICES = [("", "none"), ("kill-worker", "kill-worker: kill -9 the worker holding a chunk"),
                 ("fault-pool", "fault-pool: fault the pool through its fault hook")]


class JobForm(InputFileMixin):
    pool = forms.ChoiceField(label="Pool", help_text="The job runs on this pool only (pinned). "
                                                     "A stage 1–2 candidate is refused.")
    concurrency = _concurrency(initial=8, help_text="Requests in flight at once, at most.")
    rate_limit_rps = _rate_limit(help_text="Requests started per second, at most. Empty: no "
                                           "limit.")
    completion_window = DurationField(
        label="Completion window", initial="24h", min_s=10, max_s=7 * 86400,
        help_text="The job expires this long after it is created (10s to 7d); its partial "
                  "output stays downloadable.")
    drill = forms.ChoiceField(label="Interruption drill", choices=DRILL_CHOICES, required=False,
                              help_text="Interrupt the run for real mid-way and verify from "
                                        "the rows that every custom_id has exactly one result "
                                        "(checkpoint-resume evidence).")
    drill_at_pct = forms.FloatField(label="Drill point, % done", min_value=5, max_value=95,
                                    initial=40,
                                    help_text="The drill fires once this share of requests is "
                                              "done.")
    compare_sample = forms.IntegerField(
        label="Compare sample", min_value=0, max_value=500, initial=20,
        help_text="Requests whose answers are compared with the plan's primary (0: none).")
    chunk_size = forms.IntegerField(label="Chunk size", min_value=1, max_value=10_000,
                                    initial=DEFAULT_CHUNK_SIZE,
                                    help_text="Requests a worker claims at a time.")
    max_attempts = forms.IntegerField(label="Attempts per request", min_value=1, max_value=20,
                                      initial=5,
                                      help_text="On 429, 5xx and transport errors, with "
                                                "backoff.")

    field_order = ["file", "input_file", "pool", "concurrency", "rate_limit_rps",
                   "completion_window", "drill", "drill_at_pct", "compare_sample",
                   "chunk_size", "max_attempts"]

    def __init__(self, *args: Any, pools: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["pool"].choices = [(name, name) for name in pools]  # type: ignore[attr-defined]

    def service_kwargs(self) -> dict[str, Any]:
        """job_create's options (without actor, input_file and pool)."""
        data = self.cleaned_data
        return {"concurrency": data["concurrency"], "rate_limit_rps": data.get("rate_limit_rps"),
                "completion_window_s": data["completion_window"],
                "chunk_size": data["chunk_size"], "max_attempts": data["max_attempts"],
                "drill": data.get("drill") or "",
                "drill_at": round(data["drill_at_pct"] / 100, 4),
                "compare_sample": data["compare_sample"]}


class JobActionForm(forms.Form):
    ACTIONS = ("pause", "resume", "cancel")

    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS], widget=forms.HiddenInput)
    reason = _reason()


class JobEditForm(forms.Form):
    concurrency = _concurrency(required=False)
    rate_limit_rps = _rate_limit()
    reason = _reason()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("concurrency") is None and data.get("rate_limit_rps") is None and not (
                {"concurrency", "rate_limit_rps"} & set(self.errors)):
            raise ValidationError("Give a new concurrency or a new rate limit (or both).")
        return data


class JobFilterForm(forms.Form):
    state = forms.ChoiceField(required=False, choices=[
        ("", "any"), ("active", "active (queued, running or paused)"), *BatchJob.State.choices])
    pool = forms.CharField(required=False, max_length=63)

    def filters(self) -> dict[str, Any] | None:
        """The queryset filters; None when the filter cannot be read (the list shows none)."""
        if not self.is_bound:
            return {}
        if not self.is_valid():
            return None
        data = self.cleaned_data
        filters: dict[str, Any] = {}
        if data.get("state") == "active":
            filters["state__in"] = ACTIVE_STATES
        elif data.get("state"):
            filters["state"] = data["state"]
        if data.get("pool"):
            filters["pool__name"] = data["pool"]
        return filters


class SoakStartForm(InputFileMixin):
    every = DurationField(label="Every", initial="5m", min_s=10, max_s=7 * 86400,
                          help_text="A new job starts this often, once the previous one ended.")
    duration = DurationField(label="Duration", initial="7d", min_s=60, max_s=90 * 86400,
                             help_text="How long the soak runs (days in production).")
    concurrency = _concurrency(initial=8)
    rate_limit_rps = _rate_limit()
    completion_window = DurationField(label="Each job's completion window", initial="1h",
                                      min_s=10, max_s=7 * 86400)
    drill = forms.ChoiceField(label="Drill in the first job", choices=DRILL_CHOICES,
                              required=False)

    field_order = ["file", "input_file", "every", "duration", "concurrency", "rate_limit_rps",
                   "completion_window", "drill"]

    def service_kwargs(self) -> dict[str, Any]:
        """soak_create's options (without actor, plan and input_file)."""
        data = self.cleaned_data
        return {"every_s": data["every"], "duration_s": data["duration"],
                "concurrency": data["concurrency"], "rate_limit_rps": data.get("rate_limit_rps"),
                "completion_window_s": data["completion_window"],
                "drill": data.get("drill") or ""}


class SoakStopForm(forms.Form):
    reason = _reason()


class SoakEditForm(forms.Form):
    every = DurationField(label="Every", min_s=10, max_s=7 * 86400, required=False)
    duration = DurationField(label="Duration", min_s=60, max_s=90 * 86400, required=False,
                             help_text="From the soak's start.")
    concurrency = _concurrency(required=False)
    rate_limit_rps = _rate_limit()
    reason = _reason()

    def changes(self) -> dict[str, Any]:
        data = self.cleaned_data
        changes = {"every_s": data.get("every"), "duration_s": data.get("duration"),
                   "concurrency": data.get("concurrency"),
                   "rate_limit_rps": data.get("rate_limit_rps")}
        return {k: v for k, v in changes.items() if v is not None}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors and not self.changes():
            raise ValidationError("Change at least one of: every, duration, concurrency, "
                                  "rate limit.")
        return data
