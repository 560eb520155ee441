"""Lift an API-authentication block on an address before it expires (e.g. a CI runner that
shared an address with a misconfigured bot)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleetctl.accounts import throttle


class Command(BaseCommand):
    help = "Forget the invalid API tokens counted for an address and lift its 429 block."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ip_address", help="the client address, as the audit log shows it")

    def handle(self, *args: Any, **options: Any) -> None:
        throttle.reset(options["ip_address"])
        self.stdout.write(f"bearer tokens from {options['ip_address']} are accepted again")
