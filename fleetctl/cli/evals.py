"""`fleetctl eval suites | upload | run | show | cancel`: score a pinned suite on a candidate
pool and its primary, item by item, and read the verdict against the quality margin with the
items that changed. It talks to the REST API only; the run happens on the server's workers."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from fleetctl.cli.bench import _number, _positive_int
from fleetctl.cli.client import ApiClient, CliError
from fleetctl.cli.conformance import _run_id
from fleetctl.cli.output import number_in, print_fields, print_json, print_table

SUITES = "/api/v1/eval-suites/"
RUNS = "/api/v1/eval-runs/"
ACTIVE = ("queued", "running")
# Exit status of `run --wait`: a fail verdict is 3 (as conformance), a run that did not
# finish (cancelled, failed) is 1.
EXIT = {"pass": 0, "warn": 0, "insufficient": 0, "fail": 3}
BAR_WIDTH = 20
TEXT_WIDTH = 40


class _Client(ApiClient):
    """The API client; a refused upload's every line message is kept for the report."""

    def _decode(self, response: httpx.Response) -> Any:
        if response.status_code == 400:
            try:
                body = response.json()
            except ValueError:
                body = None
            fields = (body or {}).get("error", {}).get("fields") if isinstance(body,
                                                                                 dict) else None
            if fields:
                raise _Refused(fields)
        return super()._decode(response)


class _Refused(CliError):
    """A 400 with its fields, one message a line (an upload's bad lines, by number)."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        lines = [message if name in ("file", "non_field_errors") else f"{name}: {message}"
                 for name, messages in fields.items() for message in messages]
        super().__init__("HTTP 400: " + "\n  ".join(["the request was refused:", *lines]))
        self.fields = fields


def _client(args: argparse.Namespace) -> _Client:
    client = _Client.from_env(args.url, args.token)
    assert isinstance(client, _Client)
    return client


# --- suites ----------------------------------------------------------------------------------

def cmd_suites(args: argparse.Namespace) -> int:
    params = {} if args.all else {"retired": "false"}
    suites = _client(args).get_all(SUITES, params)
    if args.json:
        print_json(suites)
        return 0
    print_table(["id", "name", "version", "items", "source", "sha256", "retired", "created"],
                [[x["id"], x["name"], x["version"], x["item_count"], x["source"],
                  x["sha256"][:12], "yes" if x["retired"] else "no", x["created_at"][:16]]
                 for x in suites])
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"{args.file}: no such file", 2)
    client = _client(args)
    try:
        with path.open("rb") as fp:
            # httpx streams the file object in chunks; the server reads it line by line.
            suite = client._send("POST", SUITES,
                                 data={"name": args.name, "description": args.description},
                                 files={"file": (path.name, fp, "application/x-ndjson")})
    except _Refused as exc:
        # Nothing was stored; every bad line by number, then exit 2 (fix the file).
        raise CliError(f"{path.name} was not stored:\n  " + "\n  ".join(
            message if name in ("file", "non_field_errors") else f"{name}: {message}"
            for name, messages in exc.fields.items() for message in messages), 2) from exc
    if args.json:
        print_json(suite)
        return 0
    print(f"suite {suite['name']} v{suite['version']}: {suite['item_count']:,} items, "
          f"sha256 {suite['sha256']}")
    if not suite["created"]:
        print("(identical content was already stored as this version; nothing new)",
              file=sys.stderr)
    return 0


# --- runs ------------------------------------------------------------------------------------

def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _points(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f}"


def progress_line(run: dict[str, Any]) -> str:
    """`eval run 12: running [#####---------------] 300/1200 (25.0%)`."""
    progress = run["progress"]
    done, total = progress["done"], progress["total"]
    filled = round(BAR_WIDTH * min(done, total) / total) if total else 0
    return (f"eval run {run['id']}: {run['status']} [{'#' * filled}{'-' * (BAR_WIDTH - filled)}]"
            f" {done}/{total} ({progress['percent']:.1f}%)")


def follow(client: ApiClient, run: dict[str, Any], quiet: bool, every_s: float = 1.0,
           sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Poll the run until it ends, one progress line each time it moved (rewritten in place
    on a terminal)."""
    tty = sys.stderr.isatty()
    last = ""
    for run in client.polled(run, f"{RUNS}{run['id']}/", lambda run: run["status"] in ACTIVE,
                             every_s, sleep):
        line = progress_line(run)
        if not quiet and line != last:
            print(line.ljust(78), end="\r" if tty else "\n", file=sys.stderr, flush=True)
            last = line
    if not quiet and tty:
        print(file=sys.stderr)
    return run


