"""A job's output compared with the plan's primary: a sample of its requests sent again.

Why: a candidate that answers every line of a batch job is not yet shown to answer them as
the primary would. After a job ends (task `batch.compare`), up to `job.compare_sample` of its
successful requests are sent, body unchanged, straight to the plan's primary pool (never
through a route) and each pair of answers is compared with fleetctl/inference/compare.py, the
module shadow runs and eval runs use, with the primary as the reference (a).

- The sample is deterministic: each successful request's index is ranked by a hash of
  (job id, index) and the lowest ranks are taken, so a rerun picks the same requests, and the
  results that arrive later (a rerun of a job still running) only displace members with a
  higher rank. Memory is the sample's size, whatever the job's.
- One `BatchComparison` row per (job, index), at most `compare_sample` rows per job. A rerun
  keeps every row with a primary answer and sends again only those whose call got none
  (status 0: the primary was down or timed out), so running the task twice is harmless.
- Greedy (the text itself comparable) only when the body says temperature 0, as for shadow
  pairs; otherwise only the distribution-level fields are compared (length, finish reason,
  validity, refusal, error).
- Nothing to compare (no plan, the job ran on the primary itself, a sample of 0, no successful
  request) writes nothing: `comparison_summary` says why, from the job's own fields, so the
  job page can say it without a stored message.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from django.db.models import Avg, Count, Q
from django.utils import timezone

from fleetctl.batch import inputs
from fleetctl.batch.models import BatchChunk, BatchComparison, BatchJob, BatchResult
from fleetctl.batch.services import file_path
from fleetctl.fleet.models import Pool
from fleetctl.inference import upstream
from fleetctl.inference.compare import Answer, Comparison, compare, requested_form, requested_greedy
from fleetctl.inference.confidence import Interval, wilson_interval

log = logging.getLogger(__name__)

# Requests to the primary in flight at once, at most (and never more than the job's own
# concurrency): the sample is small and the primary is serving live traffic.
MAX_PARALLEL = 8
# Rows listed on the job page, the most divergent first.
PAGE_ROWS = 50


# --- what to compare -------------------------------------------------------------------------

def _rank(job_id: int, index: int) -> bytes:
    return hashlib.blake2b(f"{job_id}:{index}".encode(), digest_size=8).digest()


def sample_indices(job: BatchJob, size: int | None = None) -> list[int]:
    """The job's sample: the `size` (default job.compare_sample) successful requests with the
    lowest hash rank, ascending by index. Streams the indices; keeps only `size` of them."""
    size = job.compare_sample if size is None else size
    if size <= 0:
        return []
    heap: list[tuple[bytes, int]] = []  # max-heap on rank via inverted bytes
    rows = (BatchResult.objects.filter(job=job, status_code__gte=200, status_code__lt=300)
            .values_list("index", flat=True).order_by())
    for index in rows.iterator(chunk_size=5000):
        key = bytes(255 - b for b in _rank(job.pk, index))
        if len(heap) < size:
            heapq.heappush(heap, (key, index))
        elif key > heap[0][0]:
            heapq.heapreplace(heap, (key, index))
    return sorted(index for _, index in heap)


def why_not(job: BatchJob) -> str:
    """Why this job's output cannot be compared with a primary, or "" when it can."""
    if job.compare_sample == 0:
        return "The job was created with a comparison sample of 0: nothing is compared."
    if job.plan_id is None:
        return ("The job has no plan, so there is no primary to compare its answers with "
                "(a job on a plan's candidate is compared with that plan's primary).")
    if "/v1/embeddings" in job.input_file.url_lines:
        return ("The job's input asks for embeddings: vectors are not compared with the "
                "primary's (the comparison reads text, finish reasons and lengths).")
    plan = job.plan
    assert plan is not None
    if job.pool_id == plan.primary_pool_id:
        return (f"The job ran on {plan.primary_pool.name}, the primary of plan {plan.name}: "
                "its answers are the reference, there is nothing to compare them with.")
    return ""


