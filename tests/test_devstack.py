"""`make demo` as a small install: its launcher supervises the children — one that dies is
restarted with backoff and the others keep running — and stops only on Ctrl-C / SIGTERM or
when something cannot start at all."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetctl.demo import devstack
from fleetctl.demo.devstack import Stack
from tests.conftest import ROOT
from tests.sim import simproc
from tests.support.waiting import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


class Supervised:
    """A Stack whose supervision loop runs in a thread, with everything it logged."""

    def __init__(self, stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
        self.stack = stack
        self._capsys = capsys
        self._output = ""
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=stack.supervise, kwargs={"poll_s": 0.05, "until": self._done.is_set})

    def run(self) -> None:
        self._thread.start()

    def log(self) -> str:
        self._output += self._capsys.readouterr().out
        return self._output

    def pid(self, name: str) -> int:
        child = next(c for c in self.stack.children if c.name == name)
        assert child.proc is not None
        return child.proc.pid

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        self.stack.stop()  # ignores Ctrl-C while it stops; give pytest its handlers back
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


@pytest.fixture
def supervised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> Iterator[Supervised]:
    monkeypatch.setattr(devstack, "VAR", tmp_path)  # the children's logs go here
    stack = Stack(first_restart_s=0.1, max_restart_s=0.4, stable_after_s=2.0)
    harness = Supervised(stack, capsys)
    yield harness
    harness.close()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def test_a_killed_child_is_restarted_and_logged_while_the_others_keep_running(supervised):
    for name in ("web", "worker-push", "beat"):
        supervised.stack.start(name, SLEEPER, dict(os.environ))
    supervised.run()
    web, victim, beat = (supervised.pid(n) for n in ("web", "worker-push", "beat"))

    os.kill(victim, signal.SIGKILL)

    wait_until(lambda: "worker-push restarted" in supervised.log(), what="the restart")
    assert ("[fleetctl] worker-push was killed by SIGKILL; restarting in 0.1 s (restart 1)"
            in supervised.log())
    assert supervised.pid("worker-push") != victim and alive(supervised.pid("worker-push"))
    assert (supervised.pid("web"), supervised.pid("beat")) == (web, beat)
    assert alive(web) and alive(beat)


def test_a_child_that_keeps_failing_is_restarted_with_doubling_delays_up_to_the_cap(
        supervised):
    supervised.stack.start("worker", [sys.executable, "-c", "raise SystemExit(3)"],
                           dict(os.environ))
    supervised.stack.start("web", SLEEPER, dict(os.environ))
    web = supervised.pid("web")
    supervised.run()

    wait_until(lambda: "(restart 5)" in supervised.log(), what="five restarts")
    delays = re.findall(r"worker exited with 3; restarting in ([\d.]+) s \(restart (\d)\)",
                        supervised.log())
    assert delays[:5] == [("0.1", "1"), ("0.2", "2"), ("0.4", "3"), ("0.4", "4"),
                          ("0.4", "5")]
    assert supervised.pid("web") == web and alive(web)


def test_a_child_that_stayed_up_a_while_is_restarted_after_the_shortest_delay_again(
        supervised):
    # Up longer than stable_after_s (2 s) each time: every exit is a fresh incident.
    supervised.stack.start("beat", [sys.executable, "-c",
                                    "import time; time.sleep(2.5); raise SystemExit(1)"],
                           dict(os.environ))
    supervised.run()

    wait_until(lambda: "(restart 2)" in supervised.log(), timeout_s=60, what="two restarts")
    assert re.findall(r"beat exited with 1; restarting in ([\d.]+) s", supervised.log())[:2] \
        == ["0.1", "0.1"]


def test_a_one_shot_child_that_finishes_is_left_alone_and_one_that_fails_is_restarted(
        supervised):
    # The capacity drill is such a child: exit 0 is done, any other exit a crash.
    supervised.stack.start("demo-drill", [sys.executable, "-c", "pass"], dict(os.environ),
                           once=True)
    supervised.stack.start("one-shot", [sys.executable, "-c", "raise SystemExit(2)"],
                           dict(os.environ), once=True)
    supervised.run()

    wait_until(lambda: "[fleetctl] demo-drill finished" in supervised.log()
               and "(restart 2)" in supervised.log(), what="the finish and two restarts")
    assert "demo-drill exited" not in supervised.log()
    assert "one-shot exited with 2; restarting in 0.1 s (restart 1)" in supervised.log()
    assert [c.name for c in supervised.stack.children if c.done] == ["demo-drill"]

def test_a_child_that_cannot_start_the_first_time_stops_with_a_clear_message(supervised):
    with pytest.raises(SystemExit, match=r"\[fleetctl\] envoy could not start: .*No such file"):
        supervised.stack.start("envoy", ["/nonexistent/envoy"], dict(os.environ))


# --- the real demo ----------------------------------------------------------------------------

def children(pid: int) -> dict[int, str]:
    """pid → command line of every process whose parent is `pid`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found[int(entry.name)] = cmdline
    return found


