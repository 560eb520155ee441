"""`fleetctl telemetry`: live per-pool figures, each with where it was measured."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetctl.cli.client import ApiClient
from fleetctl.cli.output import checked_number, print_table, show_answer

# (label, key in a pool's figures, unit)
FIGURES = (("error rate", "error_rate", "rate"), ("TTFT p50", "ttft_p50", "ms"),
           ("TTFT p95", "ttft_p95", "ms"), ("TTFT p99", "ttft_p99", "ms"),
           ("TPOT p95", "tpot_p95", "ms"), ("duration p95", "duration_p95", "ms"))


def figure_text(figure: dict[str, Any] | None, unit: str = "ms") -> str:
    """"412 ms [380–450] n=812": the estimate, its confidence bounds and the samples; "no
    data" when there were none (missing data is never shown as zero)."""
    if not figure or figure.get("value") is None:
        return f"no data (n={figure.get('n', 0) if figure else 0})"

    def one(value: float | None) -> str:
        if value is None:
            return "?"
        return f"{value * 100:.2f} %" if unit == "rate" else f"{value:.0f} ms"

    bounds = ""
    if figure.get("low") is not None or figure.get("high") is not None:
        bounds = f" [{one(figure.get('low'))} – {one(figure.get('high'))}]"
    return f"{one(figure['value'])}{bounds} n={figure['n']}"


def print_stats(stats: list[dict[str, Any]]) -> None:
    """One block per pool: counts, then each figure with its bounds and its source."""
    if not stats:
        print("(no pools)")
    for i, pool in enumerate(stats):
        if i:
            print()
        scope = f" on route {pool['route']}" if pool.get("route") else ""
        print(f"{pool['pool']}{scope}: {pool['requests']} requests, {pool['errors']} errors, "
              f"{pool.get('client_disconnects', 0)} client disconnects (not counted), "
              f"{pool['retries']} retries, {pool.get('fallbacks', 0)} fallbacks answered, "
              f"{pool.get('fell_over', 0)} fell over, {pool['streamed']} streamed, "
              f"{pool['rps']:.2f} req/s; last data {pool.get('last_data_at') or 'never'}")
        print_table(["figure", "value", "source"],
                    [[label, figure_text(pool.get(key), unit),
                      (pool.get(key) or {}).get("source", "")] for label, key, unit in FIGURES])


def cmd_telemetry(args: argparse.Namespace) -> int:
    client = ApiClient.from_env(args.url, args.token)
    if args.route:
        # Route-scoped figures are per pool: the pools the route's split names.
        pools = args.pool or list((client.get(f"/api/v1/routes/{args.route}/")["current"]
                                   or {}).get("weights", {}))
        since = (datetime.now(UTC) - timedelta(seconds=args.window_s)).isoformat()
        stats = [client.get(f"/api/v1/telemetry/pools/{pool}/",
                            {"route": args.route, "since": since})["stats"]
                 for pool in pools]
    else:
        params: dict[str, Any] = {"window_s": args.window_s}
        if args.pool:
            params["pool"] = args.pool
        body = client.get("/api/v1/telemetry/pools/", params)
        stats = body["results"] if isinstance(body, dict) else body
    show_answer(stats, args.json, print_stats)
    return 0


_window = checked_number(int, lambda seconds: 10 <= seconds <= 86400,
                         not_a_number="{value!r} is not whole seconds",
                         refused="choose between 10 and 86400 seconds")


def add_commands(sub: Any, common: Any) -> None:
    telemetry = sub.add_parser(
        "telemetry", help="live per-pool figures (error rate, TTFT, TPOT) with their sources")
    telemetry.add_argument("--pool", action="append",
                           help="only this pool (repeat for more)")
    telemetry.add_argument("--route", help="only this route's requests, per pool it carries")
    telemetry.add_argument("--window-s", type=_window, default=60,
                           help="the last this-many seconds (default 60)")
    common(telemetry)
    telemetry.set_defaults(func=cmd_telemetry)
