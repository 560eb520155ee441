"""The runtime file on disk: the weights a restarted Envoy loads before fleetctl pushes
again (a running Envoy takes weights through its admin runtime endpoint)."""

from __future__ import annotations

import os
from pathlib import Path

from fleetctl.traffic.gateways.envoy import render as envoy_config


def write_runtime_file(config_dir: Path, text: str) -> None:
    """Make `text` the runtime file Envoy loads at start: written over whichever of two
    files the link does not point to, then the link swapped onto it. Only a link is renamed:
    renaming a freshly written regular file over another makes ext4 flush it first (~3 ms,
    `auto_da_alloc`), and a weights push happens on every drain. A starting Envoy reads the
    old file or the new one, never half of one (a running one does not read it again).
    Called under the apply lock, so two pushes never write the same file."""
    root = config_dir / envoy_config.RUNTIME_DIR
    link = root / envoy_config.RUNTIME_FILE
    try:
        current = os.readlink(link)
    except OSError:
        (root / envoy_config.RUNTIME_UNWATCHED).mkdir(parents=True, exist_ok=True)
        current = ""
    spare = "b.json" if current == "a.json" else "a.json"
    data = text.encode()
    # No O_TRUNC: truncating a file to zero makes ext4 flush it on close, like the rename.
    fd = os.open(root / spare, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    staged = root / ".swap"
    staged.unlink(missing_ok=True)
    os.symlink(spare, staged)
    os.replace(staged, link)


def read_runtime_file(config_dir: Path) -> str:
    """The runtime file a restarted Envoy would load ("" when there is none)."""
    try:
        return (config_dir / envoy_config.RUNTIME_DIR / envoy_config.RUNTIME_FILE).read_text()
    except OSError:
        return ""