def _summary_fields(run: dict[str, Any]) -> list[tuple[str, Any]]:
    suite = run["suite"]
    progress = run["progress"]
    return [
        ("run", run["id"]), ("plan", run["plan"]),
        ("suite", f"{suite['name']} v{suite['version']} (sha256 {suite['sha256'][:12]})"),
        ("candidate", run["candidate"]), ("primary", run["primary"]), ("model", run["model"]),
        ("status", run["status"] + (f" ({run['error']})" if run["error"] else "")),
        ("progress", f"{progress['done']}/{progress['total']} ({progress['percent']:.1f}%)"),
        ("verdict", run["verdict"] or "not judged yet"), ("summary", run["summary"]),
        ("gate", f"margin {run['margin_pct']:g} pts, min {run['min_items']} items, "
                 f"confidence {run['confidence']}"),
        ("evidence", ", ".join(u for u in (run.get("evidence_url"),
                                           run.get("live_evidence_url")) if u)),
    ]


def print_stats(run: dict[str, Any]) -> None:
    """Per pool its score and interval, then candidate − primary paired, then per tag."""
    stats = run.get("stats") or {}
    scores = stats.get("pools") or {}
    print_table(["pool", "role", "n", "score", "interval", "method"],
                [[p["name"], p["role"], (scores.get(p["name"]) or {}).get("n", 0),
                  _pct((scores.get(p["name"]) or {}).get("score")),
                  f"[{_pct((scores.get(p['name']) or {}).get('lower'))}, "
                  f"{_pct((scores.get(p['name']) or {}).get('upper'))}]",
                  (scores.get(p["name"]) or {}).get("method") or "—"] for p in run["pools"]])
    pair = stats.get("paired")
    if pair:
        print()
        print(f"candidate − primary over {pair.get('n', 0)} items: "
              f"{_points(pair.get('estimate'))} pts "
              f"[{_points(pair.get('lower'))}, {_points(pair.get('upper'))}] "
              f"(margin −{run['margin_pct']:g}; {pair.get('method') or '—'}"
              + (f", p = {pair['p_value']:.3g}" if pair.get("p_value") is not None else "")
              + f"): {pair.get('verdict') or '—'}")
    tags = stats.get("tags") or {}
    if tags and run["primary"]:
        print()
        rows = []
        for tag, numbers in sorted(tags.items()):
            per_pool = numbers.get("pools") or {}
            tag_pair = numbers.get("paired") or {}
            rows.append([tag, numbers.get("n", 0),
                         _pct((per_pool.get(run["candidate"]) or {}).get("score")),
                         _pct((per_pool.get(run["primary"]) or {}).get("score")),
                         _points(tag_pair.get("estimate")),
                         f"[{_points(tag_pair.get('lower'))}, {_points(tag_pair.get('upper'))}]",
                         tag_pair.get("verdict") or "—"])
        print_table(["tag", "n", "candidate", "primary", "diff pts", "interval", "verdict"],
                    rows)


def _short(text: str, width: int = TEXT_WIDTH) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def print_diff(rows: list[dict[str, Any]], total: int) -> None:
    print(f"items scored differently: {total}" + (f" (first {len(rows)})" if total > len(rows)
                                                  else ""))
    if not rows:
        return
    print_table(["item", "direction", "tags", "candidate", "primary", "candidate answer",
                 "primary answer"],
                [[r["item"], r["direction"], ",".join(r["tags"][:3]),
                  f"{r['candidate']['score']:g}", f"{r['primary']['score']:g}",
                  _short(r["candidate"]["text"] or r["candidate"]["error"]),
                  _short(r["primary"]["text"] or r["primary"]["error"])] for r in rows])


def _report(client: ApiClient, run: dict[str, Any], args: argparse.Namespace) -> None:
    with_diff = getattr(args, "diff", False) and run["primary"]
    diff: dict[str, Any] = {}
    if with_diff:
        diff = client.get(f"{RUNS}{run['id']}/diff/",
                          {"direction": getattr(args, "direction", None),
                           "tag": getattr(args, "tag", None), "page_size": args.limit})
    if args.json:
        print_json({"run": run, "diff": diff["results"]} if with_diff else run)
        return
    print_fields(_summary_fields(run))
    print()
    print_stats(run)
    if with_diff:
        print()
        print_diff(diff["results"], diff["count"])
    elif getattr(args, "diff", False):
        print()
        print("(no primary in this run: nothing to diff against)")


def cmd_run(args: argparse.Namespace) -> int:
    if args.candidate is None and args.plan is None:
        raise CliError("Name the candidate pool (--candidate) or a plan (--plan).", 2)
    body: dict[str, Any] = {"suite": args.suite, "candidate": args.candidate,
                            "primary": args.primary, "plan": args.plan,
                            "model": args.model or "", "others": args.other or []}
    optional = {"concurrency": args.concurrency, "max_rps": args.max_rps,
                "margin_pct": args.margin_pct, "min_items": args.min_items,
                "timeout_s": args.timeout}
    body.update({k: v for k, v in optional.items() if v is not None})
    if args.seed is not None:
        body["decoding"] = {"seed": args.seed}
    client = _client(args)
    run = client.post(RUNS, body)
    if not args.json:
        print(f"started eval run {run['id']}: {client.base_url}{run['url']}", file=sys.stderr)
    if not args.wait:
        if args.json:
            print_json(run)
        else:
            print_fields(_summary_fields(run))
        return 0
    run = follow(client, run, args.json)
    _report(client, run, args)
    if run["status"] != "complete":
        return 1
    return EXIT.get(run["verdict"], 1)


