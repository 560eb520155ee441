"""`?wait=verified&timeout=<s>` on the writes that change traffic: the answer waits until
every gateway's push of the change is verified (read back from the gateway), or the timeout
passes, and says which gateways hold it. A script then needs no polling loop of its own.

The pushes are followed from their rows (the push engine writes them; its first attempts are
made by the worker for a revision, inline for a drain): short steps first (a gateway
verifies in tens of milliseconds), growing to a quarter second.
"""

from __future__ import annotations

import time
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers
from rest_framework.request import Request

from fleetctl.traffic.models import GatewayPush

DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 60.0
FIRST_STEP_S, LAST_STEP_S, GROWTH = 0.02, 0.25, 1.5
# The longest any answer waits, whatever was asked (a test with no worker lowers it).
CAP_S = MAX_TIMEOUT_S
# Pushes that will not change any more: verified (or settled by a newer push to the same
# gateway), refused for good, or their gateway deleted.
SETTLED = (GatewayPush.Status.VERIFIED, GatewayPush.Status.SUPERSEDED,
           GatewayPush.Status.FAILED, GatewayPush.Status.ABANDONED)
HELD = (GatewayPush.Status.VERIFIED, GatewayPush.Status.SUPERSEDED)

PARAMETERS = [
    OpenApiParameter(
        "wait", OpenApiTypes.STR, OpenApiParameter.QUERY, required=False, enum=["verified"],
        description="`verified`: answer once every gateway verified the change (or the "
                    "timeout passed), with `verified` and each gateway's push status."),
    OpenApiParameter(
        "timeout", OpenApiTypes.NUMBER, OpenApiParameter.QUERY, required=False,
        description=f"With wait=verified: seconds to wait at most (default "
                    f"{DEFAULT_TIMEOUT_S:g}, 0 to {MAX_TIMEOUT_S:g})."),
]


class _WaitQuery(serializers.Serializer):
    wait = serializers.ChoiceField(choices=["verified"], required=False)
    timeout = serializers.FloatField(required=False, min_value=0, max_value=MAX_TIMEOUT_S)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "timeout" in attrs and "wait" not in attrs:
            raise serializers.ValidationError(
                {"timeout": ["A timeout applies to wait=verified; add it, or drop timeout."]})
        return attrs


def wait_timeout(request: Request) -> float | None:
    """The seconds to wait, or None without ?wait=. Bad values: 400, before anything runs."""
    query = _WaitQuery(data={k: request.query_params[k] for k in ("wait", "timeout")
                             if k in request.query_params})
    query.is_valid(raise_exception=True)
    if "wait" not in query.validated_data:
        return None
    return float(query.validated_data.get("timeout", DEFAULT_TIMEOUT_S))


def wait_for_pushes(push_ids: list[int], timeout_s: float) -> list[GatewayPush]:
    """Poll the pushes until every one is settled or `timeout_s` has passed; returns them as
    they then stand (ordered by gateway name)."""
    deadline = time.monotonic() + min(timeout_s, CAP_S)
    step = FIRST_STEP_S
    while True:
        pushes = list(GatewayPush.objects.select_related("gateway", "revision__route")
                      .filter(pk__in=push_ids))
        left = deadline - time.monotonic()
        if all(p.status in SETTLED for p in pushes) or left <= 0:
            return sorted(pushes, key=lambda p: (p.gateway_label, p.revision.route.name, p.pk))
        time.sleep(min(step, left))
        step = min(step * GROWTH, LAST_STEP_S)


def verified(pushes: list[GatewayPush]) -> bool:
    return all(p.status in HELD for p in pushes)


def gateway_rows(pushes: list[GatewayPush]) -> list[dict[str, Any]]:
    return [{"name": p.recorded_gateway_name, "status": p.status,
             "verified_at": p.verified_at, "attempts": p.attempts, "error": p.last_error}
            for p in pushes]


class WaitGatewaySerializer(serializers.Serializer):
    """One gateway's push of the change, after waiting."""

    name = serializers.CharField(help_text="The gateway (the name it had, if deleted since).")
    status = serializers.ChoiceField(choices=GatewayPush.Status.choices)
    verified_at = serializers.DateTimeField(allow_null=True)
    attempts = serializers.IntegerField()
    error = serializers.CharField(allow_blank=True, help_text="The last attempt's error.")
