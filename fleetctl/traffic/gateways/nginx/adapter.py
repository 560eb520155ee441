"""nginx adapter (Debian `nginx-light` 1.22): a rendered config, validated, swapped, reloaded.

`GatewaySpec.admin_address` is the nginx prefix directory: fleetctl owns `nginx.conf` there
(and the pid file, error log, temp paths and a refusal socket). render.py says how a request
finds its pool; options.py lists the options.

Reload: `nginx -t` on a candidate file, atomic rename, SIGHUP to the master. The apply is done
when `/__fleetctl_version` answers the new version AND every old worker has retired (process
title "shutting down", listening sockets closed): nginx's master waits ~100 ms after starting
new workers before it retires the old ones, and until then an old worker can still accept a
new connection. Old workers keep serving their in-flight streams (no `worker_shutdown_timeout`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

from fleetctl.core.http import OutboundError, shared_client
from fleetctl.traffic.gateways.base import (
    Adapter,
    AdapterError,
    ApplyResult,
    DesiredState,
    GatewaySpec,
    PoolTarget,
    run_config_check,
)
from fleetctl.traffic.gateways.nginx.options import NginxOptions
from fleetctl.traffic.gateways.nginx.render import (
    CONF_NAME,
    LiveConfig,
    NginxSettings,
    Rendered,
    parse_config,
    pool_problem,
    render_config,
)

# --- the adapter ----------------------------------------------------------------------------------

class NginxAdapter(Adapter[NginxOptions]):
    kind = "nginx"
    weight_resolution = "0.01 % (weights in basis points; a 0 weight leaves the pool out)"

    def __init__(self, gateway: GatewaySpec) -> None:
        super().__init__(gateway)
        self.settings = NginxSettings(gateway=gateway.name, prefix=Path(gateway.admin_address),
                                      options=self.options)
        self._held_mirror: dict[str, int] | None = None

    @classmethod
    def check_pool(cls, pool: PoolTarget) -> str | None:
        return pool_problem(pool)

    def apply_checked(self, desired: DesiredState) -> ApplyResult:
        rendered = render_config(desired, self.settings)
        master = self._master_pid()
        if self._running_version() == rendered.version and self._file_version() == \
                rendered.version:
            return ApplyResult(applied=True, method="none",
                               detail=f"nginx already runs version {rendered.version}; no reload")
        started = time.monotonic()
        self._validate(rendered.text)
        validated_ms = (time.monotonic() - started) * 1000
        reload_ms = self._swap_and_reload(master, rendered)
        return ApplyResult(applied=True, method="reload", detail=(
            f"reload used: SIGHUP → new workers serving version {rendered.version} and old "
            f"workers retired in {reload_ms:.0f} ms (nginx -t took {validated_ms:.0f} ms); "
            f"old workers finish their in-flight streams"))

    def read_back(self) -> dict[str, dict[str, int]]:
        live = self._live_config()
        running = self._running_version()
        if running != live.version:
            raise AdapterError(f"nginx serves version {running or '(none)'} but its config file "
                               f"holds {live.version or '(none)'}: a reload failed or is pending")
        self._held_mirror = live.mirror
        return live.routes

    def read_back_mirror(self) -> dict[str, int] | None:
        """The `# fleetctl-mirror` lines of the config read_back() just found running (the
        file's version is the one nginx serves, so what it says is held)."""
        if self._held_mirror is None:
            self.read_back()
        held, self._held_mirror = self._held_mirror, None
        return held

    def in_flight(self, pool: str) -> int:
        """Established connections from nginx workers (old ones included) to the pool's
        endpoints. nginx-light's stub_status has no per-upstream counts, and upstream keepalive
        is off, so each such connection is one request or stream in flight. Needs this host's
        /proc (fleetctl on the nginx host, allowed to read the workers' fds)."""
        addresses = self._live_config().addresses.get(pool, set())
        if not addresses:
            return 0
        workers = _children(self._master_pid())
        return _established_to(self._master_pid(), workers, _resolve(addresses))

    # --- helpers ---

    def _live_config(self) -> LiveConfig:
        try:
            return parse_config(self.settings.conf.read_text())
        except OSError as exc:
            raise AdapterError(f"cannot read {self.settings.conf}: {exc}") from exc

    def _file_version(self) -> str:
        try:
            return parse_config(self.settings.conf.read_text()).version
        except OSError:
            return ""

    def _running_version(self) -> str:
        try:
            response = shared_client().get(self.settings.status_url,
                                            timeout_s=self.options.http_timeout_s)
        except OutboundError as exc:
            raise AdapterError(f"nginx at {self.options.listen} does not answer: {exc}") from exc
        return response.text.strip() if response.status_code == 200 else ""

    def _master_pid(self) -> int:
        try:
            pid = int(self.settings.pid_file.read_text().strip())
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError) as exc:
            raise AdapterError(f"nginx master for {self.settings.prefix} is not running: "
                               f"{exc}") from exc
        if b"nginx: master process" not in title:
            raise AdapterError(f"pid {pid} in {self.settings.pid_file} is not an nginx master")
        return pid

    def _validate(self, text: str) -> None:
        binary, prefix = self.options.nginx_bin, str(self.settings.prefix)
        done = run_config_check(
            lambda candidate: [binary, "-t", "-q", "-p", prefix, "-c", str(candidate),
                               "-e", "stderr"],
            self.settings.prefix / f"{CONF_NAME}.fleetctl-check", text, what=f"{binary} -t")
        if done.returncode != 0:
            raise AdapterError(f"nginx -t rejected the rendered config: "
                               f"{(done.stderr or done.stdout).strip()[:800]}", permanent=True)

    def _swap_and_reload(self, master: int, rendered: Rendered) -> float:
        conf = self.settings.conf
        previous = conf.read_text() if conf.exists() else None
        serving = [pid for pid in _children(master) if not _retiring(pid)]
        _write_atomic(conf, rendered.text)
        started = time.monotonic()
        try:
            os.kill(master, signal.SIGHUP)
            self._wait_for(rendered.version, serving, started + self.options.reload_timeout_s)
        except (AdapterError, OSError) as exc:
            if previous is not None:
                _write_atomic(conf, previous)
                _signal_quietly(master, signal.SIGHUP)
            raise AdapterError(f"nginx did not take the new config: {exc}; the previous file "
                               "is back") from exc
        return (time.monotonic() - started) * 1000

    def _wait_for(self, version: str, old_workers: list[int], deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                current = self._running_version()
            except AdapterError:
                current = ""
            if current == version and all(_retiring(pid) for pid in old_workers):
                return
            time.sleep(0.002)
        raise AdapterError(f"version {version} not served with old workers retired within "
                           f"{self.options.reload_timeout_s:g} s")


# --- /proc ----------------------------------------------------------------------------------------

def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(entry))
    return found


