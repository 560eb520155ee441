"""A Python client generated from the API's own OpenAPI schema with openapi-python-client, as
a ramp bot would generate it. Generated once per schema (by hash) under var/, then imported.

`roundtrip` checks that a generated model kept everything an answer said: its `to_dict()`
equals the JSON it was parsed from, and no object carries a field its schema does not name.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "var" / "generated-client"
# Downloads answer NDJSON, CSV and YAML (alert rules); the generator parses those as raw bytes.
CONFIG = {"content_type_overrides": {"application/x-ndjson": "application/octet-stream",
                                     "text/csv": "application/octet-stream",
                                     "application/yaml": "application/octet-stream"},
          "post_hooks": []}


def generate(schema: dict[str, Any]) -> ModuleType:
    """The generated package for this schema, imported (generated only when it is new)."""
    text = json.dumps(schema, sort_keys=True)
    generator = Path(sys.executable).with_name("openapi-python-client")
    version = importlib.metadata.version("openapi-python-client")
    digest = hashlib.sha256((version + text).encode()).hexdigest()[:16]
    package = f"fleetctl_client_{digest}"
    target = CACHE / digest
    if not (target / package / "__init__.py").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=CACHE, prefix=".gen-"))
        (work / "schema.json").write_text(text)
        (work / "config.json").write_text(json.dumps(CONFIG))
        result = subprocess.run(
            [generator, "generate", "--path", str(work / "schema.json"), "--meta", "none",
             "--config", str(work / "config.json"), "--output-path", str(work / package)],
            capture_output=True, text=True, env=dict(os.environ, NO_COLOR="1"))
        if result.returncode != 0 or not (work / package / "__init__.py").exists():
            shutil.rmtree(work, ignore_errors=True)
            raise AssertionError(f"openapi-python-client failed:\n{result.stdout}\n"
                                 f"{result.stderr}")
        # Every warning means a piece of the API the generated client lacks.
        warnings = re.findall(r"WARNING.*", result.stdout + result.stderr)
        (work / "warnings.txt").write_text("\n".join(warnings))
        try:
            work.rename(target)
        except OSError:  # generated meanwhile by another process: use theirs
            shutil.rmtree(work, ignore_errors=True)
        _prune(keep=target)
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    importlib.import_module(f"{package}.models")
    return importlib.import_module(package)


def _prune(*, keep: Path, newest: int = 4) -> None:
    """Clients of older schemas go (each is a couple of MB); the newest few stay, for other
    checkouts' test runs."""
    done = sorted((p for p in CACHE.iterdir() if p.is_dir() and not p.name.startswith(".")),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for old in done[newest:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def warnings(client: ModuleType) -> list[str]:
    text = (Path(client.__file__).parent.parent / "warnings.txt").read_text()
    return [line for line in text.splitlines() if line]


def operation(client: ModuleType, operation_id: str) -> ModuleType:
    """The generated module of one operation (api/<tag>/<operation_id>.py)."""
    api = Path(client.__file__).parent / "api"
    found = sorted(api.glob(f"*/{operation_id}.py"))
    assert found, f"the generated client has no module for {operation_id}"
    tag = found[0].parent.name
    return importlib.import_module(f"{client.__name__}.api.{tag}.{operation_id}")


_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def _same(a: Any, b: Any, where: str, problems: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a.keys() | b.keys():
            if key not in b:
                problems.append(f"{where}.{key}: lost by the generated model")
            elif key not in a:
                problems.append(f"{where}.{key}: added by the generated model")
            else:
                _same(a[key], b[key], f"{where}.{key}", problems)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            problems.append(f"{where}: {len(a)} items, {len(b)} after parsing")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _same(x, y, f"{where}[{i}]", problems)
    elif isinstance(a, str) and isinstance(b, str) and _DATETIME.match(a) and _DATETIME.match(b):
        if datetime.fromisoformat(a) != datetime.fromisoformat(b):
            problems.append(f"{where}: {a!r} became {b!r}")
    elif type(a) is bool or type(b) is bool:
        if a is not b:
            problems.append(f"{where}: {a!r} became {b!r}")
    elif a != b:
        problems.append(f"{where}: {a!r} became {b!r}")


def _undocumented(model: Any, where: str, problems: list[str]) -> None:
    """Fields a declared model did not know (openapi-python-client keeps them aside)."""
    import attrs

    if attrs.has(type(model)):
        declared = [f.name for f in attrs.fields(type(model))
                    if f.name != "additional_properties"]
        extra = getattr(model, "additional_properties", {})
        if declared and extra:
            problems.append(f"{where}: {type(model).__name__} has no field "
                            f"{', '.join(sorted(extra))} in the schema")
        for name in declared:
            _undocumented(getattr(model, name), f"{where}.{name}", problems)
    elif isinstance(model, list):
        for i, item in enumerate(model):
            _undocumented(item, f"{where}[{i}]", problems)


def roundtrip(parsed: Any, raw: Any, where: str) -> list[str]:
    """What the generated model lost, added, changed or did not know, compared to `raw`."""
    problems: list[str] = []
    _undocumented(parsed, where, problems)
    if isinstance(parsed, list):
        back: Any = [item.to_dict() if hasattr(item, "to_dict") else item for item in parsed]
    else:
        back = parsed.to_dict()
    _same(raw, back, where, problems)
    return problems
