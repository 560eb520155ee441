"""The apps are layers: each imports only the layers below it, read from the source with `ast`.

    core                      imports no app
    inference                 core only: talking to models and judging their answers (a
                              plain package, not an app)
    accounts, audit           core, and each other (an Actor's refusals are audited; an
                              audit event names its Actor)
    fleet                     core, accounts, audit
    traffic, xds              the above and fleet, and each other (xDS serves what the
                              Envoy kind renders; the envoy-xds adapter pushes through it)
    migrations_plan (plans)   the above and traffic
    bench                     the above and plans (a benchmark run records plan evidence)
    demo                      anything: the demo stack and the processes tests start

Besides: the CLI talks to the server over HTTP, so it imports only the trace parser (pure
Python) and the simulator; the simulator imports nothing of the product; the project package
(settings, URLs, the Celery app) wires the apps together. Every app may import the Celery app
(`fleetctl.celery`) and the package's version, which import no app themselves. Nothing in the
product imports `fleetctl.demo` (tests and benchmarks may).

Every import counts: at module level, inside a function, or under TYPE_CHECKING.
`MAY_IMPORT` below is the whole table (the list above is its outline).

Templates are layered by the same table. A template in templates/<folder>/ belongs to the
unit of that folder (the app's label: fleet/, traffic/, …; migrations_plan/ is plans,
registration/ — the login pages — is accounts). A template directly in templates/
(base.html, _field.html, _pagination.html, the error pages) is the frame every page shares:
it belongs to core, so every unit may extend or include it, and it may use nothing but other
frame templates, core's tags and Django's. A template tag library belongs to the app whose
templatetags/ package defines it (`{% load ramps %}` is ramps). A template may
`{% include %}` or `{% extends %}` a template, and `{% load %}` a library, only of its own
unit or of a unit its unit may import. A page that shows what an app above it renders names a
slot instead (`{% panels "plan.panels" %}`; fleetctl/core/panels.py) and the app above
registers its template there in its AppConfig.ready(); an include of a variable is not
checked (it names no template here). Comments ({# #}, {% comment %}) do not count.

docs/architecture.md shows the same table under its `## Layers` heading, and a test below
holds the two equal: a markdown table whose rows are `| unit | may import |` (the header's
words are free), the unit's name and what it may import as a comma-separated list of unit
names (each plain or in backticks), or `nothing`.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Unit -> the units it may import. A unit is an app package (fleetctl/<app>/, migrations_plan/)
# or "project" (the modules directly in fleetctl/).
BELOW_FLEET = {"core", "accounts", "audit"}
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    # Talking to models and judging their answers (upstream calls, chat rendering, answer
    # comparison, user-given JSON Schemas, confidence bounds): a plain package on core.
    "inference": {"core"},
    "accounts": {"core", "audit"},
    "audit": {"core", "accounts"},
    "fleet": BELOW_FLEET,
    # The Envoy (xDS) kind's adapter sets snapshots in the xDS store, and the gateway page
    # lists the Envoys connected; xDS serves what the Envoy kind renders: one layer in two
    # apps, as accounts and audit are.
    "traffic": BELOW_FLEET | {"fleet", "webhooks", "xds"},
    "xds": BELOW_FLEET | {"fleet", "traffic"},
    # Plans check evidence kinds' JSON Schemas, and reported data, with inference's
    # local-only schema rules (nothing is fetched).
    "plans": BELOW_FLEET | {"fleet", "traffic", "webhooks", "inference"},
    "bench": BELOW_FLEET | {"fleet", "traffic", "plans"},
    # The conformance probe sits beside bench: it records plan evidence the same way.
    "conformance": BELOW_FLEET | {"fleet", "traffic", "plans"},
    # Shadow runs replay stored traces (bench), call and compare pools (inference), and
    # record plan evidence.
    "shadow": BELOW_FLEET | {"fleet", "traffic", "plans", "bench", "inference"},
    # Eval runs score suites on pools directly (inference) and record plan evidence.
    "evals": BELOW_FLEET | {"fleet", "traffic", "plans", "inference"},
    # Outgoing webhooks know events and URLs, nothing of the domains that send them.
    "webhooks": BELOW_FLEET,
    # Telemetry follows the gateways' logs (traffic), scrapes the pools (fleet), and bounds
    # its rates and percentiles with inference's confidence intervals.
    "telemetry": BELOW_FLEET | {"fleet", "traffic", "inference"},
    # Ramps step a route's split (traffic), judged on telemetry against a plan's SLO, and
    # record plan evidence.
    "ramps": BELOW_FLEET | {"fleet", "traffic", "telemetry", "plans", "webhooks", "prometheus"},
    # Metric sources and query checks (Prometheus, HTTP JSON) read pools and record plan
    # evidence; ramps list its queries as extra guard metrics. A source marked as a telemetry
    # source writes telemetry windows (the ingester calls it through a provider).
    "prometheus": BELOW_FLEET | {"fleet", "traffic", "plans", "telemetry"},
    # Batch jobs run on pools (fleet), may carry a plan's batch route (traffic), compare
    # answers (inference), and record plan evidence; drills and soaks notify.
    "batch": BELOW_FLEET | {"fleet", "traffic", "plans", "webhooks", "inference"},
    # Schedules start the evidence jobs (bench, conformance, evals, a plan's rehearsal) and
    # notify when a run is missed or fails.
    "schedules": BELOW_FLEET | {"fleet", "traffic", "plans", "bench", "conformance", "evals",
                                "webhooks"},
    # A plan's business case compares its benchmark evidence (bench), converts through the
    # fleet's rates, and forecasts capacity from telemetry against traffic's capacities; its
    # migration report reads the plan's ramps, its shadow run's divergent pairs and its soaks'
    # batch jobs.
    "economics": BELOW_FLEET | {"fleet", "traffic", "telemetry", "plans", "bench", "ramps",
                                "shadow", "batch"},
    "sim": set(),
    "cli": {"sim", "fleetctl.bench.traces"},
    "project": {"core", "accounts", "audit", "fleet", "traffic", "plans", "bench", "sim",
                "cli", "conformance", "shadow", "evals", "webhooks", "telemetry", "ramps",
                "batch", "inference", "schedules", "economics", "prometheus", "xds"},
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
    assert not _allowed("core", "fleetctl.inference.compare")
    assert not _allowed("inference", "fleetctl.fleet.models")
    assert _allowed("inference", "fleetctl.core.jsonl")
    assert _allowed("bench", "migrations_plan.evidence")
    assert _allowed("cli", "fleetctl.bench.traces")
    assert _allowed("fleet", "fleetctl.celery")
    assert _allowed("demo", "fleetctl.bench.models")


# --- templates ------------------------------------------------------------------------------

TEMPLATES = ROOT / "templates"
# templates/<folder>/ -> unit, where the folder is not the unit's name.
TEMPLATE_FOLDERS = {"migrations_plan": "plans", "registration": "accounts"}
# The frame (templates directly in templates/) is core's: below every app.
FRAME_UNIT = "core"
# Template uses that break the rule today, each with why (template, unit it uses); the test
# fails when one is gone, so this list only shrinks. Empty: every page names slots.
KNOWN_UPWARD_TEMPLATES: set[tuple[str, str]] = set()

_COMMENT = re.compile(r"\{#.*?#\}|\{%\s*comment\b.*?%\}.*?\{%\s*endcomment\s*%\}", re.S)
_TAG = re.compile(r"\{%\s*(include|extends|load)\s+(.*?)\s*%\}")
_LITERAL = re.compile(r"""(["'])(.+?)\1""")


def _template_unit(name: str, templates: Path = TEMPLATES) -> str | None:
    """The unit of template `name` ("fleet/overview.html", "base.html"); None for a folder
    that is not in templates/ (Django's and the packages' own templates)."""
    folder, _, rest = name.partition("/")
    if not rest:
        return FRAME_UNIT
    if not (templates / folder).is_dir():
        return None
    return TEMPLATE_FOLDERS.get(folder, folder)


def _tag_libraries() -> dict[str, str]:
    """Template tag library name -> the unit that defines it."""
    libraries: dict[str, str] = {}
    for path in _product_files():
        if path.parent.name == "templatetags" and path.name != "__init__.py":
            unit = _unit_of(_module_of(path))
            assert unit is not None
            assert path.stem not in libraries, f"two tag libraries named {path.stem!r}"
            libraries[path.stem] = unit
    return libraries


def _template_uses(text: str, libraries: dict[str, str], templates: Path = TEMPLATES
                   ) -> Iterator[tuple[int, str, str]]:
    """(line, the tag as written, unit used) for each include, extends and load of a template
    or library of ours; includes of a variable and Django's own libraries are left out."""
    text = _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)
    for match in _TAG.finditer(text):
        tag, argument = match.groups()
        line = text.count("\n", 0, match.start()) + 1
        if tag == "load":
            words = argument.split()
            names = words[-1:] if "from" in words else words
            units = [libraries.get(name) for name in names]
        else:
            literal = _LITERAL.match(argument)
            units = [_template_unit(literal.group(2), templates)] if literal else []
        for unit in units:
            if unit is not None:
                yield line, match.group(), unit


