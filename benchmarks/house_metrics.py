"""How well the house is kept, before and after a change, on this machine, in one run.

For each revision (a git worktree of it in a temporary folder; `HEAD` means the working
tree as it is): repeated code in the product (`duplicates` pairs over fleetctl/ and
migrations_plan/, migrations left out), the longest function (lines, from `def` to its last
line), modules over 600 lines, view modules that call the ORM (`.objects`, `.filter(`,
`.get(`, … on a model in a views module or a views package), and with `--suite` the whole
`make test`'s wall time (run one after the other, never side by side: they share the cores).

    .venv/bin/python benchmarks/house_metrics.py [--before REV] [--after REV] [--suite]

Defaults: --before is the commit issue 26 started from, --after the working tree.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ISSUE_26_BASE = "f23d938"
PRODUCT = ("fleetctl", "migrations_plan")
LONG_MODULE = 600
# Calls that reach the database through a model's manager or a queryset.
ORM = re.compile(r"\.objects\b|\bselect_related\(|\bprefetch_related\(|\.annotate\(")


@dataclass
class Figures:
    duplicate_pairs: int = 0
    # Of those, the pairs `duplicates` finds only by shape (no run the same to the letter:
    # choice classes, URL tables, decorator stacks), and those it marks boilerplate.
    shape_pairs: int = 0
    boilerplate_pairs: int = 0
    longest_function: tuple[int, str] = (0, "")
    long_modules: list[tuple[int, str]] = field(default_factory=list)
    orm_views: list[str] = field(default_factory=list)
    suite_s: float | None = None
    suite_result: str = ""


def product_files(tree: Path) -> Iterator[Path]:
    for top in PRODUCT:
        for path in sorted((tree / top).rglob("*.py")):
            if "migrations" in path.relative_to(tree).parts[1:-1]:
                continue
            yield path


def duplicate_pairs(tree: Path) -> tuple[int, int, int]:
    """`duplicates` over a copy of the product's modules (migrations are generated code)."""
    with tempfile.TemporaryDirectory(prefix="house-dup-") as tmp:
        for path in product_files(tree):
            target = Path(tmp) / path.relative_to(tree)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
        out = subprocess.run(["duplicates", "--repo", tmp, "--seconds", "300", "--most", "1"],
                             capture_output=True, text=True, check=True).stdout
    match = re.match(r"(\d+) pairs?", out)
    shape = re.search(r"(\d+) by shape alone(?:, (\d+) of those marked boilerplate)?", out)
    return (int(match.group(1)) if match else 0, int(shape.group(1)) if shape else 0,
            int(shape.group(2) or 0) if shape else 0)


def static_figures(tree: Path) -> Figures:
    figures = Figures()
    for path in product_files(tree):
        rel = str(path.relative_to(tree))
        source = path.read_text()
        lines = source.count("\n") + 1
        if lines > LONG_MODULE:
            figures.long_modules.append((lines, rel))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > figures.longest_function[0]:
                    figures.longest_function = (length, f"{rel}::{node.name}")
        if (path.name == "views.py" or "views" in path.parts[:-1]) and ORM.search(source):
            figures.orm_views.append(rel)
    figures.long_modules.sort(reverse=True)
    (figures.duplicate_pairs, figures.shape_pairs,
     figures.boilerplate_pairs) = duplicate_pairs(tree)
    return figures


def suite(tree: Path) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run(["make", "test"], cwd=tree, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    summary = [line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)",
                                                                      line)]
    return elapsed, (summary[-1].strip("= ") if summary else f"exit {proc.returncode}")


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    if rev == "HEAD":
        yield ROOT
        return
    folder = Path(tempfile.mkdtemp(prefix="house-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), rev], cwd=ROOT,
                   check=True, capture_output=True)
    try:
        # The working tree's environment serves both (make would otherwise install anew).
        (folder / ".venv").symlink_to(ROOT / ".venv")
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT,
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default=ISSUE_26_BASE)
    parser.add_argument("--after", default="HEAD", help="HEAD: the working tree as it is")
    parser.add_argument("--suite", action="store_true", help="also time `make test` for each")
    args = parser.parse_args()
    if shutil.which("duplicates") is None:
        print("needs the `duplicates` command on PATH", file=sys.stderr)
        return 2
    results: dict[str, Figures] = {}
    for label, rev in (("before", args.before), ("after", args.after)):
        with checkout(rev) as tree:
            figures = static_figures(tree)
            if args.suite:
                figures.suite_s, figures.suite_result = suite(tree)
            results[label] = figures
    before, after = results["before"], results["after"]
    print(f"{'':34}{'before (' + args.before + ')':>24}{'after (' + args.after + ')':>24}")
    rows = [
        ("duplicates pairs, product code", before.duplicate_pairs, after.duplicate_pairs),
        ("  of those by shape alone", before.shape_pairs, after.shape_pairs),
        ("  of those marked boilerplate", before.boilerplate_pairs, after.boilerplate_pairs),
        ("  same to the letter", before.duplicate_pairs - before.shape_pairs,
         after.duplicate_pairs - after.shape_pairs),
        ("longest function, lines", before.longest_function[0], after.longest_function[0]),
        ("modules over 600 lines", len(before.long_modules), len(after.long_modules)),
        ("view modules calling the ORM", len(before.orm_views), len(after.orm_views)),
    ]
    if args.suite:
        rows.append(("make test wall time, s", round(before.suite_s or 0),
                     round(after.suite_s or 0)))
    for name, b, a in rows:
        print(f"{name:34}{b:>24}{a:>24}")
    for label, figures in results.items():
        print(f"\n{label}: longest function {figures.longest_function[1]}")
        print(f"{label}: modules over {LONG_MODULE} lines: "
              + ", ".join(f"{path} ({n})" for n, path in figures.long_modules))
        print(f"{label}: views calling the ORM: " + ", ".join(figures.orm_views))
        if figures.suite_result:
            print(f"{label}: make test: {figures.suite_result}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
