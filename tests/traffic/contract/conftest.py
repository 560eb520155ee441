"""One gateway per kind per test module, and which kinds each contract scenario is made for.

A scenario says what it needs with `@needs(...)` (or `@needs(without=...)` for what a kind
without a capability must do instead). `pytest_generate_tests` makes its cases only for the
kinds that fit, so a scenario that does not apply to a kind is not a skipped (green-looking)
case but no case at all; the end of the run lists each one left out and why (kinds.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests.sim.simproc import SimProcess
from tests.traffic.contract.kinds import KINDS, GatewayUnderTest

F = TypeVar("F", bound=Callable[..., Any])

_left_out: list[tuple[str, str, str]] = []  # (scenario, kind, why)


def needs(*capabilities: str, without: tuple[str, ...] = ()) -> Callable[[F], F]:
    """The scenario runs for the kinds that have every one of `capabilities` and none of
    `without`."""
    return pytest.mark.gateway_needs(capabilities, without)  # type: ignore[return-value]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gateway_needs(capabilities, without): the gateway "
                            "kinds a contract scenario is made for (tests/traffic/contract)")


def why_not(kind: type[GatewayUnderTest], capabilities: tuple[str, ...],
            without: tuple[str, ...]) -> str | None:
    """Why a scenario needing `capabilities` (and not `without`) does not apply to `kind`."""
    for capability in capabilities:
        if not kind.has(capability):
            return f"{capability}: {kind.lacks[capability]}"
    for capability in without:
        if kind.has(capability):
            return f"it has {capability}: the scenario for kinds with it applies instead"
    return None


def applicable(function: Callable[..., Any]) -> dict[str, str | None]:
    """kind -> None when the scenario applies, else why not."""
    marks = [m for m in getattr(function, "pytestmark", []) if m.name == "gateway_needs"]
    capabilities, without = marks[0].args if marks else ((), ())
    return {name: why_not(kind, capabilities, without) for name, kind in KINDS.items()}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gateway" not in metafunc.fixturenames:
        return
    reasons = applicable(metafunc.function)
    kinds = [name for name, why in reasons.items() if why is None]
    for name, why in reasons.items():
        if why is not None:
            _left_out.append((metafunc.function.__name__, name, why))
    metafunc.parametrize("gateway", kinds, indirect=True, scope="module")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _left_out:
        return
    terminalreporter.section("gateway contract: scenarios made for other kinds")
    by_reason: dict[tuple[str, str], list[str]] = {}
    for scenario, kind, why in sorted(set(_left_out)):
        by_reason.setdefault((kind, why), []).append(scenario)
    for (kind, why), scenarios in sorted(by_reason.items()):
        terminalreporter.write_line(f"{kind}: {len(scenarios)} not made, {why}: "
                                    + ", ".join(scenarios))


@pytest.fixture(scope="module")
def gateway(request: pytest.FixtureRequest, sim_fleet: SimProcess,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayUnderTest]:
    """One gateway of the kind, started once for the module; each scenario applies the
    whole state it needs, as fleetctl always does."""
    kind = KINDS[request.param]
    running = kind.start(tmp_path_factory.mktemp(kind.kind), sim_fleet)
    yield running
    running.stop()