def descendants(pid: int) -> set[int]:
    found = set(children(pid))
    for child in list(found):
        found |= descendants(child)
    return found


def pid_of(pids: dict[int, str], marker: str) -> int:
    [pid] = [pid for pid, cmdline in pids.items() if marker in cmdline]
    return pid


def gateway_answers(url: str) -> bool:
    try:
        answer = httpx.post(f"{url}/v1/chat/completions", timeout=10, json={
            "model": "llama-3.1-8b-instruct", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]})
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


Demo = tuple[subprocess.Popen[bytes], Path, str]


@contextlib.contextmanager
def running_demo(tmp_path: Path) -> Iterator[Demo]:
    """`python -m fleetctl.demo.devstack demo` as `make demo` runs it (embedded Redis, SQLite),
    in a data directory and on ports of its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME")}
    gateway_port = devstack.free_port()
    env.update(FLEETCTL_DATA_DIR=str(tmp_path), PORT=str(devstack.free_port()),
               FLEETCTL_SIM_BASE_PORT=str(
                   simproc.free_ports(len(devstack.DEMO_SIM_POOLS) + 1)),
               FLEETCTL_GATEWAY_PORT=str(gateway_port),
               FLEETCTL_GATEWAY_ADMIN_PORT=str(devstack.free_port()),
               FLEETCTL_REDIS_PORT=str(devstack.free_port()), TRAFFIC_RECONCILE_INTERVAL_S="5",
               FLEETCTL_XDS_PORT=str(devstack.free_port()),
               FLEETCTL_SHADOW_COLLECTOR_PORT=str(devstack.free_port()))
    output = tmp_path / "demo.out"
    with output.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fleetctl.demo.devstack", "demo"], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: proc.poll() is not None
                   or "demo is running" in output.read_text(errors="replace"),
                   timeout_s=180, every_s=0.5, what="the demo to start")
        assert proc.poll() is None, output.read_text(errors="replace")
        yield proc, output, f"http://127.0.0.1:{gateway_port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    """A demo of the test's own: for a test that kills its children or stops it."""
    with running_demo(tmp_path) as running:
        yield running


@pytest.fixture(scope="module")
def shared_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One demo for the tests that only look at it (its pages, its rows, its log): starting
    one costs a dozen processes and the seed. None of them changes what the others read."""
    with running_demo(tmp_path_factory.mktemp("demo")) as running:
        yield running


@pytest.mark.slow
def test_the_demo_restarts_a_dead_worker_and_a_dead_envoy_and_stops_cleanly_on_sigterm(demo):
    proc, output, gateway = demo
    wait_until(lambda: gateway_answers(gateway), timeout_s=60, every_s=0.5,
               what="the gateway to carry traffic")
    before = children(proc.pid)
    worker = pid_of(before, "push@%h")

    os.kill(worker, signal.SIGKILL)

    wait_until(lambda: "worker-push restarted" in output.read_text(), timeout_s=60,
               what="the push worker to be restarted")
    assert "[fleetctl] worker-push was killed by SIGKILL; restarting in 1 s (restart 1)" \
        in output.read_text()
    after = children(proc.pid)
    assert {pid for pid in before if pid != worker} <= set(after)  # nobody else restarted
    assert pid_of(after, "push@%h") != worker
    assert gateway_answers(gateway)

    os.kill(pid_of(after, "--base-id"), signal.SIGKILL)  # Envoy

    wait_until(lambda: "envoy restarted" in output.read_text(), timeout_s=60,
               what="Envoy to be restarted")
    assert "[fleetctl] envoy was killed by SIGKILL; restarting in 1 s" in output.read_text()
    wait_until(lambda: gateway_answers(gateway), timeout_s=60, every_s=0.5,
               what="the gateway to answer again")

    every_process = descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert "[fleetctl] stopped." in output.read_text()
    assert not [pid for pid in every_process if alive(pid)]


def _demo_rows(data_dir: Path, sql: str) -> list[tuple[object, ...]]:
    """Rows of the demo's own SQLite database (read-only, while it runs)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(
            f"file:{data_dir / 'fleetctl.sqlite3'}?mode=ro", uri=True, timeout=10)) as db:
        return db.execute(sql).fetchall()


