"""`fleetctl batch`: batch jobs over REST — submit an input file (OpenAI Batch JSONL) to a
pool, follow its progress, pause / resume / cancel / edit it, download its output or error
file; and soaks (`fleetctl batch soak start|status|stop`).

Uploads are streamed (httpx reads the file in chunks; the server validates it line by line);
downloads are streamed to stdout or -o FILE, so neither holds a large file in memory."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import IO, Any

import httpx

from fleetctl.cli.client import ApiClient, CliError
from fleetctl.cli.output import (
    non_negative,
    print_answer,
    print_fields,
    print_json,
    print_table,
    show_answer,
)

JOBS = "/api/v1/batch/jobs/"
FILES = "/api/v1/batch/files/"
SOAKS = "/api/v1/batch/soaks/"
# Exit codes of `--wait`: how the job ended.
EXIT_BY_STATE = {"completed": 0, "failed": 3, "expired": 3, "cancelled": 3, "paused": 4}
ACTIVE = ("queued", "running")
FOLLOW_EVERY_S = 2.0
# The server validates the whole file before it answers: a million lines take a while.
UPLOAD_TIMEOUT_S = 900.0
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _client(args: argparse.Namespace) -> ApiClient:
    return ApiClient.from_env(args.url, args.token)


def duration(text: str) -> int:
    """"90s", "5m", "24h", "7d" or plain seconds → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a duration like 90s, 5m, 24h or 7d (or seconds)")
    seconds = float(match[1]) * UNITS[match[2] or "s"]
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one second")
    return round(seconds)


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    value = float(value)
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _rate(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:,.1f} {unit}"


def progress_line(job: dict[str, Any]) -> str:
    """One line: state, requests done, failures, throughput, ETA."""
    p = job.get("progress") or {}
    total = p.get("total", job.get("total", 0))
    done = p.get("done", 0)
    percent = f"{100 * done / total:.1f} %" if total else "100 %"
    parts = [f"job {job['id']} {job['state']}: {done:,}/{total:,} ({percent})"]
    if p.get("failed"):
        parts.append(f"{p['failed']:,} failed")
    if p.get("retries"):
        parts.append(f"{p['retries']:,} retries")
    if p.get("requests_per_s") is not None:
        parts.append(f"{_rate(p['requests_per_s'], 'req/s')}, "
                     f"{_rate(p.get('output_tokens_per_s'), 'tok/s')}")
    if job["state"] in ACTIVE and p.get("eta_s") is not None:
        parts.append(f"ETA {_seconds(p['eta_s'])}")
    if job.get("state_reason") and job["state"] not in ACTIVE:
        parts.append(job["state_reason"])
    return ", ".join(parts)


def print_job(job: dict[str, Any]) -> None:
    p = job.get("progress") or {}
    rate = _rate(job["rate_limit_rps"], "req/s") if job["rate_limit_rps"] else "no limit"
    print_fields([
        ("job", f"{job['id']} ({job['public_id']})"),
        ("state", f"{job['state']} {job.get('state_reason') or ''}".strip()),
        ("input file", f"{job['input_file']} ({job['input_file_name']}), {job['total']:,} "
                       f"requests"),
        ("pool", job["pool"]), ("plan", job.get("plan")), ("soak", job.get("soak")),
        ("limits", f"concurrency {job['concurrency']}, rate {rate}, chunks of "
                   f"{job['chunk_size']}, {job['max_attempts']} attempts"),
        ("progress", progress_line(job).split(": ", 1)[1]),
        ("chunks", f"{p.get('chunks_done', 0)} done, {p.get('chunks_running', 0)} running of "
                   f"{p.get('chunks', 0)}" if p else None),
        ("tokens", f"{p.get('prompt_tokens', 0):,} prompt, {p.get('output_tokens', 0):,} "
                   f"output" if p else None),
        ("resends", f"{p.get('resends', 0)} (in flight at a takeover, sent again); "
                    f"{p.get('duplicates_refused', 0)} duplicate results refused" if p else None),
        ("drill", f"{job['drill']} at {job['drill_at']:g}: "
                  f"{job.get('drill_verdict') or 'no verdict yet'} {job.get('drill_summary') or ''}"
                  .strip() if job.get("drill") else None),
        ("created", f"{job['created_at']} by {job['created_by']}"),
        ("expires", job["expires_at"]), ("finished", job.get("finished_at")),
        ("output", f"fleetctl batch output {job['id']} [-o FILE]; --errors for the error file"),
    ])


