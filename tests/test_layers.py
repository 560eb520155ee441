"""The apps are layers: each imports only the layers below it, read from the source with `ast`.

    core                      imports no app
    accounts, audit           core, and each other (an Actor's refusals are audited; an
                              audit event names its Actor)
    fleet                     core, accounts, audit
    traffic                   the above and fleet
    migrations_plan (plans)   the above and traffic
    bench                     the above and plans (a benchmark run records plan evidence)
    demo                      anything: the demo stack and the processes tests start

Besides: the CLI talks to the server over HTTP, so it imports only the trace parser (pure
Python) and the simulator; the simulator imports nothing of the product; the project package
(settings, URLs, the Celery app) wires the apps together. Every app may import the Celery app
(`fleetctl.celery`) and the package's version, which import no app themselves. Nothing in the
product imports `fleetctl.demo` (tests and benchmarks may).

Every import counts: at module level, inside a function, or under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Unit -> the units it may import. A unit is an app package (fleetctl/<app>/, migrations_plan/)
# or "project" (the modules directly in fleetctl/).
BELOW_FLEET = {"core", "accounts", "audit"}
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "accounts": {"core", "audit"},
    "audit": {"core", "accounts"},
    "fleet": BELOW_FLEET,
    "traffic": BELOW_FLEET | {"fleet", "webhooks"},
    "plans": BELOW_FLEET | {"fleet", "traffic", "webhooks"},
    "bench": BELOW_FLEET | {"fleet", "traffic", "plans"},
    # The conformance probe sits beside bench: it records plan evidence the same way.
    "conformance": BELOW_FLEET | {"fleet", "traffic", "plans"},
    # Shadow runs replay stored traces (bench) and record plan evidence.
    "shadow": BELOW_FLEET | {"fleet", "traffic", "plans", "bench"},
    # Eval runs score suites on pools directly and record plan evidence.
    "evals": BELOW_FLEET | {"fleet", "traffic", "plans"},
    # Outgoing webhooks know events and URLs, nothing of the domains that send them.
    "webhooks": BELOW_FLEET,
    # Telemetry follows the gateways' logs (traffic) and scrapes the pools (fleet).
    "telemetry": BELOW_FLEET | {"fleet", "traffic"},
    # Ramps step a route's split (traffic), judged on telemetry against a plan's SLO, and
    # record plan evidence.
    "ramps": BELOW_FLEET | {"fleet", "traffic", "telemetry", "plans", "webhooks"},
    # Batch jobs run on pools (fleet), may carry a plan's batch route (traffic), and record
    # plan evidence; drills and soaks notify.
    "batch": BELOW_FLEET | {"fleet", "traffic", "plans", "webhooks"},
    "sim": set(),
    "cli": {"sim", "fleetctl.bench.traces"},
    "project": {"core", "accounts", "audit", "fleet", "traffic", "plans", "bench", "sim",
                "cli", "conformance", "shadow", "evals", "webhooks", "telemetry", "ramps",
                "batch"},
}
ALL_UNITS = set(MAY_IMPORT) | {"demo"}
# What any unit may import: the Celery app and the package itself (its version).
SHARED = {"fleetctl", "fleetctl.celery"}

# Imports that break the rule today, each with why; the test fails when one is no longer
# needed, so this list only shrinks. (importing file, unit it imports)
KNOWN_UPWARD = {
    # A registry edit that changes where traffic may go pushes every gateway after the
    # commit, and is refused while routes rely on the pool (function-level imports).
    ("fleetctl/fleet/services.py", "traffic"),
}


def _unit_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "migrations_plan":
        return "plans"
    if parts[0] != "fleetctl":
        return None
    if len(parts) == 1 or not (ROOT / "fleetctl" / parts[1]).is_dir():
        return "project"
    return parts[1]


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _product_files() -> Iterator[Path]:
    yield from sorted((ROOT / "fleetctl").rglob("*.py"))
    yield from sorted((ROOT / "migrations_plan").rglob("*.py"))


def _existing_module(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) for every import in the file. `from a import b` counts
    as importing the module a.b when b is a module, else as importing a."""
    package = _module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                yield node.lineno, submodule if _existing_module(submodule) else module


def _allowed(unit: str, module: str) -> bool:
    target = _unit_of(module)
    if target is None or target == unit or unit == "demo":
        return True
    if module in SHARED:
        return True
    allowed = MAY_IMPORT[unit]
    return target in allowed or any(
        module == entry or module.startswith(entry + ".") for entry in allowed if "." in entry)


def _violations() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for path in _product_files():
        unit = _unit_of(_module_of(path))
        assert unit in ALL_UNITS, f"{path}: no layer for this package; add it to MAY_IMPORT"
        rel = str(path.relative_to(ROOT))
        for line, module in _imports(path):
            if not _allowed(unit, module):
                found.setdefault((rel, str(_unit_of(module))), []).append(
                    f"{rel}:{line} imports {module}")
    return found


def test_every_layer_imports_only_the_layers_below_it():
    violations = _violations()
    new = {key: lines for key, lines in violations.items() if key not in KNOWN_UPWARD}
    assert not new, "imports against the layering:\n" + "\n".join(
        line for lines in new.values() for line in lines)


def test_the_known_upward_imports_are_still_needed():
    stale = KNOWN_UPWARD - set(_violations())
    assert not stale, f"no longer imported, remove from KNOWN_UPWARD: {sorted(stale)}"


@pytest.mark.parametrize("unit", sorted(ALL_UNITS - {"demo", "project"}))
def test_each_unit_has_files(unit: str):
    """A layer that vanished (renamed app) would make its rule pass for nothing."""
    assert any(_unit_of(_module_of(p)) == unit for p in _product_files())


def test_core_imports_no_app():
    offending = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in (ROOT / "fleetctl" / "core").rglob("*.py")
        for line, module in _imports(path)
        if _unit_of(module) not in (None, "core")
    ]
    assert not offending, "\n".join(offending)


def test_the_shared_modules_import_no_app():
    """Every app imports the Celery app and the package version, so they must stay below all."""
    for module in SHARED:
        path = ROOT.joinpath(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        apps = [m for _, m in _imports(path) if _unit_of(m) not in (None, "project")]
        assert not apps, f"{module} imports {apps}"


def test_no_product_module_imports_the_demo():
    offending = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _product_files()
        if _unit_of(_module_of(path)) != "demo"
        for line, module in _imports(path)
        if _unit_of(module) == "demo"
    ]
    assert not offending, "\n".join(offending)


def test_the_rule_refuses_what_it_should():
    """The rule itself: core importing accounts, or fleet importing bench, is refused."""
    assert not _allowed("core", "fleetctl.accounts.permissions")
    assert not _allowed("fleet", "fleetctl.bench.models")
    assert not _allowed("plans", "fleetctl.bench.services")
    assert not _allowed("traffic", "migrations_plan.models")
    assert not _allowed("cli", "fleetctl.bench.models")
    assert not _allowed("bench", "fleetctl.demo.devstack")
    assert _allowed("bench", "migrations_plan.evidence")
    assert _allowed("cli", "fleetctl.bench.traces")
    assert _allowed("fleet", "fleetctl.celery")
    assert _allowed("demo", "fleetctl.bench.models")