@pytest.mark.slow
def test_the_demo_seeds_a_guarded_ramp_that_steps_on_live_telemetry_from_envoys_access_log(
        shared_demo):
    proc, output, _gateway = shared_demo
    data_dir = output.parent
    banner = output.read_text()
    assert "created" in banner and "ramp of gaudi3-in-west on llama-8b" in banner, banner
    assert re.search(r"fleetctl sim fault --url http://127\.0\.0\.1:\d+ --added-latency-ms 300",
                     banner), banner
    assert "/ramps/" in banner
    assert "fleetctl.telemetry.ingest" in " ".join(children(proc.pid).values())
    [(kind, options)] = _demo_rows(data_dir, "SELECT kind, options FROM traffic_gateway "
                                             "WHERE name = 'envoy-demo'")
    assert json.loads(str(options))["access_log"] == str(data_dir / "envoy" / "access.log")
    # Envoy is fed over xDS by the demo's xds_serve, with the gateway's token (kept 0600).
    assert kind == "envoy-xds"
    assert (data_dir / "envoy" / "xds-token").stat().st_mode & 0o777 == 0o600
    assert "xds_serve" in " ".join(children(proc.pid).values())
    assert re.search(r"xDS\s+127\.0\.0\.1:\d+", banner), banner
    wait_until(lambda: _demo_rows(data_dir, "SELECT node_id FROM xds_xdsenvoy WHERE "
                                            "gateway = 'envoy-demo' AND gone_at IS NULL"),
               timeout_s=60, every_s=1, what="Envoy to connect to the xDS server")

    # The ingester follows Envoy's access log (the demo traffic's lines are counted), and the
    # ramp's first step (5 %) is set once the controller runs.
    wait_until(lambda: any(lines for (lines,) in _demo_rows(
        data_dir, "SELECT lines FROM telemetry_cursor WHERE path LIKE '%access.log'")),
        timeout_s=120, every_s=1, what="the ingester to count access log lines")
    [(state, step)] = wait_until(lambda: _demo_rows(
        data_dir, "SELECT state, step_index FROM ramps_ramp WHERE step_index >= 0"),
        timeout_s=120, every_s=1, what="the ramp's first step")
    assert state == "running" and step in (0, 1)


def test_the_demo_turns_debug_off_unless_asked_and_keeps_one_secret_key(tmp_path, monkeypatch):
    monkeypatch.setattr(devstack, "VAR", tmp_path)
    quiet: dict[str, str] = {"DEBUG": ""}
    devstack._demo_settings(quiet)
    assert (quiet["DEBUG"], quiet["SECURE_COOKIES"]) == ("0", "0")
    assert quiet["SECRET_KEY"] == (tmp_path / "demo-secret-key").read_text().strip()
    assert (tmp_path / "demo-secret-key").stat().st_mode & 0o777 == 0o600
    again: dict[str, str] = {}
    devstack._demo_settings(again)
    assert again["SECRET_KEY"] == quiet["SECRET_KEY"]  # sessions survive a restart
    asked = {"DEBUG": "1", "SECRET_KEY": "mine"}
    devstack._demo_settings(asked)
    assert (asked["DEBUG"], asked["SECRET_KEY"]) == ("1", "mine")


