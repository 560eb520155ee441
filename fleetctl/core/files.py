"""File helpers shared by the gateway adapters and the processes the demo starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Write beside the target, then rename over it: Envoy (and any reader) sees the old
    file or the new one, never a half-written one. The rename is what Envoy's directory
    watch reacts to."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
