"""Several xDS replicas sharing state (fleetctl/xds/shared.py), all real: two `manage.py
xds_serve` processes on the test database and Redis, Envoys whose xds_cluster lists both,
and pushes made by the `envoy-xds` adapter in this process, which serves no xDS at all.
Killing a replica with -9 mid-push: its Envoys reconnect to the other and the push is
verified by their ACKs. Streams without their gateway's token are refused."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from fleetctl.core.ports import free_port
from fleetctl.demo import process
from fleetctl.demo.envoy_process import EnvoyProcess, XdsSource
from fleetctl.traffic.gateways.base import ApplyResult, GatewaySpec, PoolTarget
from fleetctl.traffic.gateways.envoy.names import CLUSTER_TYPE
from fleetctl.traffic.gateways.envoy_xds.adapter import EnvoyXdsAdapter
from fleetctl.traffic.models import Gateway
from fleetctl.xds import shared
from fleetctl.xds.models import XdsEnvoy, XdsGateway
from fleetctl.xds.protos import SERVED_TYPES, AdsStub, DiscoveryRequest
from fleetctl.xds.services import gateway_token_issue
from fleetctl.xds.shared import SharedStore, redis_client
from fleetctl.xds.store import default_store, set_default_store
from tests.conftest import _worker_env
from tests.sim.simproc import SimProcess
from tests.support.waiting import wait_until

from .conftest import JURISDICTION, MODEL, route, served_by, state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[3]
HELLO = [{"role": "user", "content": "hello"}]


class Replica:
    """`manage.py xds_serve` in a process of its own, on the test database."""

    def __init__(self, name: str, workdir: Path, *args: str) -> None:
        self.name = name
        self.log = workdir / f"{name}.log"
        # free_port's port can be taken before the replica binds it (another worker's
        # process, an outgoing connection's ephemeral port): then the replica exits saying
        # so, and it is started again on another port.
        for _ in range(3):
            self.port = free_port()
            with self.log.open("wb") as log:
                self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                    [sys.executable, "manage.py", "xds_serve", "--port", str(self.port),
                     "--replica", name, *args],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                    env=_worker_env(connection.settings_dict["NAME"]))
            wait_until(lambda: "xDS (ADS) serving on" in self.log.read_text()
                       or self.proc.poll() is not None, timeout_s=60,
                       what=f"xds_serve {name} to listen", explain=self.log.read_text)
            if self.proc.poll() is None:
                return
            if "Failed to bind" not in self.log.read_text():
                break
        raise AssertionError(f"xds_serve {name} exited: {self.log.read_text()}")

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no stream is closed, no row written
        self.proc.wait(10)

    def stop(self) -> None:
        process.stop(self.proc, 10)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    started: list[Replica] = []
    try:
        started.append(Replica("r1", tmp_path))
        started.append(Replica("r2", tmp_path))
        yield started[0], started[1]
    finally:
        for replica in started:
            replica.stop()


def pools(sims: SimProcess, *names: str) -> dict[str, PoolTarget]:
    return {n: PoolTarget(n, (sims.url(n),), JURISDICTION[n]) for n in names}


def ask(sims: SimProcess, envoy: EnvoyProcess) -> str:
    request_id = f"req-{free_port()}-{id(envoy)}"
    answer = httpx.post(f"{envoy.listen_url}/v1/chat/completions", timeout=30,
                        json={"model": MODEL, "messages": HELLO, "max_tokens": 1},
                        headers={"x-request-id": request_id})
    assert answer.status_code == 200, answer.text
    return served_by(sims, request_id)[request_id]


def dynamic_clusters(envoy: EnvoyProcess) -> set[str]:
    answer = httpx.get(f"{envoy.admin_url}/config_dump",
                       params={"resource": "dynamic_active_clusters"}, timeout=5)
    return {c["cluster"]["name"] for c in answer.json().get("configs", [])}


def replica_of(gateway: str, node_id: str) -> str:
    return XdsEnvoy.objects.get(gateway=gateway, node_id=node_id).replica


def test_a_push_from_another_process_reaches_envoys_on_either_replica_and_survives_a_kill(
        replicas: tuple[Replica, Replica], sims: SimProcess, tmp_path: Path) -> None:
    r1, r2 = replicas
    token = gateway_token_issue(gateway="gw-rep")
    envoys = []
    try:
        # Each Envoy lists both replicas, a different one first.
        for node, first, other in (("e1", r1, r2), ("e2", r2, r1)):
            envoys.append(EnvoyProcess(
                tmp_path / node, free_port(), free_port(),
                xds=XdsSource("127.0.0.1", first.port, "gw-rep", node, token=token,
                              replicas=(("127.0.0.1", other.port),))).start(timeout_s=60))
        store = SharedStore()  # this process pushes; it serves no xDS
        adapter = EnvoyXdsAdapter(GatewaySpec("gw-rep", "envoy-xds", envoys[0].admin_url,
                                              {"ack_timeout_s": 30}), store=store)
        wait_until(lambda: sum(e.connected for e in store.envoys("gw-rep")) == 2,
                   what="both Envoys to be recorded connected")
        result = adapter.apply(state(pools(sims, "pa", "pb"), route("chat", {"pa": 10000})))
        assert "ACKed by 2 Envoy(s)" in result.detail
        for envoy in envoys:  # the independent check: what Envoy itself holds
            assert dynamic_clusters(envoy) == {"pa", "pb"}
            assert ask(sims, envoy) == "pa"

        # kill -9 the replica e1 is on while a push is under way: e1 reconnects to the other
        # and the push is verified by both Envoys' ACKs.
        doomed = {r.name: r for r in replicas}[replica_of("gw-rep", "e1")]
        survivor = r2 if doomed is r1 else r1
        desired = state(pools(sims, "pa", "pb"), route("chat", {"pa": 0, "pb": 10000}))
        outcome: list[ApplyResult | BaseException] = []
        pushing = threading.Thread(target=lambda: outcome.append(_apply(adapter, desired)))
        pushing.start()
        doomed.kill()
        pushing.join(60)
        assert outcome and isinstance(outcome[0], ApplyResult), outcome
        assert "ACKed by 2 Envoy(s)" in outcome[0].detail
        assert replica_of("gw-rep", "e1") == survivor.name
        assert replica_of("gw-rep", "e2") == survivor.name
        assert adapter.read_back() == desired.held_weights()
        assert [ask(sims, envoy) for envoy in envoys] == ["pb", "pb"]
        current = store.snapshot("gw-rep")
        assert all(e.connected and e.holds(current, t)
                   for e in store.envoys("gw-rep") for t in SERVED_TYPES)
    finally:
        for envoy in envoys:
            envoy.stop()
    # Stopped Envoys are gone, not failing; the survivor saw their streams end.
    wait_until(lambda: not any(e.connected for e in SharedStore().envoys("gw-rep")),
               what="the stopped Envoys to be recorded gone")


def _apply(adapter: EnvoyXdsAdapter, desired: Any) -> ApplyResult | BaseException:
    try:
        return adapter.apply(desired)
    except BaseException as exc:  # reported to the test's thread
        return exc
    finally:
        connection.close()  # this thread's own database connection


def _open_stream(port: int, cluster: str, token: str | None) -> grpc.RpcError | Any:
    """Open an ADS stream as node `cluster`/n1 and read one response (or the refusal)."""
    metadata = [("authorization", f"Bearer {token}")] if token is not None else []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        request = DiscoveryRequest(type_url=CLUSTER_TYPE)
        request.node.id, request.node.cluster = "n1", cluster
        try:
            return next(AdsStub(channel).StreamAggregatedResources(
                iter([request]), metadata=metadata, timeout=10))
        except grpc.RpcError as exc:
            return exc


def test_a_stream_needs_its_own_gateways_token(replicas: tuple[Replica, Replica]) -> None:
    r1, _ = replicas
    token_a = gateway_token_issue(gateway="gw-a")
    gateway_token_issue(gateway="gw-b")
    missing = _open_stream(r1.port, "gw-a", None)
    assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
    wrong = _open_stream(r1.port, "gw-a", "fxds_not-a-token")
    assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED
    other = _open_stream(r1.port, "gw-b", token_a)
    assert other.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "gw-a" in other.details() and "gw-b" in other.details()
    served = _open_stream(r1.port, "gw-a", token_a)
    assert served.type_url == CLUSTER_TYPE  # the unconfigured clusters: none
    # A new token replaces the old one.
    gateway_token_issue(gateway="gw-a")
    assert _open_stream(r1.port, "gw-a", token_a).code() == grpc.StatusCode.UNAUTHENTICATED
    # Nothing of the refused streams was recorded.
    assert not XdsEnvoy.objects.filter(gateway="gw-b").exists()
    # The port is taken: a second server on it says so.
    with pytest.raises(CommandError, match=f"cannot serve xDS on 127.0.0.1:{r1.port}"):
        call_command("xds_serve", "--port", str(r1.port))


def test_xds_token_issues_for_envoy_xds_gateways_only(
        capsys: pytest.CaptureFixture[str]) -> None:
    Gateway.objects.create(name="gw-x", kind="envoy-xds", admin_address="http://127.0.0.1:1")
    Gateway.objects.create(name="gw-f", kind="envoy", admin_address="http://127.0.0.1:2")
    with pytest.raises(CommandError, match="no gateway named 'nope'"):
        call_command("xds_token", "nope")
    with pytest.raises(CommandError, match="of kind 'envoy'; xDS tokens are for envoy-xds"):
        call_command("xds_token", "gw-f")
    assert not XdsGateway.objects.exists()
    call_command("xds_token", "gw-x")
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("fxds_")
    row = XdsGateway.objects.get(name="gw-x")
    assert row.token_sha256 and secret not in row.token_sha256
    with pytest.raises(CommandError, match="--port 70000 is not a port number"):
        call_command("xds_serve", "--port", "70000")


def test_the_default_store_is_the_shared_one() -> None:
    set_default_store(None)
    assert isinstance(default_store(), SharedStore)


def test_a_replica_that_missed_a_wake_up_serves_the_push_after_its_re_read(
        sims: SimProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A push whose Redis wake-up the replica never hears (published on a channel it does not
    listen to, as a lost message would be) still reaches the Envoy: the replica re-reads the
    newest snapshot numbers every 2 s (`xds_serve --poll-s`), and the push is verified by
    the Envoy's ACK."""
    replica = Replica("r-deaf", tmp_path)
    token = gateway_token_issue(gateway="gw-deaf")
    envoy = EnvoyProcess(tmp_path / "e1", free_port(), free_port(),
                         xds=XdsSource("127.0.0.1", replica.port, "gw-deaf", "e1",
                                       token=token))
    store = SharedStore()  # this process pushes; it serves no xDS
    try:
        envoy.start(timeout_s=60)
        adapter = EnvoyXdsAdapter(GatewaySpec("gw-deaf", "envoy-xds", envoy.admin_url,
                                              {"ack_timeout_s": 20}), store=store)
        wait_until(lambda: any(e.connected for e in store.envoys("gw-deaf")),
                   what="the Envoy to connect", explain=replica.log.read_text)
        targets = pools(sims, "pa", "pb")
        adapter.apply(state(targets, route("chat", {"pa": 10000, "pb": 0})))
        assert ask(sims, envoy) == "pa"
        heard = redis_client().pubsub(ignore_subscribe_messages=True)
        heard.subscribe(shared.SNAPSHOT_CHANNEL + "gw-deaf")
        monkeypatch.setattr(shared, "SNAPSHOT_CHANNEL", "fleetctl:xds:nobody-listens:")
        result = adapter.apply(state(targets, route("chat", {"pa": 0, "pb": 10000},
                                                    revision=2)))
        assert "ACKed by 1 Envoy(s)" in result.detail, result.detail
        assert heard.get_message(timeout=0) is None, "the replica's channel got a wake-up"
        heard.close()
        assert ask(sims, envoy) == "pb"
        assert "xDS (ADS) serving on" in replica.log.read_text()
    finally:
        envoy.stop()
        replica.stop()
        store.stop()