def _template_allowed(unit: str, used: str) -> bool:
    return used == unit or unit == "demo" or used in MAY_IMPORT[unit]


def _template_violations(templates: Path = TEMPLATES) -> dict[tuple[str, str], list[str]]:
    libraries = _tag_libraries()
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(templates.rglob("*.html")):
        name = str(path.relative_to(templates))
        unit = _template_unit(name, templates)
        assert unit in ALL_UNITS, (f"templates/{name}: no layer for this folder; add it to "
                                   f"TEMPLATE_FOLDERS")
        for line, tag, used in _template_uses(path.read_text(), libraries, templates):
            if not _template_allowed(unit, used):
                found.setdefault((name, used), []).append(
                    f"templates/{name}:{line} ({unit}) {tag} uses {used}")
    return found


def test_every_template_uses_only_the_layers_below_it():
    violations = _template_violations()
    new = {key: lines for key, lines in violations.items()
           if key not in KNOWN_UPWARD_TEMPLATES}
    assert not new, "templates against the layering (name a slot instead: " \
        "fleetctl/core/panels.py):\n" + "\n".join(line for lines in new.values() for line in lines)


def test_the_known_upward_templates_are_still_needed():
    stale = KNOWN_UPWARD_TEMPLATES - set(_template_violations())
    assert not stale, f"no longer used, remove from KNOWN_UPWARD_TEMPLATES: {sorted(stale)}"


