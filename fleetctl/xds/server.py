"""The ADS server: one gRPC bidirectional stream per Envoy, state of the world.

Each Envoy opens StreamAggregatedResources and asks for CDS, RDS and RTDS on it. The first
request's `node.cluster` names the gateway the stream serves, for its whole life: the
stream reads that gateway's snapshots and no other, whatever a request asks for. A type is
sent when the Envoy first asks for it, when the resource names it asks for change, and when
a new snapshot changes the type's version; every response carries a fresh nonce, and the
Envoy's next request for the type answers it: an ACK (no error_detail) or a NACK (Envoy
keeps its previous config and says why). Types go out in SERVED_TYPES order, clusters first.

State of the world, not delta: fleetctl's resources are few per gateway (a cluster per pool
and tier, one route configuration, one runtime layer), a weights change touches only the
runtime layer, which is one small resource either way, and SotW needs no per-resource
bookkeeping on either side. docs/xds.md has the figures.

The server runs on grpc.aio in an event loop of its own: in a thread of this process
(`XdsServer(...).start()`, what tests and the adapter in the same process use) or as the
process itself (`manage.py xds_serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import grpc

from fleetctl.traffic.gateways.envoy.bootstrap import ADMIN_URL_METADATA
from fleetctl.xds.protos import (
    SERVED_TYPES,
    AdsServicer,
    DiscoveryResponse,
    add_ads_servicer,
)
from fleetctl.xds.store import SnapshotStore, default_store

log = logging.getLogger(__name__)

_CHANGED = object()  # a new snapshot of the stream's gateway
_ENDED = object()  # the Envoy closed its side


class AdsService(AdsServicer):
    def __init__(self, store: SnapshotStore, *, authenticate: bool = True) -> None:
        self.store = store
        self.authenticate = authenticate
        self._nonces = itertools.count(1)

    def token_gateway(self, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
        """The gateway whose token the stream presents (`authorization: Bearer <token>`),
        or None."""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str) \
                    and value.startswith("Bearer "):
                return self.store.gateway_of_token(value[len("Bearer "):].strip())
        return None

    async def StreamAggregatedResources(
            self, request_iterator: AsyncIterator[Any],
            context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        allowed = self.token_gateway(context) if self.authenticate else None
        if self.authenticate and allowed is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "xDS needs the gateway's token: gRPC metadata "
                                "'authorization: Bearer <token>' (manage.py xds_token)")

        async def read() -> None:
            try:
                async for request in request_iterator:
                    inbox.put_nowait(request)
            except (grpc.aio.AioRpcError, asyncio.CancelledError):
                pass
            finally:
                inbox.put_nowait(_ENDED)

        reader = asyncio.create_task(read())
        first = await inbox.get()
        if first is _ENDED:
            return
        gateway, node_id = first.node.cluster, first.node.id
        if not gateway or not node_id:
            reader.cancel()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "the first request must carry node.id (this Envoy) and "
                                "node.cluster (its fleetctl gateway)")
        if self.authenticate and gateway != allowed:
            reader.cancel()
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"this token is gateway {allowed}'s; node.cluster names "
                                f"{gateway}")
        admin_url, problem = node_admin_url(first.node)
        if problem:
            reader.cancel()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        stream = Stream(self, gateway, node_id)
        def wake() -> None:  # from whichever thread set the snapshot
            with contextlib.suppress(RuntimeError):  # the server stopped: nobody to wake
                loop.call_soon_threadsafe(inbox.put_nowait, _CHANGED)

        unsubscribe = self.store.subscribe(gateway, wake)
        stream.number = self.store.stream_opened(gateway, node_id, admin_url)
        log.info("xds: Envoy %s of gateway %s connected", node_id, gateway)
        try:
            item = first
            while item is not _ENDED:
                responses = stream.changed() if item is _CHANGED else stream.request(item)
                for response in responses:
                    yield response
                item = await inbox.get()
        finally:
            unsubscribe()
            reader.cancel()
            self.store.stream_closed(gateway, node_id, stream.number)
            log.info("xds: Envoy %s of gateway %s disconnected", node_id, gateway)

    def nonce(self) -> str:
        return str(next(self._nonces))


class Stream:
    """One Envoy's ADS stream: what it asked for and what it was sent, per type."""

    def __init__(self, service: AdsService, gateway: str, node_id: str) -> None:
        self.service = service
        self.store = service.store
        self.gateway = gateway
        self.node_id = node_id
        self.number = 0
        self.names: dict[str, tuple[str, ...]] = {}  # type -> resource names asked for
        self.sent: dict[str, tuple[str, tuple[str, ...], str]] = {}  # version, names, nonce

    def request(self, request: Any) -> list[Any]:
        type_url = request.type_url
        if type_url not in SERVED_TYPES:
            return []  # fleetctl serves no such type; Envoy's own timeout says so
        if request.response_nonce:
            self.store.answered(self.gateway, self.node_id, type_url, request.response_nonce,
                                _error(request))
            last = self.sent.get(type_url)
            if last is None or request.response_nonce != last[2]:
                return []  # an answer to an older response: a newer one is on its way
        self.names[type_url] = tuple(request.resource_names)
        response = self._response(type_url)
        return [response] if response is not None else []

    def changed(self) -> list[Any]:
        return [response for type_url in SERVED_TYPES if type_url in self.names
                for response in [self._response(type_url)] if response is not None]

    def _response(self, type_url: str) -> Any | None:
        snapshot = self.store.snapshot(self.gateway)
        served = snapshot.types[type_url]
        names = self.names[type_url]
        last = self.sent.get(type_url)
        if last is not None and last[0] == served.version and last[1] == names:
            return None  # Envoy has it (or refused it: resending the same would not help)
        nonce = self.service.nonce()
        self.sent[type_url] = (served.version, names, nonce)
        self.store.sent(self.gateway, self.node_id, type_url, nonce, served.version,
                        snapshot.number)
        return DiscoveryResponse(version_info=served.version, type_url=type_url, nonce=nonce,
                                 resources=served.named(names))


