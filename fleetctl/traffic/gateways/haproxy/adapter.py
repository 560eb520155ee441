"""HAProxy adapter (Debian `haproxy` 2.6): weights through the runtime API, structure by reload.

render.py turns a desired state into haproxy.cfg (how requests find their pool, weight
resolution, residency); this module applies it.

What is applied how:
- Weights: `set weight` / `set server … state drain|ready` on the stats socket
  (`GatewaySpec.admin_address`: a unix socket path or `127.0.0.1:port`). Increases go first,
  decreases and drains last, so no intermediate state leaves a route with nothing to serve it.
  After every change the live state is written to the server-state file, and HAProxy loads it
  on start or reload (`load-server-state-from-file global`): runtime weights survive both.
- Structure (routes, pools, endpoints, matching, settings): the whole config is rendered,
  checked with `haproxy -c`, swapped in atomically and reloaded through the master CLI
  (`-W -S <master socket>`, command `reload`). The apply returns once the worker showing the
  new structure hash (`setenv FLEETCTL_STRUCTURE`, read with `show env`) serves and every
  previous worker is in soft-stop (no longer accepting). Old workers finish their in-flight
  streams and then exit; `expose-fd listeners` and `option idle-close-on-response` keep a
  reload from resetting queued connections or idle keep-alive ones under a sending client.

`read_back()` reports each pool's real share of its backend in basis points, and `matches()`
compares at HAProxy's resolution: it quantises the desired weights exactly as `apply()` does.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetctl.traffic.gateways.base import (
    Adapter,
    AdapterError,
    ApplyResult,
    DesiredState,
    GatewaySpec,
    PoolCounters,
    PoolTarget,
    run_config_check,
)
from fleetctl.traffic.gateways.haproxy.options import HAProxyOptions
from fleetctl.traffic.gateways.haproxy.render import (
    STRUCTURE_ENV,
    HAProxySettings,
    Rendered,
    pool_of,
    pool_problem,
    render_config,
    shares,
)

MASTER_PATIENCE_S = 1.0
# srv_admin_state bits (HAProxy's SRV_ADMF_*): any maintenance or drain flag means the server
# takes no new requests, whatever its weight says.
_NO_NEW_REQUESTS = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20 | 0x40
_FORCED_DRAIN = 0x08
_DRAIN_FLAGS = 0x08 | 0x10


# --- the runtime API ------------------------------------------------------------------------------

def runtime_command(address: str, command: str, *, timeout_s: float = 2.0,
                    patience_s: float = 0.0) -> str:
    """One command line (`;` separates several) on a stats or master socket; returns the whole
    answer. `patience_s`: keep retrying a refused connection that long (the master CLI is
    briefly away while the master re-executes itself on reload)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return _exchange(address, command, timeout_s)
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            if time.monotonic() >= deadline:
                raise AdapterError(f"HAProxy at {address} is unreachable: {exc}") from exc
            time.sleep(0.01)