def test_the_template_rule_refuses_what_it_should():
    """The parser and the rule on samples: the gate's old hard-coded include is refused."""
    libraries = _tag_libraries()
    assert libraries["ramps"] == "ramps"
    assert libraries["links"] == "core"
    old_gate = ('{% load links %}\n<td>\n'
                '{% if check.key == "conformance" and viewed_stage == 1 %}'
                '{% include "conformance/_gate_action.html" %}{% endif %}\n</td>')
    uses = list(_template_uses(old_gate, libraries))
    assert [(line, unit) for line, _, unit in uses] == [(1, "core"), (3, "conformance")]
    assert not _template_allowed("plans", "conformance")
    assert _template_allowed("plans", "core")
    sample = ('{% extends "base.html" %}{% load static ramps %}{% load live_of from ramps %}\n'
              "{% include 'batch/_plan_panel.html' with bp=x only %}\n"
              '{% include panel.template %}{# {% include "shadow/_plan_panel.html" %} #}\n'
              '{% comment %}\n{% load shadow %}\n{% endcomment %}'
              '{% include "rest_framework/form.html" %}{% include "fleet/_health_badge.html" %}')
    assert [(line, unit) for line, _, unit in _template_uses(sample, libraries)] == [
        (1, "core"), (1, "ramps"), (1, "ramps"), (2, "batch"), (6, "fleet")]
    assert not _template_allowed("fleet", "ramps")
    assert not _template_allowed("traffic", "ramps")
    assert _template_allowed("traffic", "fleet")
    assert _template_allowed("ramps", "plans")


def test_the_template_check_finds_an_upward_include(tmp_path: Path):
    """The whole check, on a copy of templates/ where the plan page includes a gate action
    of an app above plans again, as it did before the slots, and the pool page loads ramps'
    tags."""
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    gate = templates / "migrations_plan" / "_gate.html"
    gate.write_text(gate.read_text() + '\n{% include "shadow/_gate_action.html" %}\n')
    pool = templates / "fleet" / "pool_detail.html"
    pool.write_text("{% load ramps %}\n" + pool.read_text())
    assert set(_template_violations(templates)) == {("migrations_plan/_gate.html", "shadow"),
                                                    ("fleet/pool_detail.html", "ramps")}


# --- the table in docs/architecture.md ---------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _names(cell: str) -> set[str]:
    cell = cell.strip()
    if cell.lower() in ("", "nothing", "none", "—", "-"):
        return set()
    return {name.strip().strip("`").strip() for name in cell.split(",")}


def _layers_table(markdown: str) -> dict[str, set[str]]:
    """The first table under the `## Layers` heading (before the next `## `): unit -> the
    units it may import."""
    section = re.search(r"^## Layers[ \t]*\n(.*?)(?=^## |\Z)", markdown, re.S | re.M)
    assert section, "no `## Layers` heading"
    rows = []
    for line in section.group(1).splitlines():
        if line.lstrip().startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break  # the table ended
    assert len(rows) > 2, "no table (header, |---|, rows) under `## Layers`"
    assert all(set(cell) <= set("-: ") for cell in rows[1]), "the table's second line is |---|"
    table: dict[str, set[str]] = {}
    for row in rows[2:]:
        assert len(row) == 2, f"a row is | unit | may import |: {row}"
        unit = row[0].strip("`").strip()
        assert unit not in table, f"{unit} twice in the table"
        table[unit] = _names(row[1])
    return table


def test_the_layers_table_parser():
    markdown = ("# A\n## Layers\n\ntext\n\n| unit | may import |\n|---|---|\n"
                "| `core` | nothing |\n| fleet | `core`, accounts |\n\nmore\n"
                "| `x` | y |\n## Next\n| `z` | w |\n")
    assert _layers_table(markdown) == {"core": set(), "fleet": {"core", "accounts"}}
    with pytest.raises(AssertionError):
        _layers_table("# A\n## Layout\n| `core` | nothing |\n")


def test_the_layers_table_in_the_architecture_doc_is_this_one():
    documented = _layers_table(ARCHITECTURE.read_text())
    missing = sorted(set(MAY_IMPORT) - set(documented))
    extra = sorted(set(documented) - set(MAY_IMPORT))
    assert not missing and not extra, f"docs/architecture.md: missing {missing}, extra {extra}"
    wrong = {unit: (sorted(documented[unit]), sorted(allowed))
             for unit, allowed in MAY_IMPORT.items() if documented[unit] != allowed}
    assert not wrong, "docs/architecture.md says (left) what MAY_IMPORT does not (right): " \
        f"{wrong}"
