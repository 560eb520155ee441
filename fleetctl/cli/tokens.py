"""`fleetctl token show | revoke`: the token the CLI is using (FLEETCTL_TOKEN or --token)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import httpx

from fleetctl.cli.client import ApiClient, CliError
from fleetctl.cli.output import print_fields, print_json

CURRENT = "/api/v1/tokens/current/"


def _client(args: argparse.Namespace) -> ApiClient:
    return ApiClient.from_env(args.url, args.token)


def _fields(token: dict[str, Any]) -> list[tuple[str, Any]]:
    return [("prefix", f"{token['prefix']}…"), ("name", token["name"]), ("kind", token["kind"]),
            ("owner", token["owner"] or "— (service token)"),
            ("scopes", ", ".join(token["scopes"])), ("expires", token["expires_at"] or "never"),
            ("revoked", token["revoked_at"] or "no")]


def cmd_token_show(args: argparse.Namespace) -> int:
    token = _client(args).get(CURRENT)
    if args.json:
        print_json(token)
    else:
        print_fields(_fields(token))
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    client = _client(args)
    token = client.get(CURRENT)
    try:
        response = client._http.delete(CURRENT)
    except httpx.HTTPError as exc:
        raise CliError(f"Could not reach {client.base_url} to revoke the token: {exc}") from exc
    if response.status_code != 204:
        client._decode(response)  # raises with the server's message
        raise CliError(f"HTTP {response.status_code}: the token was not revoked.")
    if args.json:
        print_json({"revoked": True, "prefix": token["prefix"], "name": token["name"]})
    else:
        print(f"Revoked token {token['prefix']}… ({token['name']}). It no longer works; "
              "remove it from FLEETCTL_TOKEN and wherever else it is stored.")
    return 0


def add_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    token = sub.add_parser("token", help="the API token this CLI is using")
    token_sub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    show = token_sub.add_parser("show", help="what the current token is and may do")
    common(show)
    show.set_defaults(func=cmd_token_show)
    revoke = token_sub.add_parser(
        "revoke", help="revoke the current token (e.g. one that leaked); no scope needed")
    common(revoke)
    revoke.set_defaults(func=cmd_token_revoke)