def _follow(client: ApiClient, job: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """Poll until the job is no longer queued or running, printing its progress."""
    last = ""
    for job in client.polled(job, f"{JOBS}{job['id']}/", lambda job: job["state"] in ACTIVE,
                             FOLLOW_EVERY_S):
        line = progress_line(job)
        if not quiet and line != last:
            print(line, file=sys.stderr, flush=True)
        last = line
    return job


def _ended(job: dict[str, Any], as_json: bool) -> int:
    print_answer(job, as_json, progress_line)
    return EXIT_BY_STATE.get(job["state"], 1)


def _file(path_text: str) -> Path:
    path = Path(path_text)
    if not path.is_file():
        raise CliError(f"{path_text}: no such file", 2)
    return path


def _post_file(client: ApiClient, url: str, path: Path, form: dict[str, str]) -> Any:
    """POST a JSONL file with form fields: httpx streams the file, the server reads it line
    by line."""
    with path.open("rb") as fp:
        return client._send("POST", url, data=form,
                            files={"file": (path.name, fp, "application/x-ndjson")},
                            timeout=UPLOAD_TIMEOUT_S)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    values = {
        "pool": args.pool, "concurrency": args.concurrency, "rate_limit_rps": args.rate,
        "completion_window_s": args.window, "chunk_size": args.chunk_size,
        "max_attempts": args.max_attempts, "drill": args.drill, "drill_at": args.drill_at,
        "compare_sample": args.compare_sample, "request_timeout_s": args.request_timeout,
    }
    return {k: v for k, v in values.items() if v is not None}


def cmd_submit(args: argparse.Namespace) -> int:
    if bool(args.file) == (args.input_file is not None):
        raise CliError("fleetctl batch submit: give FILE (uploaded with the job) or "
                       "--input-file ID (an uploaded file), one of them.", 2)
    client = _client(args)
    options = _options(args)
    if args.input_file is not None:
        job = client.post(JOBS, {"input_file": args.input_file, **options}, idempotent=True)
    else:
        # One step: the file and the options in one multipart request, so a refused job
        # keeps no file.
        form = {k: str(v) for k, v in options.items()}
        if args.name:
            form["name"] = args.name
        job = _post_file(client, JOBS, _file(args.file), form)
    if not args.wait:
        print_answer(job, args.json, progress_line)
        return 0
    return _ended(_follow(client, job, args.json), args.json)


def cmd_upload(args: argparse.Namespace) -> int:
    path = _file(args.file)
    uploaded = _post_file(_client(args), FILES, path, {"name": args.name or path.name})
    if args.json:
        print_json(uploaded)
    else:
        models = ", ".join(uploaded["model_lines"]) or "—"
        print(f"input file {uploaded['id']} ({uploaded['name']}): {uploaded['requests']:,} "
              f"requests, {uploaded['size_bytes']:,} bytes, models {models}, sha256 "
              f"{uploaded['sha256'][:16]}…")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    client = _client(args)
    jobs = client.get_all(JOBS, {"state": args.state, "pool": args.pool, "plan": args.plan,
                                 "soak": args.soak}, limit=args.limit)
    if args.json:
        print_json(jobs)
        return 0
    print_table(["id", "state", "pool", "plan", "requests", "file", "drill", "by", "created"],
                [[j["id"], j["state"], j["pool"], j.get("plan") or "", j["total"],
                  j["input_file_name"], j.get("drill") or "", j["created_by"], j["created_at"]]
                 for j in jobs])
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    client = _client(args)
    job = client.get(f"{JOBS}{args.id}/")
    if args.wait:
        return _ended(_follow(client, job, args.json), args.json)
    show_answer(job, args.json, print_job)
    return 0


def _action(name: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        job = _client(args).post(f"{JOBS}{args.id}/{name}/", {"reason": args.reason},
                                 idempotent=True)
        print_answer(job, args.json, progress_line)
        return 0

    return run


def cmd_edit(args: argparse.Namespace) -> int:
    if args.concurrency is None and args.rate is None:
        raise CliError("fleetctl batch edit: give --concurrency or --rate (0: no limit).", 2)
    body: dict[str, Any] = {"reason": args.reason}
    if args.concurrency is not None:
        body["concurrency"] = args.concurrency
    if args.rate is not None:
        body["rate_limit_rps"] = args.rate
    job = _client(args)._send("PATCH", f"{JOBS}{args.id}/", json=body)
    if args.json:
        print_json(job)
    else:
        print(f"{progress_line(job)}; concurrency {job['concurrency']}, rate "
              f"{job['rate_limit_rps'] or 'no limit'}")
    return 0


def _download(client: ApiClient, path: str, out: IO[bytes]) -> int:
    """Stream a download into `out`; returns the bytes written. An error answer is JSON."""
    written = 0
    try:
        with client._http.stream("GET", path, headers={"Accept": "application/x-ndjson"},
                                 timeout=UPLOAD_TIMEOUT_S) as response:
            if response.status_code >= 400:
                response.read()
                client._decode(response)  # raises with the server's message
            for block in response.iter_bytes():
                out.write(block)
                written += len(block)
    except (httpx.ConnectError, httpx.TimeoutException) as exc:
        raise client._transport_error(path, exc) from exc
    return written


def cmd_output(args: argparse.Namespace) -> int:
    client = _client(args)
    which = "errors" if args.errors else "output"
    path = f"{JOBS}{args.id}/{which}/"
    if args.output in (None, "-"):
        _download(client, path, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return 0
    target = Path(args.output)
    partial = target.with_name(target.name + ".part")
    try:
        with partial.open("wb") as out:
            written = _download(client, path, out)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    print(f"wrote {written:,} bytes to {target}", file=sys.stderr)
    return 0


# --- soaks -------------------------------------------------------------------------------------

def _soak_line(soak: dict[str, Any]) -> str:
    summary = soak.get("summary") or {}
    verdict = summary.get("verdict")
    return (f"soak {soak['id']} of plan {soak['plan']} on {soak['pool']}: {soak['state']}"
            + (f", verdict {verdict}" if verdict else "")
            + (f" ({soak['state_reason']})" if soak.get("state_reason") else ""))


def cmd_soak_start(args: argparse.Namespace) -> int:
    if bool(args.file) == (args.input_file is not None):
        raise CliError("fleetctl batch soak start: give --file FILE or --input-file ID, one "
                       "of them.", 2)
    client = _client(args)
    input_file = args.input_file
    if args.file:
        path = _file(args.file)
        input_file = _post_file(client, FILES, path, {"name": path.name})["id"]
    body = {"plan": args.plan, "input_file": input_file, "every_s": args.every,
            "duration_s": args.duration, "concurrency": args.concurrency,
            "rate_limit_rps": args.rate, "completion_window_s": args.window,
            "chunk_size": args.chunk_size, "drill": args.drill}
    soak = client.post(SOAKS, {k: v for k, v in body.items() if v is not None},
                       idempotent=True)
    print_answer(soak, args.json, _soak_line)
    return 0


def cmd_soak_status(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.id is None:
        soaks = client.get_all(SOAKS, {"state": args.state}, limit=args.limit)
        if args.json:
            print_json(soaks)
            return 0
        print_table(["id", "plan", "pool", "state", "every", "duration", "started", "ends"],
                    [[s["id"], s["plan"], s["pool"], s["state"], _seconds(s["every_s"]),
                      _seconds(s["duration_s"]), s["started_at"], s["ends_at"]] for s in soaks])
        return 0
    soak = client.get(f"{SOAKS}{args.id}/")
    if args.json:
        print_json(soak)
        return 0
    summary = soak.get("summary") or {}
    print(_soak_line(soak))
    for reason in summary.get("reasons") or []:
        print(f"  - {reason}")
    jobs = summary.get("jobs") or []
    if jobs:
        print()
        print_table(["job", "state", "requests", "error rate", "req/s", "tok/s", "retries"],
                    [[j.get("job"), j.get("state"), j.get("total"), j.get("error_rate"),
                      j.get("requests_per_s"), j.get("output_tokens_per_s"), j.get("retries")]
                     for j in jobs])
    interventions = summary.get("interventions") or []
    if interventions:
        print()
        print("manual interventions:")
        for item in interventions:
            print(f"  {item.get('at')}  {item.get('who')} ({item.get('source')}): "
                  f"{item.get('what')}")
    return 0


def cmd_soak_stop(args: argparse.Namespace) -> int:
    soak = _client(args).post(f"{SOAKS}{args.id}/stop/", {"reason": args.reason},
                              idempotent=True)
    print_answer(soak, args.json, _soak_line)
    return 0


def add_commands(sub: Any, common: Any) -> None:
    batch = sub.add_parser(
        "batch", help="batch jobs: submit an OpenAI Batch JSONL file to a pool, follow it, "
                      "download its output; soaks",
        description="Batch jobs run an input file (OpenAI Batch JSONL: custom_id, method, "
                    "url, body per line) on one pool with a concurrency limit, a rate limit "
                    "and a completion window. Token scope `jobs` to change, `read` to look.")
    actions = batch.add_subparsers(dest="batch_command", metavar="ACTION", required=True)
    _add_submit(actions, common)
    _add_job_commands(actions, common)
    soak = actions.add_parser("soak", help="recurring jobs on a stage-3 plan's candidate")
    _add_soak_commands(soak.add_subparsers(dest="soak_command", metavar="ACTION",
                                           required=True), common)


def _add_submit(actions: Any, common: Any) -> None:
    submit = actions.add_parser("submit", help="upload a file and start a job on a pool")
    submit.add_argument("file", nargs="?", help="the input file (JSONL)")
    submit.add_argument("--input-file", type=int, help="an uploaded file's id instead of FILE")
    submit.add_argument("--name", help="the stored file's name (default: FILE's name)")
    submit.add_argument("--pool", required=True)
    submit.add_argument("--concurrency", type=non_negative(int),
                        help="requests in flight at once (default 8)")
    submit.add_argument("--rate", type=non_negative(float),
                        help="requests started per second, at most (default: no limit)")
    submit.add_argument("--window", type=duration,
                        help="completion window, e.g. 24h (default), 30m, 7d")
    submit.add_argument("--chunk-size", type=non_negative(int), help="requests per chunk (1000)")
    submit.add_argument("--max-attempts", type=non_negative(int),
                        help="tries per request on 429/5xx/transport errors (5)")
    submit.add_argument("--request-timeout", type=non_negative(float),
                        help="seconds to wait for one answer (120)")
    submit.add_argument("--drill", choices=("kill-worker", "fault-pool"),
                        help="an interruption drill mid-way (checkpoint-resume evidence)")
    submit.add_argument("--drill-at", type=non_negative(float),
                        help="share of requests done when the drill fires (0.4)")
    submit.add_argument("--compare-sample", type=non_negative(int),
                        help="answers compared with the plan's primary (20; 0: none)")
    submit.add_argument("--wait", action="store_true",
                        help="follow the job until it ends, printing its progress: exit 0 "
                             "completed, 3 failed/expired/cancelled, 4 paused")
    common(submit)
    submit.set_defaults(func=cmd_submit)


def _add_job_commands(actions: Any, common: Any) -> None:
    """upload, list, status, pause / resume / cancel, edit and output."""
    upload = actions.add_parser("upload", help="upload and validate an input file (no job)")
    upload.add_argument("file")
    upload.add_argument("--name")
    common(upload)
    upload.set_defaults(func=cmd_upload)

    listing = actions.add_parser("list", help="jobs, newest first")
    listing.add_argument("--state", choices=("queued", "running", "paused", "completed",
                                             "expired", "cancelled", "failed"))
    listing.add_argument("--pool")
    listing.add_argument("--plan")
    listing.add_argument("--soak", type=int)
    listing.add_argument("--limit", type=int, default=20)
    common(listing)
    listing.set_defaults(func=cmd_list)

    status = actions.add_parser("status", help="a job: progress, limits, drill, tokens")
    status.add_argument("id", type=int)
    status.add_argument("--wait", action="store_true", help="follow it until it ends")
    common(status)
    status.set_defaults(func=cmd_status)

    for name, text in (("pause", "stop dispatching (in-flight requests finish)"),
                       ("resume", "carry on a paused job"),
                       ("cancel", "end the job; its output so far stays")):
        parser = actions.add_parser(name, help=f"{text} (a manual action, on the timeline)")
        parser.add_argument("id", type=int)
        parser.add_argument("--reason", required=True)
        common(parser)
        parser.set_defaults(func=_action(name))

    edit = actions.add_parser("edit", help="change an active job's concurrency or rate")
    edit.add_argument("id", type=int)
    edit.add_argument("--concurrency", type=non_negative(int))
    edit.add_argument("--rate", type=non_negative(float), help="requests/s (0: no limit)")
    edit.add_argument("--reason", required=True)
    common(edit)
    edit.set_defaults(func=cmd_edit)

    output = actions.add_parser("output", help="download the output file (or --errors)")
    output.add_argument("id", type=int)
    output.add_argument("--errors", action="store_true", help="the error file instead")
    output.add_argument("-o", "--output", metavar="FILE", help="write here (default stdout)")
    output.set_defaults(func=cmd_output)


def _add_soak_commands(soak_actions: Any, common: Any) -> None:
    start = soak_actions.add_parser("start", help="start a soak (its first job now)")
    start.add_argument("--plan", required=True)
    start.add_argument("--file", help="an input file to upload")
    start.add_argument("--input-file", type=int, help="an uploaded file's id")
    start.add_argument("--every", type=duration, required=True, help="e.g. 5m")
    start.add_argument("--duration", type=duration, required=True, help="e.g. 7d")
    start.add_argument("--concurrency", type=non_negative(int))
    start.add_argument("--rate", type=non_negative(float))
    start.add_argument("--window", type=duration, help="each job's completion window")
    start.add_argument("--chunk-size", type=non_negative(int))
    start.add_argument("--drill", choices=("kill-worker", "fault-pool"),
                       help="a drill in the soak's first job")
    common(start)
    start.set_defaults(func=cmd_soak_start)
    soak_status = soak_actions.add_parser("status", help="a soak's jobs, interventions and "
                                                         "verdict; or the list")
    soak_status.add_argument("id", nargs="?", type=int)
    soak_status.add_argument("--state", choices=("running", "passed", "failed", "stopped"))
    soak_status.add_argument("--limit", type=int, default=20)
    common(soak_status)
    soak_status.set_defaults(func=cmd_soak_status)
    stop = soak_actions.add_parser("stop", help="stop a running soak (it then fails: a "
                                                "person intervened)")
    stop.add_argument("id", type=int)
    stop.add_argument("--reason", required=True)
    common(stop)
    stop.set_defaults(func=cmd_soak_stop)