def cmd_show(args: argparse.Namespace) -> int:
    client = _client(args)
    _report(client, client.get(f"{RUNS}{args.run_id}/"), args)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    run = _client(args).post(f"{RUNS}{args.run_id}/cancel/", {})
    if args.json:
        print_json(run)
    else:
        print(f"cancelled eval run {run['id']}: {run['progress']['done']}/"
              f"{run['progress']['total']} scored, kept")
    return 0


_rate = number_in(0.01, 10000, "give requests per second, 0.01 to 10000")


def _concurrency(value: str) -> int:
    number = _positive_int(value)
    if number > 256:
        raise argparse.ArgumentTypeError(f"{value!r}: give 1 to 256 requests in flight")
    return number


def _seed(value: str) -> int:
    try:
        return int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from exc


_margin = number_in(0, 100, "give score points from 0 to 100")


def _page(value: str) -> int:
    number = _positive_int(value)
    if number > 500:
        raise argparse.ArgumentTypeError("choose between 1 and 500")
    return number


def add_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = sub.add_parser("eval", help="score pinned eval suites on pools and compare them")
    actions = parser.add_subparsers(dest="eval_command", metavar="ACTION", required=True)

    suites = actions.add_parser("suites", help="the stored suites (newest version first)")
    suites.add_argument("--all", action="store_true", help="retired suites too")
    common(suites)
    suites.set_defaults(func=cmd_suites)

    upload = actions.add_parser(
        "upload", help="upload a suite (JSONL) as a new version (scope jobs)",
        description="Exit status 2 when a line is bad: every bad line is printed with its "
                    "number and nothing is stored.")
    upload.add_argument("file", metavar="FILE", help="the suite as JSONL")
    upload.add_argument("--name", required=True, help="the suite's name (a slug)")
    upload.add_argument("--description", default="", help="default: the file header's")
    common(upload)
    upload.set_defaults(func=cmd_upload)

    run = actions.add_parser(
        "run", help="score a suite on a candidate (and its primary); --wait follows it",
        description="Exit status with --wait: 0 pass, warn or insufficient; 3 fail; 1 the run "
                    "did not finish.")
    run.add_argument("--suite", required=True, help="id, name (newest version) or name@N")
    run.add_argument("--candidate", help="the pool judged (default: the plan's candidate)")
    run.add_argument("--primary", help="the pool compared with (default: the plan's primary)")
    run.add_argument("--other", action="append", metavar="POOL",
                     help="another pool scored alongside (repeatable)")
    run.add_argument("--plan", help="the plan the run's evidence is for")
    run.add_argument("--model", help="default: the plan's model or the one every pool serves")
    run.add_argument("--concurrency", type=_concurrency, help="requests in flight (default 16)")
    run.add_argument("--max-rps", type=_rate, help="requests per second (default no limit)")
    run.add_argument("--seed", type=_seed, help="the decoding seed (default the suite's)")
    run.add_argument("--margin-pct", type=_margin,
                     help="score points the candidate may lose (default the plan's, else 2)")
    run.add_argument("--min-items", type=_positive_int,
                     help="paired items needed for a verdict (default 100)")
    run.add_argument("--timeout", type=_number, help="seconds per answer (default 120)")
    run.add_argument("--wait", action="store_true", help="follow the run to its verdict")
    run.add_argument("--diff", action="store_true", help="with --wait: the items that changed")
    run.add_argument("--limit", type=_page, default=50, help="diff rows (default 50)")
    common(run)
    run.set_defaults(func=cmd_run)

    show = actions.add_parser("show", help="a run: progress, scores, paired difference, "
                                           "per-tag table, verdict")
    show.add_argument("run_id", type=_run_id, metavar="RUN")
    show.add_argument("--diff", action="store_true",
                      help="also the items the candidate and the primary scored differently")
    show.add_argument("--direction", choices=("regressed", "improved"),
                      help="with --diff: only the candidate's losses or gains")
    show.add_argument("--tag", help="with --diff: only items with this tag")
    show.add_argument("--limit", type=_page, default=50, help="diff rows (default 50)")
    common(show)
    show.set_defaults(func=cmd_show)

    cancel = actions.add_parser("cancel", help="stop a queued or running run (scope jobs)")
    cancel.add_argument("run_id", type=_run_id, metavar="RUN")
    common(cancel)
    cancel.set_defaults(func=cmd_cancel)


__all__ = ["CliError", "add_commands"]
