"""Each pool's prompt calibration for the gateway's estimate of a prompt's size
(docs/traffic.md, "Prompt size at the gateway"), from whatever measures it.

Traffic sits below the apps that measure pools: the conformance probe's prompt-token parity
case fits each pool's tokenizer (fleetctl/conformance/calibration.py) and registers itself
here when its app loads. A pool no source knows gets the documented default
(PromptCalibration(): ~4 bytes a token, a chat template of 5 tokens a message plus 6).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fleetctl.traffic.gateways.base import PromptCalibration

CalibrationSource = Callable[[Iterable[str]], dict[str, PromptCalibration]]
SOURCES: list[CalibrationSource] = []


def register_calibration_source(source: CalibrationSource) -> CalibrationSource:
    if source not in SOURCES:
        SOURCES.append(source)
    return source


def pool_calibrations(names: Iterable[str]) -> dict[str, PromptCalibration]:
    """Pool name -> its calibration, from the first source that knows it; pools none knows
    are left out (the caller's default applies)."""
    wanted = set(names)
    found: dict[str, PromptCalibration] = {}
    for source in SOURCES:
        missing = wanted - set(found)
        if not missing:
            break
        for name, cal in source(missing).items():
            found.setdefault(name, cal)
    return found
