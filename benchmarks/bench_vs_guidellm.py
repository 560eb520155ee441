"""The same endpoint measured by fleetctl's runner and by GuideLLM, side by side.

One OpenAI-compatible endpoint — `fleetctl sim` with the paced profile of `bench_accuracy.py`
(decode step 20 ms, prefill 20,000 tok/s, network 0), in its own process — is measured at a
few fixed concurrencies by (a) `fleetctl.bench.runner.run_level` (in this process) and (b)
`guidellm run` (GuideLLM 0.8.x, a subprocess), one after the other per level (interleaved:
fleetctl@1, guidellm@1, fleetctl@8, ...), with the same request shape: chat completions,
~256 prompt tokens, 128 output tokens (`max_tokens` + `ignore_eos`), streamed, closed loop.
Both get the same warm-up (1 s, requests *started* in it are left out) and the same
measured window (`--window` seconds). Printed: TTFT median/p95, TPOT median, ITL median,
output tokens/s and sample counts per tool, then the reasons the two differ.

GuideLLM 0.8.1's CLI is `guidellm run` with `kind=...` options; this script writes a scenario
file (`-c`) instead: backend openai_http, profile concurrent (streams=[N], warm-up 1 s),
data synthetic_text (prompt_tokens=256, output_tokens=128), constraint max_duration, output
json. Its synthetic data needs a tokenizer; so that nothing is downloaded from a hub, the
script builds a local word-level one (`tokenizers` WordLevel, lower-cased, split like the
simulator's `\\w+|[^\\w\\s]`, vocabulary = the simulator's and fleetctl's words + Faker's
lorem words, which is what GuideLLM's synthetic prompts are made of) in a temp dir and runs
GuideLLM with HF_HUB_OFFLINE=1. One word = one token in it and in the simulator.

GuideLLM install (measurement only, separate venv; the recipe of `bench_accuracy.py` plus two
packages that `guidellm run` imports but that recipe lacks, jinja2 and torch (CPU build)):

    python3.11 -m venv var/compare-venv
    var/compare-venv/bin/pip install --no-deps guidellm==0.8.1
    var/compare-venv/bin/pip install click~=8.4.0 culsans~=0.10.0 eval_type_backport faker \\
        ftfy 'httpx[http2]<1' loguru msgpack 'numpy>=2' protobuf 'pydantic>=2.11.7' \\
        pydantic-settings pyyaml rich sanic tabulate transformers uvloop \\
        'more-itertools>=10.8' 'typing-extensions>=4.15' 'websockets>=13' datasets jinja2
    var/compare-venv/bin/pip install torch==2.13.0   # a CPU build (this machine has one on disk)

Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/bench_vs_guidellm.py [--levels 1,8,32] [--window 10] \\
        [--guidellm var/compare-venv/bin/guidellm] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
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

from bench_accuracy import MODEL, PACED_PROFILE, STEP_MS, Row, start_simulator, stop  # noqa: E402

from fleetctl.bench.runner import WORDS, Endpoint, LevelPlan, run_level  # noqa: E402
from fleetctl.bench.stats import summarize  # noqa: E402
from fleetctl.sim.textgen import _WORDS as SIM_WORDS  # noqa: E402

PROMPT_TOKENS = 256
OUTPUT_TOKENS = 128
WARMUP_S = 1.0

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


# ---- fleetctl ---------------------------------------------------------------------------------


def run_fleetctl(url: str, concurrency: int, window_s: float) -> dict[str, Any]:
    plan = LevelPlan(warmup_s=WARMUP_S, window_s=window_s, min_samples=1,
                     max_duration_s=window_s + 60, request_timeout_s=60.0)
    level = asyncio.run(run_level(Endpoint(url, MODEL), [Row(PROMPT_TOKENS, OUTPUT_TOKENS)],
                                  plan, concurrency=concurrency,
                                  request_id_prefix=f"vs-fleetctl-{concurrency}"))
    s = summarize(level.samples())
    ok = [r for r in level.results if r.status == "ok" and not r.warmup]
    return {
        "n": s.n_ok, "errors": s.n_errors + s.n_timeouts,
        "ttft_p50": s.ttft_p50_s * 1e3, "ttft_p95": s.ttft_p95_s * 1e3,
        "tpot_p50": s.tpot_p50_s * 1e3, "itl_p50": s.itl_p50_s * 1e3,
        # GuideLLM's per-request ITL for comparison: first → last content chunk over N − 1
        "itl_req_p50": statistics.median(
            (r.chunk_times[-1] - r.chunk_times[0]) / (r.output_tokens - 1) * 1e3 for r in ok),
        "tok_s": s.output_tokens_per_s,
        "in_tok": statistics.median(r.input_tokens or 0 for r in ok),
        "out_tok": statistics.median(r.output_tokens for r in ok),
    }


# ---- GuideLLM ---------------------------------------------------------------------------------


def run_guidellm(guidellm: str, url: str, concurrency: int, window_s: float, tokenizer: Path,
                 work: Path) -> dict[str, Any]:
    out = work / f"guidellm-c{concurrency}.json"
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": MODEL,
                    "request_format": "/v1/chat/completions"},
        "profile": {"kind": "concurrent", "streams": [concurrency],
                    "warmup": {"value": WARMUP_S, "mode": "duration"}},
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
        "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS,
                  "output_tokens": OUTPUT_TOKENS}],
        "constraints": [{"kind": "max_duration", "seconds": WARMUP_S + window_s}],
        "outputs": [{"kind": "json", "path": str(out)}],
    }}
    path = work / f"scenario-c{concurrency}.json"
    path.write_text(json.dumps(scenario, indent=1))
    t0 = time.monotonic()
    proc = subprocess.run([guidellm, "run", "-c", str(path), "--disable-progress"],
                          env=offline_env(), capture_output=True, text=True, cwd=work)
    wall = time.monotonic() - t0
    (work / f"guidellm-c{concurrency}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"guidellm failed (exit {proc.returncode}):\n" + "\n".join(tail))
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]

    def ok(name: str) -> dict[str, Any]:
        return m[name]["successful"]

    return {
        "n": m["request_totals"]["successful"],
        "errors": m["request_totals"]["errored"],
        "incomplete": m["request_totals"]["incomplete"],
        "ttft_p50": ok("time_to_first_token_ms")["median"],
        "ttft_p95": ok("time_to_first_token_ms")["percentiles"]["p95"],
        "tpot_p50": ok("time_per_output_token_ms")["median"],
        "itl_p50": ok("inter_token_latency_ms")["median"],
        "tok_s": m["output_tokens_per_second"]["total"]["mean"],
        "in_tok": ok("prompt_token_count")["median"],
        "out_tok": ok("output_token_count")["median"],
        "window_s": bench["duration"], "wall_s": wall,
    }


# ---- report -------------------------------------------------------------------------------------


def print_table(rows: list[tuple[int, dict[str, Any], dict[str, Any]]]) -> None:
    print("\nconc  tool       n  TTFT p50  TTFT p95  TPOT p50  ITL p50   out tok/s  "
          "in/out tok   (ms; ITL = per-request (last−first chunk)/(N−1) for both)")
    for c, f, g in rows:
        print(f"{c:>4}  fleetctl {f['n']:>3}  {f['ttft_p50']:8.2f}  {f['ttft_p95']:8.2f}  "
              f"{f['tpot_p50']:8.3f}  {f['itl_req_p50']:7.3f}  {f['tok_s']:9.1f}  "
              f"{f['in_tok']:.0f}/{f['out_tok']:.0f}")
        print(f"{'':>4}  guidellm {g['n']:>3}  {g['ttft_p50']:8.2f}  {g['ttft_p95']:8.2f}  "
              f"{g['tpot_p50']:8.3f}  {g['itl_p50']:7.3f}  {g['tok_s']:9.1f}  "
              f"{g['in_tok']:.0f}/{g['out_tok']:.0f}   (+{g['incomplete']} cancelled at "
              f"the end, {g['errors']} errors)")
        print(f"{'':>4}  Δ guidellm−fleetctl: TTFT p50 {g['ttft_p50'] - f['ttft_p50']:+.2f} ms, "
              f"ITL {g['itl_p50'] - f['itl_req_p50']:+.3f} ms, tok/s "
              f"{(g['tok_s'] / f['tok_s'] - 1) * 100:+.1f} %; fleetctl TPOT − ITL "
              f"{f['tpot_p50'] - f['itl_req_p50']:+.3f} ms")


EXPLANATION = f"""
Why the columns differ (definitions first):
- TTFT. Both: request sent → first streamed token. fleetctl starts the clock just before
  aiohttp writes the request and stops it at the first *content-bearing* SSE chunk; GuideLLM
  (httpx, HTTP/1.1 here) stamps request_start in its backend and first_token_iteration at the
  first streamed iteration that carries output. Differences of a few ms are client overhead:
  GuideLLM's request path (pydantic request objects, httpx, worker processes that hand each
  request over through queues) versus one aiohttp event loop; the simulator's own TTFT
  (prefill ≈ {PROMPT_TOKENS / 20:.0f} ms + waiting for the next {STEP_MS:g} ms decode step)
  is the same for both. At 8 and 32 streams TTFT is dominated by something else:
  how many prompts reach
  the server in the same decode step (each costs ~13 ms of prefill before anyone's first
  token, so 32 at once ≈ 430 ms). fleetctl's closed loop starts all N streams together and,
  with equal request lengths, they stay in lock step; GuideLLM's streams start from several
  worker processes at slightly different times and drift apart, so fewer prompts coincide
  (lower median at 8) or its batches form differently (higher median at 32). That is the load
  pattern differing, not the clock: p95, which both see at the fully coincident batches, is
  close. The TTFT at high concurrency is a property of the stream phasing, so compare those
  medians as "same order", not to the ms.
