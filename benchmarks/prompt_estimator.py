"""The gateway's prompt-size estimate (issue 28): its error against the pools' own
`usage.prompt_tokens`, and what it costs a request at the gateway.

One simulator process with two pools of the same model and different tokenizers (`l3`:
"llama3", `ot`: "other", which cuts words into pieces of at most 4 characters), each
calibrated as fleetctl calibrates it: the conformance probe's prompt-token parity sets sent
to the pool (the real Probe), the counts fitted (fleetctl/conformance/calibration.py).

(a) Error. A mix of prompts, each sent through a real Envoy to both pools (model `m-l3` routes
to `l3`, `m-ot` to `ot`), max_tokens 1: the estimate is the `x-fleetctl-prompt-tokens` the
answer echoes (what the pool got), the truth the answer's `usage.prompt_tokens`. The text is
not the calibration's: the licence texts in /usr/share/common-licenses (whitespace runs
collapsed, paragraph breaks kept), cut into short chats (a system prompt and 1-3 turns of
1-4 sentences) and long documents of ~8k-40k tokens (a chat turn, or a completions prompt).
Prints the median and p95 absolute % error, per pool and kind, and the share over- and
under-estimated.

(b) Cost. Two Envoys from this process (`--concurrency 1`, no access log), the same routes;
one runs the script with the estimator, the other the same script rendered with the estimator
switched off (`routing_lua(desired, estimate=False)`: the model header only, so the baseline
cannot drift from the product's script). Requests alternate between them one by one (each
first every other time), so load on the shared machine falls on both alike; each round takes the
client-side p50 and p99 per Envoy; the script prints the medians over rounds and the p99
added. Targets: `short` and `long` (a ~32k-token document) to a model no route serves, so
Envoy answers 404 itself after the script ran (the gateway's own cost, with no pool's
noise), and `pool`, a short chat answered by `l3`.

    .venv/bin/python benchmarks/prompt_estimator.py [--short 300] [--long 60] [--rounds 5]
        [--requests 1000] [--only error|cost]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")

MODELS = {"l3": "m-l3", "ot": "m-ot"}
UNROUTED = "m-none"
HEADER = "x-fleetctl-prompt-tokens"
PROFILES = """
[profiles.roomy]
base = "h200"
decode_base_ms = 0.5
decode_per_seq_ms = 0.0
network_latency_ms = 0.0
replica_noise = 0.0
prefill_tokens_per_s = 10000000.0
max_prefill_tokens_per_step = 131072
kv_cache_tokens = 2000000
max_context = 131072

