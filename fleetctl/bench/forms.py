"""Dashboard forms for benchmarks: upload or generate a trace, start a run.

They shape input (pools and traces by name, levels as a list of whole numbers, lengths as a
number, a range or JSON) and take their limits from the models; the services decide the rest
(the `jobs` permission, pools that serve the model, every line of a trace) and their errors
are put back on these forms by the views.
"""

from __future__ import annotations

import math
import re
from functools import partial
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from fleetctl.bench import traces
from fleetctl.bench.models import Run, Trace
from fleetctl.core.forms import model_form_field
from fleetctl.fleet.models import Pool

SOURCES = [("auto", "detect from the first line"), ("fleetctl", "fleetctl JSONL"),
           ("mooncake", "Mooncake JSONL"), ("azure-csv", "Azure CSV")]
LENGTH_HELP = ('A number (every request the same), a range such as 64-512 (uniform), or JSON, '
               'e.g. {"kind": "lognormal", "median": 800, "sigma": 0.9}.')


_run_field = partial(model_form_field, Run)


def length_spec(text: str) -> Any:
    try:
        return traces.length_spec(text)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc


def levels_list(text: str) -> list[int]:
    """'1, 4, 16' → [1, 4, 16]; anything that is not a whole number ≥ 1 is named."""
    levels = []
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        if not re.fullmatch(r"\d+", part) or int(part) < 1:
            raise ValidationError(f"Levels are whole numbers ≥ 1 separated by commas, e.g. "
                                  f"1, 4, 16, 64; {part!r} is not one.")
        levels.append(int(part))
    return levels


def speeds_list(text: str) -> list[float]:
    """'0.5, 1, 2' → [0.5, 1.0, 2.0]; anything that is not a number in (0, 1000] is named."""
    speeds = []
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value) or not 0 < value <= 1000:
            raise ValidationError(f"Trace speeds are numbers > 0 and ≤ 1000 separated by "
                                  f"commas, e.g. 0.5, 1, 2 (1 = the trace's own timing); "
                                  f"{part!r} is not one.")
        speeds.append(value)
    return speeds