- TPOT. Not the same metric under the same name. fleetctl: (E2E − TTFT)/(N − 1), where E2E
  ends at `data: [DONE]`, i.e. the per-token decode time. GuideLLM's "TPOT" is
  (last token − request start)/N: it *includes TTFT* spread over the tokens, so it is higher
  than fleetctl's by about (TTFT − TPOT)/N. GuideLLM's ITL, (last − first token)/(N − 1), is
  the counterpart of fleetctl's TPOT; fleetctl's ITL column here is computed the same way
  from its chunk times. fleetctl's TPOT can exceed that ITL by a hair: its E2E runs to
  [DONE], one more chunk after the last token (usage chunk, then [DONE]).
- Token counting. Both read the server's usage (GuideLLM asks for continuous_usage_stats as
  well; the simulator ignores it), so output tokens agree (128). Prompts differ slightly:
  fleetctl sends 256 one-token words (+11 chat-template tokens = 267); GuideLLM builds its
  prompt from Faker text cut to 256 tokens of the given tokenizer and decodes it back, and
  that round trip (punctuation joined, lower-cased) comes back a few simulator tokens short.
  The prefill difference this causes is well under 1 ms at 20,000 tok/s.
- Warm-up and window. Both leave out requests that started in the first {WARMUP_S:g} s. At the
  end fleetctl stops sending and drains the requests in flight (they count); GuideLLM's
  max_duration cancels them ("incomplete", not counted). With a fixed request shape that
  removes no bias from latency but changes n.
