from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleetctl.batch.models import (
    DEFAULT_CHUNK_SIZE,
    BatchComparison,
    BatchFile,
    BatchJob,
    BatchJobEvent,
    BatchResend,
)
from fleetctl.core.api.fields import StrictCharField
from fleetctl.core.api.schema import ObjectField
from fleetctl.fleet.api.serializers import TaskCostSerializer
from fleetctl.fleet.models import Pool


class BatchFileSerializer(serializers.ModelSerializer):
    url_lines = ObjectField(read_only=True, help_text=(
        "Each endpoint the file's requests name, with the first line naming it."))
    model_lines = ObjectField(read_only=True, help_text=(
        "Each model the file's requests name, with the first line naming it: a job on a "
        "pool that does not serve one is refused naming that line."))

    class Meta:
        model = BatchFile
        fields = ["id", "name", "sha256", "size_bytes", "requests", "url_lines", "model_lines",
                  "uploaded_by", "created_at"]
        read_only_fields = fields


class FileUploadSerializer(serializers.Serializer):
    file = serializers.FileField(
        allow_empty_file=True,  # the service says "the file holds no requests"
        help_text="OpenAI Batch JSONL: one request per line ({custom_id, method: POST, url, "
                  "body}). Read line by line as it is stored; every bad line reported with "
                  "its number (up to 20), nothing kept.")
    name = StrictCharField(required=False, allow_blank=True, max_length=200,
                           help_text="Default: the uploaded file's name.")


OPTION_HELP = {
    "concurrency": "Requests in flight at once, at most (1-256; default 8).",
    "rate_limit_rps": "Requests started per second, at most (at least 0.01; null: no limit).",
    "completion_window_s": "The job expires this long after it is created (10 s to 7 days; "
                           "default 86400); its partial output stays downloadable.",
    "chunk_size": "Requests per chunk, the unit a worker claims (1-10000; default 1000).",
    "max_attempts": "Tries per request on 429, 5xx and transport errors (1-20; default 5).",
    "request_timeout_s": "Seconds to wait for one answer (1-3600; default 120).",
    "drill": "An interruption drill: kill-worker or fault-pool (default none).",
    "drill_at": "The drill fires once this share of requests is done (0.05-0.95; default "
                "0.4).",
    "compare_sample": "Requests whose answers are compared with the plan's primary (0-500; "
                      "default 20).",
}


class JobCreateSerializer(serializers.Serializer):
    """Either `input_file` (an uploaded file's id; JSON or form) or `file` (multipart: upload
    and create in one step)."""

    input_file = serializers.PrimaryKeyRelatedField(
        queryset=BatchFile.objects.filter(deleted_at__isnull=True), required=False,
        allow_null=True,
        help_text="The id of an input file uploaded to /api/v1/batch/files/.")
    file = serializers.FileField(required=False, allow_empty_file=True, help_text=(
        "Multipart only: the input file itself, uploaded and validated in the same request "
        "(nothing is kept if the job is refused)."))
    name = StrictCharField(required=False, allow_blank=True, max_length=200,
                           help_text="With `file`: the stored file's name (default the "
                                     "upload's).")
    pool = serializers.SlugRelatedField(slug_field="name", queryset=Pool.objects.all(),
                                        help_text="The pool to run on (its name).")
    concurrency = serializers.IntegerField(required=False, default=8,
                                           help_text=OPTION_HELP["concurrency"])
    rate_limit_rps = serializers.FloatField(required=False, allow_null=True, default=None,
                                            help_text=OPTION_HELP["rate_limit_rps"])
    completion_window_s = serializers.IntegerField(required=False, default=86400,
                                                   help_text=OPTION_HELP["completion_window_s"])
    chunk_size = serializers.IntegerField(required=False, default=DEFAULT_CHUNK_SIZE,
                                          help_text=OPTION_HELP["chunk_size"])
    max_attempts = serializers.IntegerField(required=False, default=5,
                                            help_text=OPTION_HELP["max_attempts"])
    request_timeout_s = serializers.FloatField(required=False, default=120,
                                               help_text=OPTION_HELP["request_timeout_s"])
    drill = serializers.ChoiceField(choices=BatchJob.Drill.choices, required=False,
                                    allow_blank=True, default="",
                                    help_text=OPTION_HELP["drill"])
    drill_at = serializers.FloatField(required=False, default=0.4,
                                      help_text=OPTION_HELP["drill_at"])
    compare_sample = serializers.IntegerField(required=False, default=20,
                                              help_text=OPTION_HELP["compare_sample"])

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [key for key in ("input_file", "file") if attrs.get(key) is not None]
        if len(given) != 1:
            raise serializers.ValidationError({"input_file": [
                "Give input_file (the id of an uploaded file) or file (a multipart upload), "
                "one of them." if not given else
                "Give input_file or file, not both."]})
        return attrs