class TraceUploadForm(forms.Form):
    name = forms.SlugField(max_length=63, help_text="Lowercase letters, digits and hyphens.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    source = forms.ChoiceField(choices=SOURCES, initial="auto", label="Format")
    file = forms.FileField(allow_empty_file=True, help_text=(
        "fleetctl JSONL, Mooncake JSONL or Azure CSV (see TRACES.md). Read line by line as it "
        "is stored; every bad line is reported with its number and nothing is kept."))


class TraceGenerateForm(forms.Form):
    ARRIVALS = [("poisson", "Poisson"), ("constant", "constant (evenly spaced)"),
                ("bursty", "bursty (Gamma gaps)")]

    name = forms.SlugField(max_length=63)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    n = forms.IntegerField(min_value=1, max_value=1_000_000, initial=1000,
                           label="Requests")
    seed = forms.IntegerField(initial=0, help_text="The same seed gives the same trace.")
    prompt_tokens = forms.CharField(initial="128-1024", help_text=LENGTH_HELP,
                                    label="Prompt tokens")
    completion_tokens = forms.CharField(initial="64-256", help_text=LENGTH_HELP,
                                        label="Completion tokens")
    arrival = forms.ChoiceField(choices=ARRIVALS, initial="poisson")
    rate = forms.FloatField(min_value=0.001, initial=10.0, label="Rate (requests/s)")
    burstiness = forms.FloatField(min_value=0.01, required=False, help_text=(
        "Bursty only: 1 is Poisson, below 1 burstier, above 1 more even."))
    shared_prefix_groups = forms.IntegerField(min_value=0, initial=0, help_text=(
        "Shared system prompts: how many groups; set the tokens too."))
    shared_prefix_tokens = forms.IntegerField(min_value=0, initial=0)
    latency_class = forms.ChoiceField(required=False, choices=[
        ("", "— none —"), ("interactive", "interactive"), ("standard", "standard"),
        ("batch", "batch")])

    def clean_prompt_tokens(self) -> Any:
        return length_spec(self.cleaned_data["prompt_tokens"])

    def clean_completion_tokens(self) -> Any:
        return length_spec(self.cleaned_data["completion_tokens"])

    def service_kwargs(self) -> dict[str, Any]:
        data = self.cleaned_data
        arrival: dict[str, Any] = {"kind": data["arrival"], "rate": data["rate"]}
        if data["arrival"] == "bursty":
            arrival["burstiness"] = data.get("burstiness") or 1.0
        return {"name": data["name"], "description": data["description"], "n": data["n"],
                "seed": data["seed"], "prompt_tokens": data["prompt_tokens"],
                "completion_tokens": data["completion_tokens"], "arrival": arrival,
                "shared_prefix_groups": data["shared_prefix_groups"],
                "shared_prefix_tokens": data["shared_prefix_tokens"],
                "latency_class": data["latency_class"] or None}


class PoolChoiceField(forms.ModelMultipleChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        return (f"{obj.name} — {obj.accelerator}, {obj.region.code}, "
                f"{obj.node_hourly_rate} {obj.currency}/h")


class TraceChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.name} — {obj.requests:,} requests over {obj.duration_s:,.0f} s"


class RunForm(forms.Form):
    name = forms.CharField(max_length=100, required=False,
                           help_text="Optional, e.g. mi300x-vs-h200-chat.")
    trace = TraceChoiceField(queryset=Trace.objects.none(), to_field_name="name",
                             empty_label="— the requests to replay —")
    pools = PoolChoiceField(queryset=Pool.objects.none(), to_field_name="name",
                            widget=forms.CheckboxSelectMultiple, help_text=(
                                "Several pools are measured in one job, taking turns level by "
                                "level, and shown side by side."))
    model_id = forms.CharField(max_length=200, label="Model",
                               help_text="Every chosen pool must serve it.")
    slo_ttft_p95_ms = _run_field("slo_ttft_p95_ms", label="SLO: TTFT p95 (ms)")
    slo_tpot_p95_ms = _run_field("slo_tpot_p95_ms", label="SLO: TPOT p95 (ms)")
    slo_error_rate = _run_field("slo_error_rate", label="SLO: error rate (0–0.5)")
    timing = forms.ChoiceField(choices=Run.Timing.choices, initial=Run.Timing.CONCURRENCY,
                               required=False,  # absent: fixed concurrency
                               widget=forms.RadioSelect, label="Load", help_text=(
                                   "Fixed concurrency: N streams, each sending its next request "
                                   "when the last one ends. Trace timing: requests sent at the "
                                   "trace's own arrival times, scaled by each speed."))
    speeds = forms.CharField(required=False, label="Trace speeds", initial="0.5, 1, 2",
                             help_text="Trace timing only: speed factors, e.g. 0.5, 1, 2 "
                                       "(1 = as recorded, 2 = twice as fast).")
    mode = forms.ChoiceField(choices=Run.Mode.choices, initial=Run.Mode.SEARCH,
                             widget=forms.RadioSelect)
    levels = forms.CharField(required=False, label="Levels", initial="1, 4, 16, 64",
                             help_text="Fixed list only: concurrency levels, e.g. 1, 4, 16, 64.")
    max_concurrency = _run_field("max_concurrency", label="Max concurrency",
                                 help_text="Search only: the ceiling (fixed list: the "
                                           "highest level allowed).")
    warmup_s = _run_field("warmup_s", label="Warm-up per level (s)")
    window_s = _run_field("window_s", label="Steady-state window (s)")
    ramp_s = _run_field("ramp_s", label="Start ramp (s)",
                        help_text="Fixed concurrency: the streams' first requests are spread "
                                  "over this many seconds (at most the warm-up). Blank: half "
                                  "the warm-up.")
    min_samples = _run_field("min_samples", label="Minimum samples per level",
                             help_text="Fewer measured requests: the level is insufficient.")
    shards = _run_field("shards", label="Client processes (shards)")
    lag_limit_ms = _run_field("lag_limit_ms", label="Client lag limit (ms)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["trace"].queryset = Trace.objects.order_by("name")  # type: ignore[attr-defined]
        self.fields["pools"].queryset = (  # type: ignore[attr-defined]
            Pool.objects.select_related("region").order_by("name"))

    def clean_levels(self) -> list[int]:
        return levels_list(self.cleaned_data.get("levels") or "")

    def clean_timing(self) -> str:
        return self.cleaned_data.get("timing") or Run.Timing.CONCURRENCY

    def clean_speeds(self) -> list[float]:
        if self.data.get(self.add_prefix("timing")) != Run.Timing.TRACE:
            return []  # the field is only read for trace timing
        return speeds_list(self.cleaned_data.get("speeds") or "")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("timing") == Run.Timing.TRACE:
            if "speeds" in data and not data["speeds"]:
                self.add_error("speeds", "Trace timing needs at least one speed, e.g. 0.5, 1, 2.")
            for unused in ("levels", "mode"):  # not read for trace timing
                self.errors.pop(unused, None)
            return data
        if data.get("mode") == Run.Mode.LEVELS and "levels" in data and not data["levels"]:
            self.add_error("levels", "A fixed list needs at least one level, e.g. 1, 4, 16.")
        return data

    def service_kwargs(self) -> dict[str, Any]:
        data = dict(self.cleaned_data)
        data["pools"] = list(data["pools"])
        if data["timing"] == Run.Timing.TRACE:
            data["mode"], data["levels"] = Run.Mode.LEVELS, []
            data["ramp_s"] = None  # not read for trace timing (no streams to stagger)
            return data
        data["speeds"] = []
        if data["mode"] != Run.Mode.LEVELS:
            data["levels"] = []
        return data