- Throughput. fleetctl: output tokens whose chunk arrived inside the window / window length.
  GuideLLM: the mean of its output-tokens-per-second time series over the whole benchmark,
  all requests, warm-up excluded but the ramp and the cancelled tail's partial tokens in it;
  with N streams of 128 tokens each request is ~{OUTPUT_TOKENS * STEP_MS / 1000:.1f} s long,
  so in a short window both depend on where the request boundaries fall — a few % either way.
- Client overhead. fleetctl runs in one process and reports its CPU share; GuideLLM spreads
  requests over worker processes (one per core by default) and warns itself when its data
  generation is a measurable share of TTFT. Both share this machine's cores with the server.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--window", type=float, default=10.0, help="measured seconds per level")
    parser.add_argument("--guidellm", default=str(REPO / "var/compare-venv/bin/guidellm"))
    parser.add_argument("--keep", help="keep scenario, JSON and log files in this directory")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    guidellm = Path(args.guidellm)
    if not guidellm.exists():
        raise SystemExit(f"{guidellm} not found: install GuideLLM as this script's docstring says")
    work = (Path(args.keep) if args.keep
            else Path(tempfile.mkdtemp(prefix="bench-vs-guidellm-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    build_tokenizer(str(guidellm.parent / "python"), work / "tokenizer")
    version = subprocess.run([str(guidellm), "--version"], capture_output=True, text=True,
                             env=offline_env()).stdout.strip()
    print(f"bench_vs_guidellm: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"{version}; endpoint fleetctl sim profile paced (step {STEP_MS:g} ms, prefill "
          f"20,000 tok/s); chat, {PROMPT_TOKENS} prompt / {OUTPUT_TOKENS} output tokens; "
          f"warm-up {WARMUP_S:g} s, window {args.window:g} s; interleaved per level")
    proc, url = start_simulator(PACED_PROFILE, "paced")
    rows = []
    try:
        for c in levels:
            f = run_fleetctl(url, c, args.window)
            g = run_guidellm(str(guidellm), url, c, args.window, work / "tokenizer", work)
            print(f"  level {c}: fleetctl n={f['n']}, guidellm n={g['n']} "
                  f"(guidellm process {g['wall_s']:.1f} s incl. start-up)", flush=True)
            rows.append((c, f, g))
    finally:
        stop(proc)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    print(EXPLANATION)


if __name__ == "__main__":
    main()
