"""`fleetctl sim` — serve simulated pools, or change a running pool's faults.

Mounted by the main CLI through `add_arguments(parser)` and `run(args)`; also runnable as
`python -m fleetctl.sim`.

    fleetctl sim --pool h200@8101 --pool mi300x@8102 [--model NAME ...] [--profiles F.toml]
    fleetctl sim --pool cand=a100:tool_calls=false,tokenizer=other@8102
    fleetctl sim --pool cand=mi300x:task_accuracy=0.87@8102   # a candidate 5 points worse
    fleetctl sim fault --url http://127.0.0.1:8101 --error-rate 0.2 --added-latency-ms 50
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .groundtruth import DEFAULT_REQUEST_CAPACITY
from .profiles import Profile, ProfileError, load_profiles, with_overrides

_POOL_RE = re.compile(
    r"^(?:(?P<name>[A-Za-z0-9_.-]+)=)?(?P<profile>[A-Za-z0-9_.-]+)"
    r"(?::(?P<overrides>[^@]*))?@(?P<port>\d+)$"
)
_OVERRIDE_RE = re.compile(r"^(?P<key>[a-z_]+)=(?P<value>[A-Za-z0-9_.+-]+)$")
_FAULT_FIELDS = ("error_rate", "added_latency_ms", "slowdown", "down", "server_version",
                 "model_revision")


@dataclass(frozen=True)
class PoolArg:
    name: str
    profile: str
    port: int
    overrides: tuple[tuple[str, str], ...] = ()


def pool_arg(text: str) -> PoolArg:
    match = _POOL_RE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not [NAME=]PROFILE[:KEY=VALUE,...]@PORT (e.g. h200@8101 or "
            "cand=a100:tool_calls=false@8102)"
        )
    port = int(match["port"])
    if port > 65535:
        raise argparse.ArgumentTypeError(f"port {port} in {text!r} is out of range 0..65535")
    overrides: list[tuple[str, str]] = []
    if match["overrides"] is not None:
        for item in match["overrides"].split(","):
            pair = _OVERRIDE_RE.match(item)
            if pair is None:
                raise argparse.ArgumentTypeError(
                    f"{item!r} in {text!r} is not KEY=VALUE (e.g. tool_calls=false)"
                )
            overrides.append((pair["key"], pair["value"]))
    return PoolArg(name=match["name"] or match["profile"], profile=match["profile"], port=port,
                   overrides=tuple(overrides))


def _number(low: float, high: float | None, what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _url(text: str) -> str:
    if not re.match(r"^https?://[^/\s]+", text):
        raise argparse.ArgumentTypeError(f"expected http://HOST:PORT, got {text!r}")
    return text.rstrip("/")


def _version(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}", text):
        raise argparse.ArgumentTypeError(f"expected a version such as 0.9.0 (letters, digits "
                                         f"and . _ + -, at most 64), got {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(sim_error=parser.error, sim_command=None)
    parser.add_argument("--pool", action="append", type=pool_arg, default=[],
                        metavar="[NAME=]PROFILE[:KEY=VALUE,...]@PORT",
                        help="serve a pool (repeatable); port 0 picks a free port; KEY=VALUE "
                        "overrides profile fields for this pool, e.g. tool_calls=false")
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="serve this model on every pool (repeatable; default: the "
                        "profile's models)")
    parser.add_argument("--profiles", type=Path, metavar="FILE.toml",
                        help="TOML file adding or overriding accelerator profiles")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--record-ground-truth", action="store_true",
                        help="record per-request ground truth from the start")
    parser.add_argument("--ground-truth-size", type=_positive_int,
                        default=DEFAULT_REQUEST_CAPACITY, metavar="N",
                        help="ground-truth ring buffer size in requests")
    parser.add_argument("--random-seed", type=int, metavar="N",
                        help="seed the pools' random draws (replica noise, injected errors) "
                        "so a run repeats; give each process its own (default: unseeded)")
    parser.add_argument("--list-profiles", action="store_true",
                        help="print the available profiles and exit")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="sim_command", metavar="{fault}")
    _add_fault_arguments(sub.add_parser(
        "fault", help="change faults of a running pool",
        description="Set faults on a running simulated pool (prints the resulting faults).",
    ))


def _add_fault_arguments(fault: argparse.ArgumentParser) -> None:
    fault.set_defaults(sim_error=fault.error)
    fault.add_argument("--url", required=True, type=_url, help="pool URL, http://HOST:PORT")
    fault.add_argument("--error-rate", type=_number(0.0, 1.0, "between 0 and 1"),
                       help="fraction of requests answered with HTTP 500")
    fault.add_argument("--added-latency-ms", type=_number(0.0, 600_000.0, "between 0 and "
                       "600000"), help="extra delay before each request is queued")
    fault.add_argument("--slowdown", type=_number(1.0, 1000.0, "between 1 and 1000"),
                       help="multiplier on decode step time (>= 1)")
    updown = fault.add_mutually_exclusive_group()
    updown.add_argument("--down", dest="down", action="store_const", const=True,
                        help="hard down: 503 everywhere, in-flight requests aborted")
    updown.add_argument("--up", dest="down", action="store_const", const=False,
                        help="back up")
    fault.add_argument("--server-version", type=_version, metavar="VERSION",
                       help="the version GET /version reports from now on (an upgrade "
                            "nobody registered), e.g. 0.9.0")
    fault.add_argument("--model-revision", type=_version, metavar="REVISION",
                       help="the weights revision GET /v1/models reports for each model from "
                            "now on (weights swapped nobody registered), e.g. 3f1c2ab")
    fault.add_argument("--reset", action="store_true",
                       help="clear all faults first (other flags then apply on top)")
    fault.add_argument("--timeout", type=_number(0.1, 600.0, "between 0.1 and 600"),
                       default=5.0, help="HTTP timeout in seconds")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "sim_command", None) == "fault":
        return run_fault(args)
    return run_serve(args)


def _fail(args: argparse.Namespace, message: str) -> int:
    """argparse-style error (exit 2) when we have the parser, else a plain message."""
    error = getattr(args, "sim_error", None)
    if callable(error):
        error(message)
    print(f"fleetctl sim: error: {message}", file=sys.stderr)
    return 2


def run_serve(args: argparse.Namespace) -> int:
    from .server import PoolSpec  # aiohttp only when serving
    from .serving import serve

    _configure_logging(args.log_level)
    try:
        profiles = load_profiles(args.profiles)
    except ProfileError as exc:
        return _fail(args, str(exc))
    if args.list_profiles:
        print(_profile_table(profiles))
        return 0
    if not args.pool:
        return _fail(args, "at least one --pool is required, e.g. --pool h200@8101")
    problem = _pool_problem(args.pool, profiles)
    if problem:
        return _fail(args, problem)
    models = tuple(args.model)
    try:
        specs = [
            PoolSpec(p.name, with_overrides(profiles[p.profile], list(p.overrides),
                                            f"--pool {p.name}"), p.port, models)
            for p in args.pool
        ]
    except ProfileError as exc:
        return _fail(args, str(exc))
    try:
        serve(specs, args.host, record_ground_truth=args.record_ground_truth,
              ground_truth_size=args.ground_truth_size, random_seed=args.random_seed)
    except OSError as exc:
        print(f"fleetctl sim: cannot listen on {args.host}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0


def _pool_problem(pools: list[PoolArg], profiles: dict[str, Profile]) -> str | None:
    names, ports = set(), set()
    for pool in pools:
        if pool.profile not in profiles:
            known = ", ".join(sorted(profiles))
            return f"--pool {pool.name}: unknown profile {pool.profile!r} (known: {known})"
        if pool.name in names:
            return f"--pool: pool name {pool.name!r} used twice (use NAME=PROFILE@PORT)"
        if pool.port and pool.port in ports:
            return f"--pool: port {pool.port} used twice"
        names.add(pool.name)
        ports.add(pool.port)
    return None


def _profile_table(profiles: dict[str, Profile]) -> str:
    lines = [f"{'profile':<12} {'runtime':<7} {'prefill tok/s':>13} {'step ms':>16} "
             f"{'max seqs':>8} {'KV tokens':>10} {'$/h':>6} {'diverge':>7} {'noise':>6} "
             f"{'tasks':>6}  description"]
    for p in profiles.values():
        step = f"{p.decode_base_ms:g}+{p.decode_per_seq_ms:g}*b"
        lines.append(f"{p.name:<12} {p.vendor:<7} {p.prefill_tokens_per_s:>13.0f} {step:>16} "
                     f"{p.max_seqs:>8} {p.kv_cache_tokens:>10} {p.node_hourly_usd:>6.2f} "
                     f"{p.divergence_rate:>7.1%} {p.replica_noise:>6.1%} {p.task_accuracy:>6.1%}  "
                     f"{p.description}")
    return "\n".join(lines)


def _configure_logging(level: str) -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=level, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("fleetctl.sim").setLevel(level)


def run_fault(args: argparse.Namespace) -> int:
    import httpx

    payload = {k: getattr(args, k) for k in _FAULT_FIELDS if getattr(args, k) is not None}
    try:
        with httpx.Client(timeout=args.timeout, follow_redirects=False) as client:
            response = None
            if args.reset:
                response = _checked(client.post(f"{args.url}/admin/reset"))
            if payload or response is None:
                response = _checked(client.post(f"{args.url}/admin/faults", json=payload))
    except httpx.HTTPError as exc:
        print(f"fleetctl sim fault: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    except _FaultRefused as exc:
        print(f"fleetctl sim fault: {args.url} refused: {exc}", file=sys.stderr)
        return 1
    body = response.json()
    print(f"pool {body.get('pool')}: {json.dumps(body.get('faults'), sort_keys=True)}")
    return 0


class _FaultRefused(Exception):
    pass


def _checked(response: Any) -> Any:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise _FaultRefused(f"HTTP {response.status_code}: {message}")
    return response


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fleetctl sim",
        description="Serve simulated OpenAI-compatible accelerator pools.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