def _requests(job: BatchJob, indices: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The request bodies of `indices`, read from the input file one chunk's byte range at a
    time (inputs.read_lines), only the chunks that hold a sampled index."""
    wanted = sorted(set(indices))
    found: dict[int, dict[str, Any]] = {}
    if not wanted:
        return found
    path = file_path(job.input_file)
    chunks = (BatchChunk.objects.filter(job=job, first_index__lte=wanted[-1],
                                        last_index__gte=wanted[0]).order_by("first_index"))
    for chunk in chunks:
        mine = {i for i in wanted if chunk.first_index <= i <= chunk.last_index}
        if not mine:
            continue
        lines = inputs.read_lines(path, chunk.byte_start, chunk.byte_end,
                                  first_line=chunk.first_line)
        for index, (_, request) in enumerate(lines, start=chunk.first_index):
            if index in mine:
                body = request.get("body") if isinstance(request, dict) else None
                found[index] = body if isinstance(body, dict) else {}
            if index >= max(mine):
                break
    return found


# --- comparing ------------------------------------------------------------------------------

def _compare(primary: Answer, ours: Answer, body: Mapping[str, Any]) -> Comparison:
    greedy, options = requested_greedy(body), requested_form(body)
    try:
        return compare(primary, ours, greedy=greedy, **options)
    except Exception:  # a schema that is not one: compare without it
        return compare(primary, ours, greedy=greedy, expect_json=options["expect_json"],
                       tools=options["tools"])


def result_answer(result: BatchResult) -> Answer:
    """The job's own answer, from the stored (non-streamed) body."""
    try:
        parsed = json.loads(result.body) if result.body else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return Answer.from_error(result.status_code, code="malformed_body",
                                 message="the stored answer is not a JSON object")
    return Answer.from_body(parsed, status=result.status_code)


def _row_fields(comparison: Comparison, primary: Answer, latency_ms: float
                ) -> dict[str, Any]:
    outcome = asdict(comparison)
    similarity = (None if comparison.token_edit_distance is None
                  else round(1.0 - float(comparison.token_edit_distance), 6))
    outcome.update(identical=comparison.exact_match, token_similarity=similarity,
                   primary_latency_ms=round(latency_ms, 2))
    if primary.failed:
        outcome.update(primary_error_code=primary.error_code,
                       primary_error=(primary.error_message or "")[:300])
    return {"outcome": outcome, "identical": comparison.exact_match, "similarity": similarity,
            "primary_status": primary.status}


def _send(base_url: str, body: Mapping[str, Any], timeout_s: float) -> upstream.Reply:
    return upstream.call(base_url, body, timeout_s=timeout_s, role="primary")


def job_compare(job_id: int) -> int:
    """Compare the job's sample with the plan's primary; returns the rows written (new, or
    redone because the primary gave no answer before). 0 when there is nothing to compare
    (`why_not` says why) or every sampled request already has its comparison."""
    job = (BatchJob.objects.select_related("plan__primary_pool", "input_file", "pool")
           .get(pk=job_id))
    if why_not(job):
        log.info("batch job %s: no comparison: %s", job.pk, why_not(job))
        return 0
    assert job.plan is not None
    primary: Pool = job.plan.primary_pool
    kept = dict(BatchComparison.objects.filter(job=job).values_list("index", "primary_status"))
    answered = {i for i, status in kept.items() if status != 0}
    room = max(0, job.compare_sample - len(kept))
    todo = [i for i in sample_indices(job) if i not in answered]
    todo = [i for i in todo if i in kept] + [i for i in todo if i not in kept][:room]
    if not todo:
        return 0
    bodies = _requests(job, todo)
    results = {r.index: r for r in BatchResult.objects.filter(job=job, index__in=todo)}
    todo = [i for i in sorted(todo) if i in bodies and i in results]
    urls = list(primary.base_urls) or [""]
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, job.concurrency,
                                                   len(todo)))) as pool:
        replies = list(pool.map(
            lambda pair: _send(urls[pair[0] % len(urls)], bodies[pair[1]],
                               job.request_timeout_s),
            enumerate(todo)))
    for index, reply in zip(todo, replies, strict=True):
        fields = _row_fields(_compare(reply.answer, result_answer(results[index]),
                                      bodies[index]), reply.answer, reply.latency_ms)
        BatchComparison.objects.update_or_create(
            job=job, index=index,
            defaults={**fields, "custom_id": results[index].custom_id,
                      "primary_pool": primary, "at": timezone.now()})
    log.info("batch job %s: %d requests compared with %s", job.pk, len(todo), primary.name)
    return len(todo)


