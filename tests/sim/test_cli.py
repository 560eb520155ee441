"""`fleetctl sim` / `python -m fleetctl.sim`: start-up lines, argument errors, clean stops."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fleetctl.sim.cli import add_arguments

from .simproc import MODEL, REPO, SimProcess, client, run_cli

pytestmark = pytest.mark.slow

StartSim = Callable[..., SimProcess]


def test_one_process_serves_each_pool_on_its_own_port_and_says_so(start_sim: StartSim) -> None:
    sim = start_sim("--pool", "h200@0", "--pool", "amd=mi300x@0", "--model", "m1",
                    "--model", "m2", pools=2)
    pattern = (r"sim pool (\S+) \((simulated [^)]+)\) on http://127\.0\.0\.1:(\d+) "
               r"models: m1, m2")
    parsed = [re.fullmatch(pattern, line) for line in sim.banners]
    assert all(parsed), sim.banners
    assert [(m[1], m[2]) for m in parsed if m] == [("h200", "simulated H200-class"),
                                                   ("amd", "simulated MI300X-class")]
    assert len({m[3] for m in parsed if m}) == 2
    for url in sim.urls.values():
        assert [m.id for m in client(url).models.list().data] == ["m1", "m2"]
    state = httpx.get(f"{sim.url('amd')}/admin/state").json()
    assert state["profile"]["vendor"] == "rocm"
    assert sim.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_process_cleanly_even_mid_stream(
    start_sim: StartSim, sig: signal.Signals
) -> None:
    sim = start_sim("--pool", "h200@0")
    outcome: dict[str, Any] = {}
    streaming = threading.Event()

    def long_stream() -> None:
        try:
            for chunk in client(sim.url("h200")).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "go on"}],
                max_tokens=5000, stream=True, extra_body={"ignore_eos": True},
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    streaming.set()
            outcome["end"] = "completed"
        except (openai.APIError, httpx.HTTPError) as exc:
            outcome["end"] = type(exc).__name__

    reader = threading.Thread(target=long_stream)
    reader.start()
    assert streaming.wait(30)
    started = time.monotonic()
    assert sim.stop(sig, timeout_s=30) == 0, sim.log()
    # The stream still needs ~50 s (5,000 tokens at 10 ms): stopping within 20 s means the
    # process did not wait for it, with room for a loaded machine (it takes ~1 s).
    assert time.monotonic() - started < 20
    reader.join(30)
    assert not reader.is_alive()
    assert outcome["end"] != "completed"  # cut short, told so, and not hanging
    assert "Traceback" not in sim.log()


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--pool", "h200"], "is not [NAME=]PROFILE[:KEY=VALUE,...]@PORT"),
        (["--pool", "h200@99999"], "out of range"),
        (["--pool", "nope@0"], "unknown profile 'nope' (known: a100, a100-legacy, gaudi3, h200"),
        (["--pool", "h200:tool_calls@0"], "'tool_calls' in 'h200:tool_calls@0' is not KEY=VALUE"),
        (["--pool", "h200:tool_calls=maybe@0"], "--pool h200.tool_calls: expected true or "
         "false, got 'maybe'"),
        (["--pool", "h200:tokenizer=gpt2@0"], "--pool h200.tokenizer: expected one of llama3, "
         "other, got 'gpt2'"),
        (["--pool", "h200:speed=3@0"], "--pool h200.speed: unknown field"),
        (["--pool", "h200:max_seqs=lots@0"], "--pool h200.max_seqs: expected an integer >= 1"),
        (["--pool", "h200:models=m1@0"], "--pool h200.models: cannot be set on --pool"),
        ([], "at least one --pool is required"),
        (["--pool", "h200@0", "--pool", "h200@0"], "pool name 'h200' used twice"),
        (["--pool", "a=h200@8555", "--pool", "b=a100@8555"], "port 8555 used twice"),
        (["--pool", "h200@0", "--ground-truth-size", "0"], "must be >= 1"),
    ],
)
def test_bad_arguments_are_argparse_errors(args: list[str], complaint: str) -> None:
    done = run_cli(*args)
    assert done.returncode == 2
    assert complaint in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_profiles_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[profiles.tiny]\nbase = "h200"\nmax_seqs = "lots"\n')
    done = run_cli("--profiles", str(path), "--pool", "tiny@0")
    assert done.returncode == 2
    assert "profiles.tiny.max_seqs: expected an integer >= 1, got 'lots'" in done.stderr


def test_a_busy_port_is_reported_without_a_traceback() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("--pool", f"h200@{port}")
    assert done.returncode == 1
    assert "cannot listen on 127.0.0.1" in done.stderr
    assert "Traceback" not in done.stderr


def test_list_profiles_shows_every_builtin() -> None:
    done = run_cli("--list-profiles")
    assert done.returncode == 0
    for name in ("h200", "a100", "a100-legacy", "mi300x", "tpu-v5e", "gaudi3"):
        assert re.search(rf"^{re.escape(name)}\s", done.stdout, re.M), name
    assert done.stdout.count("simulated") == 6
    assert "older serving stack: no tool parsing, another tokenizer" in done.stdout


def test_the_cli_mounts_on_any_parser() -> None:
    parser = argparse.ArgumentParser(prog="fleetctl")
    sub = parser.add_subparsers(dest="command")
    add_arguments(sub.add_parser("sim"))
    args = parser.parse_args(["sim", "--pool", "a=h200@8101", "--pool", "mi300x@8102"])
    assert [(p.name, p.profile, p.port) for p in args.pool] == [("a", "h200", 8101),
                                                                ("mi300x", "mi300x", 8102)]
    fault = parser.parse_args(["sim", "fault", "--url", "http://127.0.0.1:8101", "--down"])
    assert (fault.sim_command, fault.down, fault.url) == ("fault", True, "http://127.0.0.1:8101")


def test_the_simulator_runs_without_django() -> None:
    code = (
        "import sys, asyncio\n"
        "import fleetctl.sim, fleetctl.sim.cli, fleetctl.sim.__main__\n"
        "from fleetctl.sim import BUILTIN_PROFILES, PoolSpec, serve_async\n"
        "async def main():\n"
        "    stop = asyncio.Event(); stop.set()\n"
        "    await serve_async([PoolSpec('p', BUILTIN_PROFILES['h200'], 0)], stop=stop)\n"
        "asyncio.run(main())\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=30,
                          env={k: v for k, v in os.environ.items() if "DJANGO" not in k})
    assert done.returncode == 0, done.stderr
    assert "sim pool p (simulated H200-class) on http://127.0.0.1:" in done.stdout