class JobEditSerializer(serializers.Serializer):
    concurrency = serializers.IntegerField(required=False, allow_null=True, default=None,
                                           help_text="New concurrency (1-256).")
    rate_limit_rps = serializers.FloatField(required=False, allow_null=True, default=None,
                                            help_text="New rate limit (requests/s; 0: no "
                                                      "limit).")
    reason = serializers.CharField(max_length=2000, help_text="Goes in the job's timeline "
                                                              "and the audit log.")


class JobActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, help_text="Goes in the job's timeline "
                                                              "and the audit log.")


class BatchProgressSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    done = serializers.IntegerField(help_text="Requests with a result (durable).")
    fraction = serializers.FloatField()
    error_rate = serializers.FloatField(allow_null=True)
    retries = serializers.IntegerField()
    resends = serializers.IntegerField(help_text="Requests possibly sent twice: in flight "
                                                 "when a chunk's holder lost its lease.")
    duplicates_refused = serializers.IntegerField(help_text="Second result writes the "
                                                            "database refused.")
    prompt_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    chunks = serializers.IntegerField()
    chunks_done = serializers.IntegerField()
    chunks_running = serializers.IntegerField()
    elapsed_s = serializers.FloatField(allow_null=True)
    requests_per_s = serializers.FloatField(allow_null=True)
    output_tokens_per_s = serializers.FloatField(allow_null=True)
    eta_s = serializers.FloatField(allow_null=True)


class BatchJobSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name", read_only=True)
    plan = serializers.CharField(source="plan.name", read_only=True, allow_null=True)
    input_file = serializers.IntegerField(source="input_file_id", read_only=True)
    input_file_name = serializers.CharField(source="input_file.name", read_only=True)
    soak = serializers.IntegerField(source="soak_id", read_only=True, allow_null=True)
    evidence = serializers.IntegerField(source="evidence_id", read_only=True,
                                        allow_null=True)

    class Meta:
        model = BatchJob
        fields = ["id", "public_id", "state", "state_reason", "input_file", "input_file_name",
                  "pool", "plan", "soak", "total", "concurrency", "rate_limit_rps",
                  "completion_window_s", "chunk_size", "max_attempts", "request_timeout_s",
                  "drill", "drill_at", "compare_sample", "created_by", "created_at",
                  "started_at", "finished_at", "expires_at", "drill_fired_at", "drill_worker",
                  "drill_resumed_at", "drill_verdict", "drill_summary", "evidence",
                  "duplicates_refused"]
        read_only_fields = fields


class BatchJobDetailSerializer(BatchJobSerializer):
    progress = BatchProgressSerializer(read_only=True, help_text="From the chunks' counters.")
    task_cost = TaskCostSerializer(
        read_only=True, help_text="Cost per custom_id that succeeded: the pool's hourly rate × "
                                  "the job's busy time ÷ its successes (failures, retries "
                                  "and resends counted in the spend).")
    output_url = serializers.SerializerMethodField()
    errors_url = serializers.SerializerMethodField()

    class Meta(BatchJobSerializer.Meta):
        fields = [*BatchJobSerializer.Meta.fields, "progress", "task_cost", "output_url",
                  "errors_url"]
        read_only_fields = fields

    def get_output_url(self, job: BatchJob) -> str:
        return f"/api/v1/batch/jobs/{job.pk}/output/"

    def get_errors_url(self, job: BatchJob) -> str:
        return f"/api/v1/batch/jobs/{job.pk}/errors/"


class BatchJobEventSerializer(serializers.ModelSerializer):
    data = ObjectField(read_only=True)  # type: ignore[assignment]

    class Meta:
        model = BatchJobEvent
        fields = ["id", "at", "kind", "actor", "manual", "message", "data"]
        read_only_fields = fields


class BatchResendSerializer(serializers.ModelSerializer):
    class Meta:
        model = BatchResend
        fields = ["id", "index", "custom_id", "previous_owner", "new_owner", "at"]
        read_only_fields = fields


class BatchComparisonSerializer(serializers.ModelSerializer):
    primary_pool = serializers.CharField(source="primary_pool.name", read_only=True)
    outcome = ObjectField(read_only=True)

    class Meta:
        model = BatchComparison
        fields = ["id", "index", "custom_id", "primary_pool", "primary_status", "identical",
                  "similarity", "outcome", "at"]
        read_only_fields = fields
