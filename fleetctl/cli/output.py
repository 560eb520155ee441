from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any


def checked_number(kind: Callable[[str], Any], accept: Callable[[Any], bool], *,
                   not_a_number: str, refused: str) -> Callable[[str], Any]:
    """An argparse type: `kind(value)` (int, float) that `accept` holds true of. The messages
    are templates of `value`, the text given (e.g. "{value!r} is not a number")."""
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(not_a_number.format(value=value)) from None
        if not accept(number):
            raise argparse.ArgumentTypeError(refused.format(value=value))
        return number

    return parse


# A `--limit` flag: how many rows to print, 1 to 10000.
row_limit: Callable[[str], int] = checked_number(
    int, lambda number: 1 <= number <= 10000,
    not_a_number="{value!r} is not a whole number", refused="choose between 1 and 10000")


def non_negative(kind: type) -> Any:
    """An argparse type: a number of `kind` (int, float), zero or more."""
    return checked_number(kind, lambda number: not number < 0,
                          not_a_number="{value!r} is not a number", refused="must not be negative")


def number_in(low: float, high: float, hint: str) -> Callable[[str], float]:
    """An argparse type: a number from `low` to `high`; `hint` says what to give instead."""
    hint = hint.replace("{", "{{").replace("}", "}}")
    return checked_number(float, lambda number: low <= number <= high,  # NaN fails too
                          not_a_number="{value!r} is not a number", refused="{value!r}: " + hint)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def print_answer(data: Any, as_json: bool, line: Callable[[Any], str]) -> None:
    """An answer as the server sent it (`--json`, for scripts) or as its one summary line."""
    if as_json:
        print_json(data)
    else:
        print(line(data))


def show_answer(data: Any, as_json: bool, show: Callable[[Any], None]) -> None:
    """An answer as the server sent it (`--json`), or as `show` prints it for a person."""
    if as_json:
        print_json(data)
    else:
        show(data)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain aligned table: greppable, no colours, no box drawing."""
    text_rows = [["" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    line = "  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line.rstrip())
    for row in text_rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if not rows:
        print("(none)")


def print_fields(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        print(f"{key.ljust(width)}  {'—' if value in (None, '', [], {}) else value}")
