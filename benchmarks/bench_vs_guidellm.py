"""fleetctl's runner and GuideLLM against the same endpoint: TTFT and TPOT medians per client.

Answers one question: at fixed concurrency, does fleetctl's runner measure the server, or
partly the bursts it makes itself? Before streams were staggered, a level started all N
streams at once and, with equal request lengths, they stayed in lock step: every prompt
reached the server in the same decode step, and TTFT medians read higher than another
client's on the same endpoint while per-token times agreed.

The endpoint is **the project's own simulator** (`fleetctl sim`, the paced profile of
`bench_accuracy.py`: decode step 20 ms for any batch, prefill 20,000 tok/s, network 0), in
its own process; with `--endpoint mock` (or `both`) also **GuideLLM's mock server**
(`guidellm mock-server`, not written by this project; a fixed TTFT and ITL per request, no
batching, so lock step costs nothing there: it shows what the clients themselves add).
No independent OpenAI-compatible server that batches requests runs here without model weights.

Four clients, alternated in every round and at every level (the order rotates per round so
drift hits each alike):

- **fleetctl before**: the runner of `--before` (default: the commit before staggered
  starts), its `runner.py` and `stats.py` read with `git show` into a temporary package;
  all streams start at once.
- **fleetctl now**: this checkout's runner, streams staggered over the ramp (default: half
  the warm-up, as a run does).
- **GuideLLM** 0.8.1 (`guidellm run`, profile concurrent, a subprocess with its own workers).
- **GuideLLM ramp**: the same, its streams started over `--ramp` seconds (`rampup_duration`).

Same request shape for all: chat completions, ~256 prompt tokens, 128 output tokens
(`max_tokens` + `ignore_eos`), streamed, closed loop; same warm-up (requests *started* in it
are left out) and the same measured window. Printed per level and client: the TTFT median
and the per-token time median of every round, their median over rounds, and the ratio to
GuideLLM's. Per-token time: fleetctl's TPOT, (E2E − TTFT)/(N − 1), against GuideLLM's ITL,
(last − first token)/(N − 1) — the same quantity; GuideLLM's own "TPOT" includes TTFT
(spread over the tokens) and is printed beside it for reference.

GuideLLM's synthetic prompts need a tokenizer; so that nothing is downloaded, the script
builds a local word-level one (`tokenizers` WordLevel, split like the simulator) and runs
GuideLLM with HF_HUB_OFFLINE=1. One word = one token in it and in the simulator.

GuideLLM install (measurement only, a separate venv under var/, not a project dependency):

    python3.11 -m venv var/compare-venv
    var/compare-venv/bin/pip install --no-deps guidellm==0.8.1
    var/compare-venv/bin/pip install click~=8.4.0 culsans~=0.10.0 eval_type_backport faker \\
        ftfy 'httpx[http2]<1' loguru msgpack 'numpy>=2' protobuf 'pydantic>=2.11.7' \\
        pydantic-settings pyyaml rich sanic tabulate transformers uvloop \\
        'more-itertools>=10.8' 'typing-extensions>=4.15' 'websockets>=13' datasets jinja2
    var/compare-venv/bin/pip install torch   # a CPU build is enough

Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/bench_vs_guidellm.py [--levels 8,32] [--rounds 3] \\
        [--warmup 5] [--window 20] [--endpoint sim|mock|both] [--before COMMIT] \\
        [--guidellm var/compare-venv/bin/guidellm] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_accuracy import (  # noqa: E402
    MOCK_ITL_MS,
    MOCK_TTFT_MS,
    MODEL,
    PACED_PROFILE,
    STEP_MS,
    Row,
    start_guidellm_mock,
    start_simulator,
    stop,
)

from fleetctl.bench import runner as runner_now  # noqa: E402
from fleetctl.bench.runner import WORDS  # noqa: E402
from fleetctl.sim.textgen import _WORDS as SIM_WORDS  # noqa: E402

PROMPT_TOKENS = 256
OUTPUT_TOKENS = 128
# The last commit whose runner started every stream of a level at once.
BEFORE = "4a3f163"

TOKENIZER_SCRIPT = r"""
import json, os, sys
from faker.providers.lorem.en_US import Provider
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
out, words = sys.argv[1], json.loads(sys.argv[2])
vocab = {"[UNK]": 0}
for w in [*words, *Provider.word_list, *",.;:!?'\"-()"]:
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.normalizer = normalizers.Lowercase()
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.WhitespaceSplit(),
    pre_tokenizers.Split(Regex(r"\w+|[^\w\s]"), behavior="isolated")])
tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
tok.save(os.path.join(out, "tokenizer.json"))
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
               "model_max_length": 1000000}, f)