# --- for the job page, the API and the CLI --------------------------------------------------

@dataclass(frozen=True)
class ComparisonRow:
    index: int
    custom_id: str
    primary_status: int
    identical: bool | None
    similarity: float | None
    first_divergence: int | None
    diverged: bool
    note: str  # the primary's error, or why the text was not compared


@dataclass(frozen=True)
class ComparisonSummary:
    """What the job page shows about its comparison with the primary.

    `n`: rows stored; `compared`: rows whose text was compared (greedy, both answered);
    `identical`: the share of those identical to the primary's answer, with its Wilson
    interval (None with no compared row); `mean_similarity`: mean token similarity
    (1 − normalised token edit distance) over them; `primary_errors`: rows the primary did
    not answer successfully. `why_not` is set when the job cannot be compared at all;
    `pending` when it could but has not been yet."""

    n: int
    compared: int
    identical_count: int
    identical: Interval | None
    mean_similarity: float | None
    diverged: int
    primary_errors: int
    primary_pool: str
    rows: list[ComparisonRow]
    why_not: str
    pending: str

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["identical"] = None if self.identical is None else self.identical.as_dict()
        return out


def _note(row: BatchComparison) -> str:
    outcome = row.outcome or {}
    if not 200 <= row.primary_status < 300:
        label = outcome.get("primary_error_code") or (
            f"HTTP {row.primary_status}" if row.primary_status else "no answer")
        message = outcome.get("primary_error") or ""
        return f"the primary failed: {label}" + (f": {message}" if message else "")
    if not outcome.get("greedy"):
        return "not greedy (temperature is not 0): text not compared"
    return ""


def comparison_summary(job: BatchJob) -> ComparisonSummary:
    rows = BatchComparison.objects.filter(job=job)
    agg = rows.aggregate(
        n=Count("id"),
        compared=Count("id", filter=Q(identical__isnull=False)),
        same=Count("id", filter=Q(identical=True)),
        similarity=Avg("similarity", filter=Q(similarity__isnull=False)),
        errors=Count("id", filter=~Q(primary_status__gte=200, primary_status__lt=300)),
    )
    n, compared, same = agg["n"], agg["compared"], agg["same"]
    listed = [
        ComparisonRow(index=r.index, custom_id=r.custom_id, primary_status=r.primary_status,
                      identical=r.identical, similarity=r.similarity,
                      first_divergence=(r.outcome or {}).get("first_divergence"),
                      diverged=bool((r.outcome or {}).get("diverged")), note=_note(r))
        for r in rows.order_by("index")
    ]
    diverged = sum(1 for r in listed if r.diverged)
    listed.sort(key=lambda r: (not r.diverged, r.similarity if r.similarity is not None
                               else 2.0, r.index))
    reason = why_not(job)
    pending = ""
    if not reason and n == 0:
        if job.is_active:
            pending = "Compared with the primary when the job ends."
        elif not BatchResult.objects.filter(job=job, status_code__gte=200,
                                            status_code__lt=300).exists():
            pending = "No request of the job succeeded: there is no answer to compare."
        else:
            pending = "Not compared yet (the batch.compare task runs when the job ends)."
    primary = job.plan.primary_pool.name if job.plan_id and job.plan else ""
    return ComparisonSummary(
        n=n, compared=compared, identical_count=same,
        identical=wilson_interval(same, compared) if compared else None,
        mean_similarity=None if agg["similarity"] is None else float(agg["similarity"]),
        diverged=diverged, primary_errors=agg["errors"], primary_pool=primary,
        rows=listed[:PAGE_ROWS], why_not=reason, pending=pending)
