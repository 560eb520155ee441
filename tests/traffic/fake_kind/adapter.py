from __future__ import annotations

import json
from pathlib import Path

from fleetctl.core.files import write_atomically
from fleetctl.traffic.gateways.base import Adapter, ApplyResult, DesiredState
from tests.traffic.fake_kind.options import FileOptions
from tests.traffic.fake_kind.render import render


class FileAdapter(Adapter[FileOptions]):
    kind = "file"

    @property
    def path(self) -> Path:
        return Path(self.gateway.admin_address) / self.options.file_name

    def apply_checked(self, desired: DesiredState) -> ApplyResult:
        write_atomically(self.path, render(desired, self.options.indent))
        return ApplyResult(applied=True, method="file")

    def read_back(self) -> dict[str, dict[str, int]]:
        return json.loads(self.path.read_text())

    def in_flight(self, pool: str) -> int:
        """What in_flight.json beside the weights says (pool → open requests), as a gateway
        would report it; 0 without the file."""
        counts = Path(self.gateway.admin_address) / "in_flight.json"
        return int(json.loads(counts.read_text()).get(pool, 0)) if counts.exists() else 0
