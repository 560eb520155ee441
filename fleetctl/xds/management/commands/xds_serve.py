"""Run one replica of fleetctl's xDS (ADS) server: Envoys bootstrapped with
render_xds_bootstrap connect here and get their gateway's clusters, routes and weights, as
every other replica serves them (the shared store: docs/xds.md)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleetctl.xds.server import start_server
from fleetctl.xds.shared import SharedStore


class Command(BaseCommand):
    help = ("Serve xDS (ADS over gRPC, state of the world) to Envoys until interrupted; run "
            "as many replicas as you like, each on its own port or host.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=18000,
                            help="the port Envoys connect to (default 18000)")
        parser.add_argument("--host", default="127.0.0.1",
                            help="the address to listen on (default 127.0.0.1); streams "
                                 "need their gateway's token (manage.py xds_token)")
        parser.add_argument("--replica", default="",
                            help="this replica's name in the ACK records (default: "
                                 "host-pid-random)")
        parser.add_argument("--poll-s", type=float, default=2.0,
                            help="how often the replica re-reads the newest snapshot numbers "
                                 "without a Redis wake-up, so a lost one delays a push by at "
                                 "most this (default 2)")

    def handle(self, *args: Any, **options: Any) -> None:
        port = options["port"]
        if not 0 < port < 65536:
            raise CommandError(f"--port {port} is not a port number (1-65535)")
        poll_s = options["poll_s"]
        if not 0.1 <= poll_s <= 3600:
            raise CommandError(f"--poll-s {poll_s:g} is out of range: from 0.1 to 3600 "
                               "seconds")
        store = SharedStore(replica=options["replica"] or None, poll_s=poll_s)
        try:
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: a normal stop
                asyncio.run(self._serve(store, options["host"], port))
        finally:
            store.stop()

    async def _serve(self, store: SharedStore, host: str, port: int) -> None:
        try:
            server, bound = await start_server(store, host, port)
        except (OSError, RuntimeError) as exc:
            raise CommandError(f"cannot serve xDS on {host}:{port}: {exc}") from exc
        self.stdout.write(f"xDS (ADS) serving on {host}:{bound} as replica {store.replica}",
                          ending="\n")
        self.stdout.flush()
        # SIGTERM (a supervisor's stop) ends the streams, so their Envoys are recorded gone
        # at once rather than when this replica's heartbeat goes stale.
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        try:
            await stopping.wait()
        finally:
            await server.stop(grace=0.5)