from transformers import AutoTokenizer
print(len(AutoTokenizer.from_pretrained(out)))
"""


def offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def build_tokenizer(python: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    words = sorted(set(SIM_WORDS) | set(WORDS))
    subprocess.run([python, "-c", TOKENIZER_SCRIPT, str(folder), json.dumps(words)],
                   check=True, env=offline_env(), capture_output=True, text=True)


# ---- fleetctl, before and now ------------------------------------------------------------------


def runner_before(commit: str, folder: Path) -> Any:
    """The runner of `commit` as a package of its own (its runner.py and stats.py)."""
    package = folder / "fleetctl_bench_before"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    for name in ("runner.py", "stats.py"):
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:fleetctl/bench/{name}"],
                              check=True, capture_output=True, text=True).stdout
        (package / name).write_text(text)
    sys.path.insert(0, str(folder))
    return importlib.import_module("fleetctl_bench_before.runner")


def run_fleetctl(module: Any, url: str, concurrency: int, warmup_s: float, window_s: float,
                 tag: str, ramp_s: float | None = None) -> dict[str, Any]:
    extra = {} if ramp_s is None else {"ramp_s": ramp_s}  # the runner before has no ramp
    plan = module.LevelPlan(warmup_s=warmup_s, window_s=window_s, min_samples=1,
                            max_duration_s=warmup_s + window_s + 60, request_timeout_s=60.0,
                            **extra)
    level = asyncio.run(module.run_level(
        module.Endpoint(url, MODEL), [Row(PROMPT_TOKENS, OUTPUT_TOKENS)], plan,
        concurrency=concurrency, request_id_prefix=f"vs-{tag}-{concurrency}-{time.time():.0f}"))
    ok = [r for r in level.results if r.status == "ok" and not r.warmup]
    starts = getattr(level, "stream_starts", None)
    return {
        "n": len(ok),
        "errors": sum(1 for r in level.results if r.status != "ok" and not r.warmup),
        "ttft_p50": statistics.median(r.ttft_s for r in ok) * 1e3,
        "tpot_p50": statistics.median(r.tpot_s for r in ok if r.tpot_s is not None) * 1e3,
        "start_spread": (max(t for _s, t, _e in starts) - min(t for _s, t, _e in starts)
                         if starts else 0.0),
    }


# ---- GuideLLM ---------------------------------------------------------------------------------


def run_guidellm(guidellm: str, url: str, concurrency: int, warmup_s: float, window_s: float,
                 tokenizer: Path, work: Path, tag: str, rampup_s: float = 0.0
                 ) -> dict[str, Any]:
    out = work / f"guidellm-{tag}.json"
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": MODEL,
                    "request_format": "/v1/chat/completions"},
        "profile": {"kind": "concurrent", "streams": [concurrency],
                    "rampup_duration": rampup_s,
                    "warmup": {"value": warmup_s, "mode": "duration"}},
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
        "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS,
                  "output_tokens": OUTPUT_TOKENS}],
        "constraints": [{"kind": "max_duration", "seconds": warmup_s + window_s}],
        "outputs": [{"kind": "json", "path": str(out)}],
    }}
    path = work / f"scenario-{tag}.json"
    path.write_text(json.dumps(scenario, indent=1))
    proc = subprocess.run([guidellm, "run", "-c", str(path), "--disable-progress"],
                          env=offline_env(), capture_output=True, text=True, cwd=work)
    (work / f"guidellm-{tag}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"guidellm failed (exit {proc.returncode}):\n" + "\n".join(tail))
    m = json.loads(out.read_text())["benchmarks"][0]["metrics"]

    def ok(name: str) -> dict[str, Any]:
        return m[name]["successful"]

    return {
        "n": m["request_totals"]["successful"], "errors": m["request_totals"]["errored"],
        "ttft_p50": ok("time_to_first_token_ms")["median"],
        "tpot_p50": ok("inter_token_latency_ms")["median"],  # the per-token decode time
        "own_tpot_p50": ok("time_per_output_token_ms")["median"],  # includes TTFT
    }


# ---- rounds and report ---------------------------------------------------------------------

CLIENTS = ("fleetctl before", "fleetctl now", "guidellm", "guidellm ramp")


def measure(args: argparse.Namespace, url: str, endpoint: str, before: Any, guidellm: str,
            work: Path) -> dict[int, dict[str, list[dict[str, Any]]]]:
    found: dict[int, dict[str, list[dict[str, Any]]]] = {
        c: {name: [] for name in CLIENTS} for c in args.levels}
    for r in range(args.rounds):
        for c in args.levels:
            k = r % len(CLIENTS)
            order = CLIENTS[k:] + CLIENTS[:k]  # rotate: nobody always goes first
            for name in order:
                tag = f"{endpoint}-{name.replace(' ', '-')}-c{c}-r{r}"
                if name.startswith("guidellm"):
                    ramp = args.ramp if name == "guidellm ramp" else 0.0
                    row = run_guidellm(guidellm, url, c, args.warmup, args.window,
                                       work / "tokenizer", work, tag, rampup_s=ramp)
                else:
                    now = name == "fleetctl now"
                    row = run_fleetctl(runner_now if now else before, url, c, args.warmup,
                                       args.window, tag, args.ramp if now else None)
                found[c][name].append(row)
                print(f"  {endpoint} round {r + 1} c={c:<3} {name:<16} n={row['n']:<4} "
                      f"TTFT p50 {row['ttft_p50']:7.2f} ms  per-token p50 "
                      f"{row['tpot_p50']:6.3f} ms"
                      + (f"  (stream starts spread over {row['start_spread']:.2f} s)"
                         if row.get("start_spread") else ""), flush=True)
    return found


def report(endpoint_label: str, found: dict[int, dict[str, list[dict[str, Any]]]],
           ramp_s: float) -> None:
    print(f"\n{endpoint_label}")
    print(f"GuideLLM = its default (rampup_duration 0: all streams start together); GuideLLM "
          f"ramp = rampup_duration {ramp_s:g} s, the same ramp as fleetctl now.")
    print("conc  client            TTFT p50 per round (ms)   median  ÷GuideLLM ÷G.ramp   "
          "per-token p50 ms ÷GuideLLM ÷G.ramp")

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(x[key] for x in rows)

    for c, clients in found.items():
        g = {k: med(clients["guidellm"], k) for k in ("ttft_p50", "tpot_p50")}
        gr = {k: med(clients["guidellm ramp"], k) for k in ("ttft_p50", "tpot_p50")}
        for name in CLIENTS:
            rows = clients[name]
            ttft, tpot = med(rows, "ttft_p50"), med(rows, "tpot_p50")
            rounds = " ".join(f"{x['ttft_p50']:6.1f}" for x in rows)
            print(f"{c:>4}  {name:<16}  {rounds:<24} {ttft:7.1f}  {ttft / g['ttft_p50']:8.3f} "
                  f"{ttft / gr['ttft_p50']:7.3f}   {tpot:8.3f}         "
                  f"{tpot / g['tpot_p50']:7.3f} {tpot / gr['tpot_p50']:7.3f}")
        own = med(clients["guidellm"], "own_tpot_p50")
        print(f"{'':>4}  (GuideLLM's own TPOT, which includes TTFT: {own:.3f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="8,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=5.0, help="warm-up seconds per level")
    parser.add_argument("--window", type=float, default=20.0, help="measured seconds per level")
    parser.add_argument("--endpoint", choices=("sim", "mock", "both"), default="sim")
    parser.add_argument("--ramp", type=float, default=None,
                        help="fleetctl now's and GuideLLM ramp's start ramp (default: half the "
                             "warm-up, as a run)")
    parser.add_argument("--before", default=BEFORE, help="commit of the runner to compare")
    parser.add_argument("--guidellm", default=str(REPO / "var/compare-venv/bin/guidellm"))
    parser.add_argument("--keep", help="keep scenario, JSON and log files in this directory")
    args = parser.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]
    if args.ramp is None:
        args.ramp = runner_now.LevelPlan(warmup_s=args.warmup).ramp
    guidellm = Path(args.guidellm)
    if not guidellm.exists():
        raise SystemExit(f"{guidellm} not found: install GuideLLM as this script's docstring says")
    work = (Path(args.keep) if args.keep
            else Path(tempfile.mkdtemp(prefix="bench-vs-guidellm-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    build_tokenizer(str(guidellm.parent / "python"), work / "tokenizer")
    before = runner_before(args.before, work / "before")
    version = subprocess.run([str(guidellm), "--version"], capture_output=True, text=True,
                             env=offline_env()).stdout.strip()
    print(f"bench_vs_guidellm: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"{version}; chat, {PROMPT_TOKENS} prompt / {OUTPUT_TOKENS} output tokens; warm-up "
          f"{args.warmup:g} s, window {args.window:g} s; {args.rounds} rounds, clients "
          f"alternated; fleetctl before = runner of {args.before}, now = this checkout "
          f"(ramp {args.ramp:g} s)", flush=True)
    endpoints = ["sim", "mock"] if args.endpoint == "both" else [args.endpoint]
    results = []
    try:
        for endpoint in endpoints:
            if endpoint == "sim":
                proc, url = start_simulator(PACED_PROFILE, "paced")
                label = (f"endpoint: fleetctl's own simulator (fleetctl sim, paced: decode step "
                         f"{STEP_MS:g} ms for any batch, prefill 20,000 tok/s)")
            else:
                mock_proc, url = start_guidellm_mock(str(guidellm), MOCK_TTFT_MS, MOCK_ITL_MS)
                proc = mock_proc  # type: ignore[assignment]
                label = (f"endpoint: GuideLLM's mock server (not written by this project; "
                         f"TTFT {MOCK_TTFT_MS:g} ms, ITL {MOCK_ITL_MS:g} ms, no batching)")
            try:
                results.append((label, measure(args, url, endpoint, before, str(guidellm),
                                               work)))
            finally:
                stop(proc)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for label, found in results:
        report(label, found, args.ramp)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores shared "
          "with the server and any other work: compare within a round, not across machines)")


if __name__ == "__main__":
    main()
