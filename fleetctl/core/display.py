"""How pages show a figure that may be missing: "—", never 0 or an error."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

UNKNOWN = "—"


def or_dash(show: Callable[..., str]) -> Callable[..., str]:
    """A display filter that answers "—" for a missing value (None or "") and otherwise
    shows it with `show`: a gap in the data never reads as zero."""

    @functools.wraps(show)
    def shown(value: Any, *args: Any) -> str:
        if value is None or value == "":
            return UNKNOWN
        return show(value, *args)

    return shown