def _exchange(address: str, command: str, timeout_s: float) -> str:
    # The write side is shut so HAProxy answers and closes (the master CLI waits for it).
    deadline = time.monotonic() + timeout_s
    try:
        with _connect(address, timeout_s) as sock:
            sock.sendall(command.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                sock.settimeout(max(0.01, deadline - time.monotonic()))
    except (ConnectionRefusedError, FileNotFoundError):
        raise
    except TimeoutError as exc:
        raise AdapterError(f"HAProxy at {address} did not answer {command.split()[0]!r} "
                           f"within {timeout_s:g} s") from exc
    except OSError as exc:
        raise AdapterError(f"HAProxy at {address} is unreachable: {exc}") from exc
    return b"".join(chunks).decode(errors="replace")


def _connect(address: str, timeout_s: float) -> socket.socket:
    if address.startswith("/"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(address)
        return sock
    host, _, port = address.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)




@dataclass(frozen=True)
class LiveServer:
    backend: str
    server: str
    admin_state: int
    weight: int

    @property
    def effective(self) -> int:
        return 0 if self.admin_state & _NO_NEW_REQUESTS else self.weight


def parse_servers_state(text: str) -> list[LiveServer]:
    """`show servers state`: a version line, a `#` header, one line per server."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 9 or line.startswith("#"):
            continue
        rows.append(LiveServer(backend=fields[1], server=fields[3],
                               admin_state=int(fields[6]), weight=int(fields[7])))
    return rows


# --- the adapter ----------------------------------------------------------------------------------

class HAProxyAdapter(Adapter[HAProxyOptions]):
    kind = "haproxy"
    weight_resolution = ("1/256 per backend (≈0.39 %); each non-zero weight keeps at least 1, "
                         "so it never rounds to 0")
    # HAProxy has no request mirroring (its SPOE mirror agent is a separate process fleetctl
    # does not run): a shadow run on a route behind HAProxy replays a stored trace instead.
    supports_mirror = False

    def __init__(self, gateway: GatewaySpec) -> None:
        super().__init__(gateway)
        self.settings = HAProxySettings(gateway=gateway.name,
                                        runtime_address=gateway.admin_address,
                                        options=self.options)
        self._live_structure: str | None = None

    @classmethod
    def check_pool(cls, pool: PoolTarget) -> str | None:
        return pool_problem(pool)

    def apply_checked(self, desired: DesiredState) -> ApplyResult:
        started = time.monotonic()
        rendered = render_config(desired, self.settings)
        reload_ms = None
        if self._running_structure() != rendered.structure:
            reload_ms = self._reload(rendered)
        changed = self._set_weights(rendered)
        total_ms = (time.monotonic() - started) * 1000
        if reload_ms is not None:
            return ApplyResult(applied=True, method="reload", detail=(
                f"structure changed: config checked and reloaded, new worker serving after "
                f"{reload_ms:.0f} ms; {changed} runtime change(s); {total_ms:.0f} ms in all"))
        return ApplyResult(applied=True, method="runtime", detail=(
            f"{changed} runtime weight/state change(s) in {total_ms:.0f} ms, no reload"))

    def read_back(self) -> dict[str, dict[str, int]]:
        return {backend[len("route-"):]: shares(weights)
                for backend, weights in self._live_weights().items()}

    def matches(self, desired: DesiredState, held: dict[str, dict[str, int]]) -> bool:
        """Equal at HAProxy's resolution (desired is quantised exactly as apply() quantises
        it), and the worker read back runs the desired structure."""
        try:
            rendered = render_config(self.renderable(desired).desired, self.settings)
        except AdapterError:
            return False
        if self._live_structure is not None and self._live_structure != rendered.structure:
            return False
        return held == rendered.expected_shares()

    def in_flight(self, pool: str) -> int:
        """Current sessions (`scur`) on the pool's servers, summed over every backend and over
        old workers still finishing streams after a reload (reached through the master CLI)."""
        return sum(_sessions(stat, pool) for stat in self._stats_of_every_worker())

    def pool_counters(self) -> dict[str, PoolCounters]:
        """Per pool, over every route backend: sessions (`stot`) and errors (`hrsp_5xx` +
        `econ` + `eresp`) of the current worker — they restart from 0 at each reload, like a
        restart — and in-flight sessions of every worker."""
        stats = self._stats_of_every_worker()
        return _pool_counters(stats[0], stats)

    # --- helpers ---

    def _runtime(self, command: str) -> str:
        return runtime_command(self.settings.runtime_address, command,
                               timeout_s=self.options.runtime_timeout_s)

    def _master(self, command: str) -> str:
        return runtime_command(self.options.master_socket, command,
                               timeout_s=self.options.runtime_timeout_s,
                               patience_s=MASTER_PATIENCE_S)

    def _running_structure(self) -> str:
        return _structure_of(self._runtime(f"show env {STRUCTURE_ENV}"))

    def _ask_worker(self, command: str) -> tuple[str, str]:
        """(structure of the worker that answered, its answer to `command`). One connection,
        so both come from the same worker even if another one is still winding down."""
        answer = self._runtime(f"show env {STRUCTURE_ENV}; {command}")
        head, _, rest = answer.partition("\n\n")
        return _structure_of(head), rest

    def _ask_current(self, structure: str, command: str) -> str:
        answered_by, answer = self._ask_worker(command)
        if answered_by != structure:
            raise AdapterError(f"a worker with config {answered_by or '?'} answered, not the "
                               f"one with {structure}: a reload is under way")
        return answer

    def _live_weights(self) -> dict[str, dict[str, int]]:
        self._live_structure, state = self._ask_worker("show servers state")
        live: dict[str, dict[str, int]] = {}
        for row in parse_servers_state(state):
            if row.backend.startswith("route-"):
                live.setdefault(row.backend, {})[row.server] = row.effective
        return live

    def _set_weights(self, rendered: Rendered) -> int:
        state = self._ask_current(rendered.structure, "show servers state")
        rows = {(r.backend, r.server): r for r in parse_servers_state(state)}
        raise_first, lower_last = [], []
        for backend, servers in rendered.targets.items():
            for server, weight in servers.items():
                row = rows.get((backend, server))
                if row is None:
                    raise AdapterError(f"HAProxy has no server {backend}/{server}")
                up, down = _commands(f"{backend}/{server}", row, weight)
                raise_first += up
                lower_last += down
        commands = raise_first + lower_last
        if commands:
            answer = self._ask_current(rendered.structure, "; ".join(commands))
            if answer.strip():
                raise AdapterError(f"HAProxy refused a runtime change: {answer.strip()[:300]}")
            self._save_state(rendered.structure)
        return len(commands)

    def _save_state(self, structure: str) -> None:
        """Keep the state file current, so a reload or restart by anyone restores it."""
        _write_atomic(self.settings.state_file, self._ask_current(structure, "show servers state"))

    def _reload(self, rendered: Rendered) -> float:
        config_path, state_file = self.settings.config_path, self.settings.state_file
        self._check(rendered.text, config_path)
        started = time.monotonic()
        previous = config_path.read_text() if config_path.exists() else None
        # The new worker starts from this file: live state with fleetctl's weights written over
        # it, so a surviving server never starts with a stale runtime weight.
        live_state = self._runtime("show servers state")
        _write_atomic(state_file, with_weights(live_state, rendered.targets))
        _write_atomic(config_path, rendered.text)
        try:
            self._master_reload(rendered.structure)
        except AdapterError:
            # Put back what the running worker was started from and holds now.
            if previous is not None:
                _write_atomic(config_path, previous)
            _write_atomic(state_file, live_state)
            raise
        return (time.monotonic() - started) * 1000

    def _check(self, config: str, config_path: Path) -> None:
        binary = self.options.haproxy_bin
        done = run_config_check(lambda candidate: [binary, "-c", "-f", str(candidate)],
                                config_path.with_name(config_path.name + ".fleetctl-check"),
                                config, what=f"{binary} -c")
        if done.returncode != 0:
            output = (done.stderr + done.stdout).splitlines()
            alerts = [line for line in output if "[ALERT]" in line] or output
            raise AdapterError("haproxy -c rejected the rendered config: "
                               + " | ".join(alerts)[:800], permanent=True)

    def _master_reload(self, structure: str) -> None:
        """Reload and return once the new worker serves `structure` and every previous worker
        is in soft-stop (it stopped accepting; it still finishes what it has in flight)."""
        show_proc = self._master("show proc")
        failed_before = _failed_reloads(show_proc)
        previous, _ = _workers(show_proc)
        self._master("reload")
        deadline = time.monotonic() + self.options.reload_timeout_s
        while time.monotonic() < deadline:
            # While the master re-executes, either socket may briefly refuse: keep polling.
            show_proc = _quietly(lambda: self._master("show proc")) or ""
            if _failed_reloads(show_proc) > failed_before:
                raise AdapterError("HAProxy failed to load the new config on reload; the "
                                   "previous one keeps serving")
            current, _ = _workers(show_proc)
            if current and not set(current) & set(previous) \
                    and _quietly(self._running_structure) == structure \
                    and all(self._stopping(pid) for pid in previous):
                return
            time.sleep(0.005)
        raise AdapterError(f"no worker runs the new config alone after "
                           f"{self.options.reload_timeout_s:g} s; the previous one keeps serving")

    def _stopping(self, pid: int) -> bool:
        answer = _quietly(lambda: self._master(f"@!{pid} show info")) or ""
        return "Stopping: 1" in answer or "Pid:" not in answer  # in soft-stop, or gone

    def _stats_of_every_worker(self) -> list[str]:
        """`show stat` of the current worker first, then of each old one."""
        pids = _worker_pids(self._master("show proc"))
        if not pids:
            return [self._runtime("show stat")]
        return [self._master(f"@!{pid} show stat") for pid in pids]


def _commands(target: str, row: LiveServer, weight: int) -> tuple[list[str], list[str]]:
    """(commands that add capacity, commands that remove it) bringing one server to `weight`.
    Weight 0 is a drain: the server keeps its in-flight requests and gets no new ones."""
    live = row.effective
    if weight == 0:
        return [], ([] if live == 0 else [f"set server {target} state drain"])
    commands = [] if row.weight == weight else [f"set weight {target} {weight}"]
    if row.admin_state & _NO_NEW_REQUESTS:
        commands.append(f"set server {target} state ready")
    return (commands, []) if weight >= live else ([], commands)


def with_weights(state: str, targets: dict[str, dict[str, int]]) -> str:
    """A `show servers state` dump with the weights and drain flags of `targets` written in."""
    lines = []
    for line in state.splitlines():
        fields = line.split()
        if len(fields) >= 9 and not line.startswith("#") \
                and fields[3] in targets.get(fields[1], {}):
            weight = targets[fields[1]][fields[3]]
            admin = int(fields[6]) & ~_DRAIN_FLAGS
            fields[6] = str(admin | (_FORCED_DRAIN if weight == 0 else 0))
            fields[7] = str(weight)
            line = " ".join(fields)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _structure_of(show_env: str) -> str:
    answer = show_env.strip()
    return answer.partition("=")[2] if answer.startswith(f"{STRUCTURE_ENV}=") else ""


def _quietly(call: Callable[[], str]) -> str | None:
    try:
        return call()
    except AdapterError:
        return None


def _failed_reloads(show_proc: str) -> int:
    match = re.search(r"\[failed: (\d+)\]", show_proc)
    return int(match.group(1)) if match else 0


def _worker_pids(show_proc: str) -> list[int]:
    current, old = _workers(show_proc)
    return current + old


def _workers(show_proc: str) -> tuple[list[int], list[int]]:
    """`show proc` on the master CLI -> (current workers, old workers finishing requests)."""
    sections: dict[str, list[int]] = {"# workers": [], "# old workers": []}
    section = ""
    for line in show_proc.splitlines():
        if line.startswith("#"):
            section = line.strip()
            continue
        fields = line.split()
        if section in sections and len(fields) >= 2 and fields[0].isdigit():
            sections[section].append(int(fields[0]))
    return sections["# workers"], sections["# old workers"]


def _server_rows(show_stat: str) -> list[dict[str, str]]:
    """`show stat` CSV -> one dict per server of a route backend."""
    header: list[str] = []
    rows = []
    for line in show_stat.splitlines():
        if line.startswith("# "):
            header = line[2:].split(",")
            continue
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("pxname", "").startswith("route-") and row.get("svname") not in (
                None, "FRONTEND", "BACKEND"):
            rows.append(row)
    return rows


def _count(row: dict[str, str], *names: str) -> int:
    return sum(int(row.get(name) or 0) for name in names)


def _sessions(show_stat: str, pool: str) -> int:
    return sum(_count(row, "scur") for row in _server_rows(show_stat)
               if pool_of(row["svname"]) == pool)


def _pool_counters(current: str, every_worker: list[str]) -> dict[str, PoolCounters]:
    totals: dict[str, list[int]] = {}
    for row in _server_rows(current):
        counts = totals.setdefault(pool_of(row["svname"]), [0, 0, 0])
        counts[0] += _count(row, "stot")
        counts[1] += _count(row, "hrsp_5xx", "econ", "eresp")
    for stat in every_worker:
        for row in _server_rows(stat):
            totals.setdefault(pool_of(row["svname"]), [0, 0, 0])[2] += _count(row, "scur")
    return {pool: PoolCounters(requests_total=t, errors_total=e, active=a)
            for pool, (t, e, a) in totals.items()}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