@pytest.mark.slow
def test_the_demo_runs_with_debug_off_and_serves_its_own_static_files(shared_demo):
    _proc, output, _gateway = shared_demo
    found = re.search(r"dashboard\s+(http://\S+?)/\s", output.read_text())
    assert found, output.read_text()
    web = found.group(1)

    missing = httpx.get(f"{web}/no-such-page/", timeout=30)
    assert missing.status_code == 404
    # DEBUG's 404 page lists every URL pattern, the API's included.
    assert "URLconf" not in missing.text and "api/v1/" not in missing.text
    assert "There is nothing at this address." in missing.text
    # Served by the app itself (whitenoise), with no collectstatic step.
    for path in ("/static/vendor/htmx.min.js", "/static/plotly/plotly.min.js",
                 "/static/admin/css/base.css"):
        asset = httpx.get(f"{web}{path}", timeout=30)
        assert asset.status_code == 200 and asset.content, path

    for host in ("127.0.0.1", "localhost"):
        assert httpx.get(f"{web}/login/", headers={"Host": host}, timeout=30).status_code == 200
    password = (output.parent / "demo-password").read_text().strip()
    with httpx.Client(base_url=web, timeout=30) as browser:
        browser.get("/login/")  # the CSRF cookie: it must come back over plain http
        signed_in = browser.post("/login/", data={
            "username": "admin", "password": password,
            "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
        assert signed_in.status_code == 302 and signed_in.headers["location"] == "/"
        assert "admin" in browser.get("/").text


def test_a_demo_password_starting_with_a_dash_reaches_the_seed_whole():
    from fleetctl.demo.management.commands.demo_seed import Command

    parser = Command().create_parser("manage.py", "demo_seed")
    [name, *args] = devstack.seed_args("-72n78pkJgSdOpZh", 8100, 9901)
    assert name == "demo_seed"
    assert parser.parse_args(args).password == "-72n78pkJgSdOpZh"
    # The Envoy's listener becomes the gateway's listen_url (the routing probe's way in).
    [_, *args] = devstack.seed_args("pw", 8100, 9901, 8000)
    assert parser.parse_args(args).gateway_listen == "http://127.0.0.1:8000"


def test_the_demo_seeds_an_xds_gateway_unless_asked_for_the_file_mode(monkeypatch, tmp_path):
    from fleetctl.demo.management.commands.demo_seed import GATEWAY, Command

    monkeypatch.setattr(devstack, "VAR", tmp_path)
    parser = Command().create_parser("manage.py", "demo_seed")
    xds = parser.parse_args(devstack.seed_args("pw", 8100, 9901)[1:])
    assert (xds.gateway_kind, xds.gateway_dir) == ("envoy-xds", str(tmp_path / "envoy"))
    assert xds.gateway_token_file == str(devstack.xds_token_path())
    admin = parser.parse_args(devstack.seed_args("pw", 8100, 9901, envoy_mode="admin")[1:])
    assert (admin.gateway_kind, admin.gateway_token_file) == ("envoy", "")
    assert devstack.GATEWAY == GATEWAY
    assert devstack._demo_envoy_mode({}) == "xds"
    assert devstack._demo_envoy_mode({"FLEETCTL_DEMO_ENVOY": "admin"}) == "admin"
    with pytest.raises(SystemExit, match="FLEETCTL_DEMO_ENVOY='files'"):
        devstack._demo_envoy_mode({"FLEETCTL_DEMO_ENVOY": "files"})


def test_everything_after_test_goes_to_pytest_options_first_included(monkeypatch):
    """`make test PYTEST_ARGS="-m 'not slow'"` (the README's advice) passes a leading option."""
    from fleetctl.demo import devstack, testrun

    seen: list[list[str]] = []
    monkeypatch.setattr(testrun, "run_tests", lambda args: seen.append(args) or 0)
    assert devstack.main(["test", "-m", "not slow", "-q"]) == 0
    assert devstack.main(["test"]) == 0
    assert devstack.main(["test", "tests/api", "-x"]) == 0
    assert seen == [["-m", "not slow", "-q"], [], ["tests/api", "-x"]]
