"""The OpenAI-contract suite: a registry of cases, each saying what it sends and how it judges
the answer. `services.run_execute` runs them against every endpoint of a pool (and, side by
side, one endpoint of the reference pool); nothing here writes a row.

A case returns an `Outcome`: pass / fail / skip / error (no answer to judge), what was
expected and what came back in a sentence each, a short phrase for the run's summary, and
excerpts of the request and the response. Parity cases compare the pool under test with the
reference pool and are skipped when there is none.

Required cases are the contract callers rely on (`REQUIRED_BY_DEFAULT`); the others are
optional (a failure makes the verdict *warn*). A run may require more (`required_keys`).
The saturation case floods the pool and only runs when a run asks for it.

The modules: `probe` (the requests, Outcome, Probe), `registry` (Case, the `case` and
`parity_case` decorators, the judging helpers), then the cases by family. A case runs in the
order its module is imported below, and that order is the run's.
"""

# Each family registers its cases as it loads: this order is the run's.
# isort: off
from fleetctl.conformance.cases import completions, structured, errors, parity  # noqa: F401
# isort: on
from fleetctl.conformance.cases.probe import (
    CITY_SCHEMA,
    ERROR,
    EXCERPT_CHARS,
    FAIL,
    MESSAGES,
    PARITY_MESSAGES,
    PASS,
    PROMPT,
    SATURATION_REQUESTS,
    SATURATION_WAVES,
    SKIP,
    TIME_TOOL,
    UNKNOWN_MODEL,
    WEATHER_TOOL,
    Outcome,
    Probe,
)
from fleetctl.conformance.cases.registry import (
    CASES,
    Case,
    Judge,
    by_key,
    case,
    parity_case,
    sse_events,
)
from fleetctl.conformance.cases.registry import _excerpt as _excerpt  # services stores excerpts

REQUIRED_BY_DEFAULT = frozenset(c.key for c in CASES if c.required)

__all__ = [
    "CASES", "CITY_SCHEMA", "ERROR", "EXCERPT_CHARS", "FAIL", "MESSAGES", "PARITY_MESSAGES",
    "PASS", "PROMPT", "REQUIRED_BY_DEFAULT", "SATURATION_REQUESTS", "SATURATION_WAVES", "SKIP",
    "TIME_TOOL", "UNKNOWN_MODEL", "WEATHER_TOOL", "Case", "Judge", "Outcome", "Probe", "by_key",
    "case", "parity_case", "sse_events",
]
