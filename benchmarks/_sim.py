"""Start one `python -m fleetctl.sim` process for a benchmark: the one start-up the benchmarks
share (the tests have theirs, tests/sim/simproc.py, with log capture and health waits)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_simulator(profiles_file: Path, *args: str,
                    log_level: str = "ERROR") -> tuple[subprocess.Popen[str], str]:
    """`fleetctl.sim --profiles profiles_file *args` (e.g. "--pool", "a=a@0", "--model", m);
    returns the process and the URL its first line announces. Exits with that line when the
    simulator does not start."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetctl.sim", "--profiles", str(profiles_file), *args,
         "--log-level", log_level],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "http://" not in line:
        proc.kill()
        raise SystemExit(f"simulator did not start ({' '.join(args)}): {line!r}")
    return proc, line.split(" on ")[1].split()[0]
