from __future__ import annotations

from dataclasses import dataclass

from fleetctl.traffic.gateways.schema import option


@dataclass(frozen=True)
class FileOptions:
    file_name: str = option(help="the file the weights are written to, in the directory")
    indent: int = option(0, minimum=0, maximum=8, help="JSON indentation (0: one line)")
