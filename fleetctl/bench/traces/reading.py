"""The streaming plumbing the three parsers share: the JSON decoders, the line errors with
the request limit, and the stream they return."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleetctl.bench.traces.request import (
    NO_REQUESTS,
    TraceError,
    TraceFormat,
    TraceHeader,
    TraceRequest,
)
from fleetctl.core import jsonl
from fleetctl.core.jsonl import LineErrors

# The line plumbing (streamed reading, UTF-8, the fast JSON decoder with the standard library
# deciding and wording errors, the error cap) is shared with every JSONL upload:
# fleetctl/core/jsonl.py. The decoders are attributes of this module, which the parsers read
# once per parse (`reading._fast_loads`), so a test or benchmark can swap in the standard
# library's here.
_stdlib_loads = jsonl.stdlib_loads
_fast_loads = jsonl.fast_loads


class _Errors(LineErrors):
    """Line errors of a trace (raised as TraceError), with the trace's request limit."""

    def __init__(self, max_errors: int) -> None:
        super().__init__(max_errors, what="trace", error=TraceError)

    def counted(self, lineno: int, count: int, max_requests: int) -> int:
        """One more request (on line `lineno`); past `max_requests` the trace is refused."""
        count += 1
        if count > max_requests:
            self.add(lineno, _too_many(max_requests))
            raise TraceError(self.items)
        return count

    def finish(self, count: int, *, empty: str = NO_REQUESTS) -> None:
        super().finish(count, empty=empty)


def _imported(errors: _Errors, lineno: int, names: tuple[str, str],
              **fields: Any) -> TraceRequest | None:
    """A request from an importer's row, or None with the error recorded in the format's own
    names for the prompt and completion token counts (`names`)."""
    try:
        return TraceRequest(**fields)
    except ValueError as exc:
        errors.add(lineno, str(exc).replace("prompt_tokens", names[0])
                   .replace("completion_tokens", names[1]))
        return None


def _check_limits(max_errors: int, max_requests: int) -> None:
    if type(max_errors) is not int or max_errors < 1:
        raise ValueError(f"max_errors must be a positive integer, got {max_errors!r}")
    if type(max_requests) is not int or max_requests < 1:
        raise ValueError(f"max_requests must be a positive integer, got {max_requests!r}")


def _too_many(max_requests: int) -> str:
    return (f"the trace has more than {max_requests:,} requests, the limit; "
            f"split it into smaller traces")


class TraceStream(Iterator[TraceRequest]):
    """What the parsers return: an iterator of requests that also tells what it read.
    `header` is set once the first request (or the end) has been reached."""

    def __init__(self, trace_format: TraceFormat) -> None:
        self.format: TraceFormat = trace_format
        self.header: TraceHeader | None = None
        self._requests: Iterator[TraceRequest] = iter(())

    def __iter__(self) -> TraceStream:
        return self

    def __next__(self) -> TraceRequest:
        return next(self._requests)


def _backwards(name: str, value: float, previous: float, prev_line: int) -> str:
    return (f"{name} {value:g} is earlier than {previous:g} on line {prev_line}; "
            f"arrival offsets must not decrease (sort the trace by arrival)")