[profiles.roomy-other]
base = "roomy"
tokenizer = "other"
"""
LICENSES = Path("/usr/share/common-licenses")
SYSTEMS = ("You are a helpful assistant.", "You answer questions about software licences.",
           "Answer briefly and cite the section you rely on.")

def corpus() -> str:
    texts = []
    for path in sorted(LICENSES.iterdir()) if LICENSES.is_dir() else []:
        if path.is_file() and not path.is_symlink():
            texts.append(path.read_text(errors="replace"))
    if not texts:
        raise SystemExit(f"no licence texts in {LICENSES}")
    text = "\n\n".join(texts)
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" ?\n ?", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text)


def sentences(text: str) -> list[str]:
    found = [s.strip().replace("\n", " ") for s in re.split(r"(?<=[.?!])\s+", text)]
    return [s for s in found if 20 <= len(s) <= 400]


def prompts(text: str, short: int, long: int, rng: random.Random
            ) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, path, body without model) for the mix."""
    said = sentences(text)
    out: list[tuple[str, str, dict[str, Any]]] = []
    for _ in range(short):
        messages = [{"role": "system", "content": rng.choice(SYSTEMS)}]
        for turn in range(rng.randint(1, 3)):
            if turn:
                messages.append({"role": "assistant",
                                 "content": " ".join(rng.sample(said, rng.randint(1, 2)))})
            messages.append({"role": "user",
                             "content": " ".join(rng.sample(said, rng.randint(1, 4)))})
        out.append(("short", "/v1/chat/completions", {"messages": messages}))
    for index in range(long):
        tokens = rng.uniform(8_000, 40_000)
        size = int(tokens * 5.2)  # ~chars a llama3-sim token here; the count is the pool's
        start = rng.randrange(len(text))
        doc = (text * (size // len(text) + 2))[start:start + size]
        if index % 4 == 3:
            out.append(("long", "/v1/completions", {"prompt": doc}))
        else:
            out.append(("long", "/v1/chat/completions", {"messages": [
                {"role": "system", "content": rng.choice(SYSTEMS)},
                {"role": "user", "content": "Summarise this document.\n\n" + doc}]}))
    return out


def start_simulator(folder: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    (folder / "profiles.toml").write_text(PROFILES)
    argv = [sys.executable, "-m", "fleetctl.sim", "--profiles", str(folder / "profiles.toml"),
            "--pool", "l3=roomy@0", "--pool", "ot=roomy-other@0", "--log-level", "ERROR"]
    for model in [*MODELS.values(), UNROUTED]:
        argv += ["--model", model]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    urls: dict[str, str] = {}
    while len(urls) < 2:
        line = proc.stdout.readline()
        if "http://" not in line:
            proc.kill()
            raise SystemExit(f"simulator did not start: {line!r}")
        urls[line.split()[2]] = line.split(" on ")[1].split()[0]  # "sim pool NAME (…) on URL"
    return proc, urls


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> http.client.HTTPResponse:
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    return answer


def timed(conn: http.client.HTTPConnection, path: str, body: bytes, status: int) -> float:
    started = time.perf_counter()
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    elapsed = (time.perf_counter() - started) * 1000.0
    if answer.status != status:
        raise SystemExit(f"{path}: status {answer.status}, expected {status}")
    return elapsed


def measure_error(port: int, mix: list[tuple[str, str, dict[str, Any]]]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    errors: dict[tuple[str, str], list[float]] = {}
    for kind, path, body in mix:
        for pool, model in MODELS.items():
            raw = json.dumps({"model": model, "max_tokens": 1, **body}).encode()
            conn.request("POST", path, body=raw, headers={"content-type": "application/json"})
            answer = conn.getresponse()
            data = json.loads(answer.read())
            if answer.status != 200:
                raise SystemExit(f"{pool} {kind}: status {answer.status}: {data}")
            truth = data["usage"]["prompt_tokens"]
            estimate = int(answer.getheader(HEADER) or "-1")
            errors.setdefault((pool, kind), []).append((estimate - truth) / truth * 100.0)
    print(f"(a) estimate vs usage.prompt_tokens, {len(mix)} prompts x {len(MODELS)} pools")
    print(f"{'pool':5} {'kind':6} {'n':>4} {'median |err| %':>15} {'p95 |err| %':>12} "
          f"{'over':>5} {'under':>6} {'mean err %':>11}")
    rows = [*sorted(errors.items()), (("all", "all"), [e for v in errors.values() for e in v])]
    for (pool, kind), values in rows:
        absolute = [abs(v) for v in values]
        print(f"{pool:5} {kind:6} {len(values):4d} {statistics.median(absolute):15.2f} "
              f"{percentile(absolute, 0.95):12.2f} {sum(v > 0 for v in values):5d} "
              f"{sum(v < 0 for v in values):6d} {statistics.mean(values):+11.2f}")


def measure_cost(envoys: dict[str, Any], targets: dict[str, tuple[str, bytes, int, int]],
                 rounds: int) -> None:
    conns = {name: http.client.HTTPConnection("127.0.0.1", envoy.listen_port, timeout=60)
             for name, envoy in envoys.items()}
    print(f"(b) latency through Envoy (--concurrency 1), alternating one by one; medians of "
          f"{rounds} rounds")
    print(f"{'target':6} {'envoy':10} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8}  "
          f"p99 of each round")
    for target, (path, body, status, requests) in targets.items():
        for name in conns:  # warm up
            for _ in range(100):
                timed(conns[name], path, body, status)
        per_round: dict[str, list[tuple[float, float]]] = {name: [] for name in conns}
        for _ in range(rounds):
            samples: dict[str, list[float]] = {name: [] for name in conns}
            for index in range(requests):
                # Each Envoy goes first every other time: neither gets the other's wake-ups.
                order = list(conns) if index % 2 == 0 else list(reversed(conns))
                for name in order:
                    samples[name].append(timed(conns[name], path, body, status))
            for name, values in samples.items():
                per_round[name].append((percentile(values, 0.50), percentile(values, 0.99)))
        medians = {}
        for name, pairs in per_round.items():
            medians[name] = (statistics.median(p for p, _ in pairs),
                             statistics.median(p for _, p in pairs))
            spread = " ".join(f"{p99:.3f}" for _, p99 in pairs)
            print(f"{target:6} {name:10} {requests:8d} {medians[name][0]:8.3f} "
                  f"{medians[name][1]:8.3f}  {spread}")
        added = [w[1] - b[1] for w, b in zip(per_round["estimator"], per_round["baseline"],
                                             strict=True)]
        on, off = medians["estimator"], medians["baseline"]
        print(f"{target:6} {'added':10} {'':8} {on[0] - off[0]:+8.3f} {on[1] - off[1]:+8.3f}"
              f"  p99 added per round: {' '.join(f'{a:+.3f}' for a in added)}; "
              f"median {statistics.median(added):+.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--short", type=int, default=300, help="short chats in the mix")
    parser.add_argument("--long", type=int, default=60, help="long documents in the mix")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1000, help="short, per Envoy, a round")
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--only", choices=("error", "cost"), help="run one half")
    args = parser.parse_args()

    import django

    django.setup()
    from dataclasses import replace
    from functools import partial

    from fleetctl.conformance.calibration import fit
    from fleetctl.conformance.cases.probe import PARITY_MESSAGES, Probe
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.traffic.gateways.base import DesiredState, PoolTarget, RouteSpec
    from fleetctl.traffic.gateways.envoy import routes as envoy_routes
    from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter

    rng = random.Random(args.seed)
    text = corpus()
    folder = Path(tempfile.mkdtemp(prefix="bench-prompt-estimator-"))
    sim, urls = start_simulator(folder)
    envoys = {"estimator": EnvoyProcess(folder / "est", free_port(), free_port(),
                                        access_log=False),
              "baseline": EnvoyProcess(folder / "base", free_port(), free_port(),
                                       access_log=False)}
    try:
        pools = {}
        for name, url in urls.items():
            probe = Probe(pool_name=name, base_url=url, model=MODELS[name],
                          expected_models=[MODELS[name]], registry_max_context=None)
            counts = [probe.prompt_tokens(i)[0] for i in range(len(PARITY_MESSAGES))]
            probe.close()
            cal = fit(counts)
            if cal is None:
                raise SystemExit(f"{name}: no calibration from {counts}")
            print(f"calibration {name}: parity counts {counts} -> {cal}")
            pools[name] = replace(PoolTarget(name, (url,), "US"), prompt=cal)
        desired = DesiredState(routes=tuple(
            RouteSpec(key=f"r-{name}", model=model, latency_class="", residency="",
                      revision=1, weights={name: 10_000}) for name, model in MODELS.items()),
            pools=pools)
        for name, envoy in envoys.items():
            envoy.start(timeout_s=60)
            original = envoy_routes.routing_lua
            if name == "baseline":
                envoy_routes.routing_lua = partial(original, estimate=False)  # type: ignore
            try:
                EnvoyAdapter(envoy.gateway("bench", load_timeout_s=30)).apply(desired)
            finally:
                envoy_routes.routing_lua = original  # type: ignore[assignment]

        mix = prompts(text, args.short, args.long, rng)
        if args.only != "cost":
            measure_error(envoys["estimator"].listen_port, mix)
        if args.only == "error":
            return

        short = json.dumps({"model": UNROUTED, "max_tokens": 1, **mix[0][2]}).encode()
        doc = (text * 2)[:32_000 * 5]
        long = json.dumps({"model": UNROUTED, "max_tokens": 1, "messages": [
            {"role": "user", "content": doc}]}).encode()
        pool = json.dumps({"model": MODELS["l3"], "max_tokens": 1, **mix[0][2]}).encode()
        targets = {"short": ("/v1/chat/completions", short, 404, args.requests),
                   "long": ("/v1/chat/completions", long, 404, args.requests),
                   "pool": ("/v1/chat/completions", pool, 200, args.requests)}
        print(f"short body {len(short)} bytes, long body {len(long)} bytes")
        measure_cost(envoys, targets, args.rounds)
    finally:
        for envoy in envoys.values():
            envoy.stop()
        sim.terminate()
        sim.wait(timeout=10)


if __name__ == "__main__":
    main()
