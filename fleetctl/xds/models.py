"""What every xDS replica shares (docs/xds.md "Several replicas"): each gateway's snapshots
and token, the replicas alive, and what each Envoy was sent, ACKed and NACKed per type.

Gateways are named as Envoys name them (`node.cluster`, the traffic Gateway's name): the
rows are keyed by that name, as the Envoys' streams are."""

from __future__ import annotations

from django.db import models


class XdsGateway(models.Model):
    """A gateway's snapshot counter and its token (only a SHA-256 of the secret is kept;
    the secret is shown once, when issued)."""

    name = models.CharField(max_length=200, unique=True)
    number = models.PositiveIntegerField(default=0)  # the last snapshot number given
    token_sha256 = models.CharField(max_length=64, blank=True, default="", db_index=True)
    token_issued_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class XdsSnapshot(models.Model):
    """One numbered snapshot: the rendered discovery documents (JSON text per type URL, as
    the Envoy kind's file mode writes them), their versions, and what it means (meta)."""

    gateway = models.CharField(max_length=200)
    number = models.PositiveIntegerField()
    documents = models.JSONField()  # type URL -> the DiscoveryResponse document (JSON text)
    versions = models.JSONField()  # type URL -> version_info
    meta = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gateway", "number"],
                                               name="xds_snapshot_gateway_number")]

    def __str__(self) -> str:
        return f"{self.gateway} #{self.number}"


class XdsReplica(models.Model):
    """An xDS server process; an Envoy on a replica whose heartbeat stopped is gone."""

    name = models.CharField(max_length=200, unique=True)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.name


class XdsEnvoy(models.Model):
    """One Envoy (node.id) of a gateway: its live (or last) stream, on which replica."""

    gateway = models.CharField(max_length=200)
    node_id = models.CharField(max_length=200)
    replica = models.CharField(max_length=200)
    stream = models.PositiveIntegerField()  # the replica's number for the stream
    # Where fleetctl reads this Envoy's admin API (in-flight requests, counters): its node
    # metadata `fleetctl_admin_url`; "" when its bootstrap gave none
    admin_url = models.CharField(max_length=300, blank=True, default="")
    connected_at = models.DateTimeField()
    gone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gateway", "node_id"],
                                               name="xds_envoy_gateway_node")]

    def __str__(self) -> str:
        return f"{self.gateway}/{self.node_id}"


class XdsTypeAck(models.Model):
    """One Envoy, one resource type: the version (and snapshot number) last sent, ACKed and
    NACKed on its live stream, and the last NACK's message."""

    envoy = models.ForeignKey(XdsEnvoy, on_delete=models.CASCADE, related_name="acks")
    type_url = models.CharField(max_length=200)
    sent_version = models.CharField(max_length=100, blank=True, default="")
    sent_number = models.IntegerField(default=-1)
    acked_version = models.CharField(max_length=100, blank=True, default="")
    acked_number = models.IntegerField(default=-1)
    nacked_version = models.CharField(max_length=100, blank=True, default="")
    nacked_number = models.IntegerField(default=-1)
    error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["envoy", "type_url"],
                                               name="xds_typeack_envoy_type")]

    def __str__(self) -> str:
        return f"{self.envoy} {self.type_url}"
