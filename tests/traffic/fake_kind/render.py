from __future__ import annotations

import json

from fleetctl.traffic.gateways.base import DesiredState


def render(desired: DesiredState, indent: int) -> str:
    return json.dumps(desired.held_weights(), indent=indent or None, sort_keys=True)
