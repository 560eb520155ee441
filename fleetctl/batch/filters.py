"""The FilterSets of batch jobs, input files and soaks, in one place for the API and the
dashboard (the jobs page reads its own form, which offers "active" as a state)."""

from __future__ import annotations

from django_filters import rest_framework as filters

from fleetctl.batch.models import BatchFile, BatchJob, Soak


class JobFilter(filters.FilterSet):
    state = filters.ChoiceFilter(choices=BatchJob.State.choices)
    pool = filters.CharFilter(field_name="pool__name", help_text="Pool name.")
    plan = filters.CharFilter(field_name="plan__name", help_text="Plan name.")
    soak = filters.NumberFilter(field_name="soak_id", help_text="Soak id.")
    drill = filters.ChoiceFilter(choices=[c for c in BatchJob.Drill.choices if c[0]])

    class Meta:
        model = BatchJob
        fields = ["state", "pool", "plan", "soak", "drill"]


class FileFilter(filters.FilterSet):
    name = filters.CharFilter(lookup_expr="icontains", help_text="Part of the file's name.")
    sha256 = filters.CharFilter(help_text="The file's SHA-256 (hex).")

    class Meta:
        model = BatchFile
        fields = ["name", "sha256"]


class SoakFilter(filters.FilterSet):
    state = filters.ChoiceFilter(choices=Soak.State.choices)
    plan = filters.CharFilter(field_name="plan__name", help_text="Plan name.")
    pool = filters.CharFilter(field_name="pool__name", help_text="Pool name.")

    class Meta:
        model = Soak
        fields = ["state", "plan", "pool"]