def node_admin_url(node: Any) -> tuple[str, str]:
    """(the Envoy's admin URL from its node metadata `fleetctl_admin_url`, "" if none; why it
    cannot be used, or ""). Only its form is checked here, without a DNS lookup on the event
    loop; the destination policy is applied where it is read (the envoy-xds adapter)."""
    field = node.metadata.fields.get(ADMIN_URL_METADATA) if node.HasField("metadata") else None
    if field is None:
        return "", ""
    value = field.string_value
    problem = (f"node.metadata.{ADMIN_URL_METADATA} must be this Envoy's admin URL, "
               f"http://host:port (at most 300 characters), not {value[:100]!r}; "
               "render_xds_bootstrap(admin_url=...) writes it")
    if field.WhichOneof("kind") != "string_value" or len(value) > 300:
        return "", problem
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
    if (parts.scheme not in ("http", "https") or not parts.hostname or port is None
            or parts.path not in ("", "/") or parts.query or parts.fragment):
        return "", problem
    return value.rstrip("/"), ""


def _error(request: Any) -> str | None:
    if not request.HasField("error_detail"):
        return None
    return request.error_detail.message or f"code {request.error_detail.code}"


class XdsServer:
    """The ADS server on its own event loop thread: `XdsServer(port=0).start()` ... `.stop()`;
    `port` is the bound port once started."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0,
                 store: SnapshotStore | None = None, authenticate: bool = True) -> None:
        self.host = host
        self.port = port
        self.authenticate = authenticate
        self.store = store if store is not None else default_store()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: grpc.aio.Server | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> XdsServer:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self._serve(started))
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                started.set()

        self._thread = threading.Thread(target=run, name="xds-server", daemon=True)
        self._thread.start()
        if not started.wait(timeout_s):
            raise RuntimeError(f"the xDS server did not start within {timeout_s:g} s")
        if failure:
            raise RuntimeError(f"the xDS server could not start on {self.address}: "
                               f"{failure[0]}") from failure[0]
        return self

    async def _serve(self, started: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._server, self.port = await start_server(self.store, self.host, self.port,
                                                      authenticate=self.authenticate)
        started.set()
        await self._stopped.wait()
        await self._server.stop(grace=0.5)

    def stop(self) -> None:
        if self._loop is None or self._stopped is None:
            return
        self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> XdsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def start_server(store: SnapshotStore, host: str, port: int, *,
                       authenticate: bool = True) -> tuple[grpc.aio.Server, int]:
    """An aio gRPC server with the ADS service on host:port (0: any free port), started,
    and the port it is bound to."""
    server = grpc.aio.server(options=[
        # Envoy keeps its stream open for as long as it runs; keepalive pings find dead ones,
        # both ways. The bootstrap's Envoy pings every 15 s on a stream that may carry no data
        # for hours: the server's ping policy must allow that. Its option is
        # GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, spelt as below; with the
        # default (5 min) the server sent GOAWAY "Too many pings" every ~90 s in `make demo`
        # and Envoy reconnected.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        # A port another process serves is an error, not a second listener beside it.
        ("grpc.so_reuseport", 0),
    ])
    add_ads_servicer(AdsService(store, authenticate=authenticate), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    return server, bound