def _retiring(pid: int) -> bool:
    """Gone, or an nginx worker that got the QUIT signal (it closed its listening sockets)."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"shutting down" in title or b"nginx: worker" not in title


def _socket_inodes(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _resolve(addresses: set[str]) -> set[tuple[str, int]]:
    resolved = set()
    for address in addresses:
        host, _, port = address.rpartition(":")
        for info in socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM):
            resolved.add((str(info[4][0]), int(port)))
    return resolved


def _established_to(master: int, workers: list[int], remotes: set[tuple[str, int]]) -> int:
    inodes = _socket_inodes(workers)
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{master}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # fields: sl local remote state ... inode (index 9); state 01 = ESTABLISHED
            if fields[3] == "01" and fields[9] in inodes and _decode(fields[2]) in remotes:
                count += 1
    return count


def _decode(hex_address: str) -> tuple[str, int]:
    """/proc/net/tcp{,6} address "0100007F:1F90" -> ("127.0.0.1", 8080)."""
    address, port = hex_address.split(":")
    raw = bytes.fromhex(address)
    # The kernel prints each 32-bit word in host (little-endian) order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    text = socket.inet_ntop(family, raw)
    if text.startswith("::ffff:") and "." in text:
        text = text[7:]
    return text, int(port, 16)


def _signal_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
