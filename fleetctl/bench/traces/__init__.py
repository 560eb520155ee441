"""Request traces: the fleetctl trace format, importers for public traces, a synthetic
generator and a one-pass summary.

Pure Python, no Django: the bench services, the upload view and the CLI all call this package.
Every reader streams — it holds one line at a time (plus, for Mooncake, a bounded table of
prefix groups), so a multi-gigabyte upload never sits in memory. The format is documented in
`fleetctl/bench/TRACES.md`.

Reading contract (all parsers): requests are yielded as they are validated. After the first
bad line nothing more is yielded; the reader keeps scanning only to report up to `max_errors`
problems, then raises `TraceError`. A trace is valid only if iteration finishes without
`TraceError`, so a caller that stores requests while reading must discard them on error.

The modules: `request` (one request, its checks, the header and TraceError), `reading` (the
plumbing the parsers share, and the JSON decoders they read), `fleetctl_format`,
`importers` (Mooncake, Azure CSV), `detect` (parse_trace), `synthetic` (generate) and
`summary`. Callers import from here.
"""

from fleetctl.bench.traces.detect import PARSERS, detect_format, parse_trace
from fleetctl.bench.traces.fleetctl_format import parse_jsonl, write_jsonl
from fleetctl.bench.traces.importers import (
    AZURE_HEADER,
    MOONCAKE_BLOCK_TOKENS,
    MOONCAKE_GROUP_MEMORY,
    parse_azure_csv,
    parse_mooncake,
)
from fleetctl.bench.traces.reading import TraceStream
from fleetctl.bench.traces.request import (
    FORMAT_VERSION,
    HEADER_KEYS,
    LATENCY_CLASSES,
    MAX_GROUP_ID_CHARS,
    MAX_TOKENS,
    NO_REQUESTS,
    OPTIONAL_KEYS,
    REQUEST_FIELDS,
    REQUEST_KEYS,
    REQUIRED_KEYS,
    TraceError,
    TraceFormat,
    TraceHeader,
    TraceRequest,
    request_problem,
)
from fleetctl.bench.traces.summary import TraceSummariser, TraceSummary, summarise
from fleetctl.bench.traces.synthetic import Arrival, Dist, generate, length_spec
from fleetctl.core.jsonl import JSON_DECODER as JSON_DECODER  # re-exported (benchmarks print it)
from fleetctl.core.jsonl import MAX_LINE_BYTES as MAX_LINE_BYTES  # re-exported for callers
from fleetctl.core.jsonl import MESSAGE_ROLES as MESSAGE_ROLES  # re-exported for callers

__all__ = [
    "AZURE_HEADER", "FORMAT_VERSION", "HEADER_KEYS", "JSON_DECODER", "LATENCY_CLASSES",
    "MAX_GROUP_ID_CHARS", "MAX_LINE_BYTES", "MAX_TOKENS", "MESSAGE_ROLES",
    "MOONCAKE_BLOCK_TOKENS", "MOONCAKE_GROUP_MEMORY", "NO_REQUESTS", "OPTIONAL_KEYS", "PARSERS",
    "REQUEST_FIELDS", "REQUEST_KEYS", "REQUIRED_KEYS", "Arrival", "Dist", "TraceError",
    "TraceFormat", "TraceHeader", "TraceRequest", "TraceStream", "TraceSummariser",
    "TraceSummary", "detect_format", "generate", "length_spec", "parse_azure_csv",
    "parse_jsonl", "parse_mooncake", "parse_trace", "request_problem", "summarise",
    "write_jsonl",
]
