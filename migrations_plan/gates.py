"""Default gate templates: the checklist to leave each stage, for the four stages.

A new plan gets a copy of these as its own `GateCheck` rows; from then on the plan's gate is
edited per plan (add, remove with a reason, change thresholds), every edit audited. Checks
whose evidence no job produces yet read "insufficient data" until one does: an approver can
still sign them off, with a written justification.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.accounts import roles


@dataclass(frozen=True)
class CheckTemplate:
    key: str
    title: str
    rule: str = ""  # evidence-backed when set
    params: dict[str, Any] = field(default_factory=dict)
    attest_role: str = ""  # attested when set


DEFAULT_GATES: dict[int, list[CheckTemplate]] = {
    1: [
        CheckTemplate("conformance", "Passes the OpenAI-contract conformance probe",
                      rule="evidence.latest", params={"kind": "conformance"}),
        CheckTemplate("only-through-route", "Callers reach the pool only through a route",
                      rule="routing.only_through_route"),
        CheckTemplate("cost-reported", "Cost per 1M output tokens is reported",
                      rule="cost.reported"),
        CheckTemplate("healthy", "Candidate healthy for 24 h", rule="pool.healthy_for",
                      params={"hours": 24}),
        CheckTemplate("same-revision", "Candidate and primary serve the same weights revision",
                      rule="models.same_revision"),
    ],
    2: [
        CheckTemplate("benchmark-slo", "Benchmark meets the SLO at a useful concurrency",
                      rule="benchmark.meets_slo", params={"min_concurrency": 8}),
        CheckTemplate("cost-vs-primary", "Cost per 1M output tokens within the margin of the "
                                         "primary's", rule="benchmark.cost_vs_primary"),
        CheckTemplate("latency-vs-primary", "TTFT and TPOT p95 within the latency margin of "
                                            "the primary's", rule="benchmark.latency_vs_primary"),
        CheckTemplate("eval", "Eval suite passes on this backend",
                      rule="evidence.latest", params={"kind": "eval"}),
        CheckTemplate("divergence", "Divergence vs primary within the noise floor plus margin",
                      rule="evidence.latest", params={"kind": "shadow"}),
        CheckTemplate("dashboards", "Dashboards and alerts exist for the candidate",
                      attest_role=roles.PLATFORM_LEAD),
    ],
    3: [
        CheckTemplate("soak", "Batch soak of 7 days with no manual intervention",
                      rule="soak.sustained", params={"min_days": 7}),
        CheckTemplate("checkpoint-resume", "Checkpoint-and-resume survived a real interruption",
                      rule="evidence.latest", params={"kind": "checkpoint-resume"}),
        CheckTemplate("cost-arbitrage", "Measured cost arbitrage matches the prediction",
                      rule="evidence.latest", params={"kind": "cost-arbitrage"}),
        CheckTemplate("incident", "On-call handled an incident on the new backend",
                      attest_role=roles.ON_CALL),
    ],
    4: [
        CheckTemplate("ramp-slo", "Per-pool percentiles hold at each ramp step",
                      rule="ramp.each_step"),
        CheckTemplate("watch-held", "Per-pool percentiles held for 7 days",
                      rule="watch.held", params={"min_days": 7}),
        # Live: the candidate carries tier traffic only from stage 4 (the stage rules give it
        # no live weight before), so this is where its routing can be probed.
        CheckTemplate("routing-policy", "Routing policy holds through the gateway (each "
                                        "tier's prompts on its pools, pinned requests in "
                                        "their jurisdiction)",
                      rule="routing.policy_holds", params={"within_days": 7}),
        CheckTemplate("quality", "Quality unchanged on live traffic (shadow of live requests)",
                      rule="evidence.latest", params={"kind": "live-quality"}),
        CheckTemplate("drain-rehearsed", "Drain rehearsed and timed within 7 days",
                      rule="drain.rehearsed", params={"within_days": 7, "max_ms": 500}),
        CheckTemplate("healthy", "Candidate healthy for 72 h", rule="pool.healthy_for",
                      params={"hours": 72}),
    ],
}
