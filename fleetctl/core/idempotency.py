"""`Idempotency-Key` for POSTs that change traffic: a client that lost the answer to a drain
or a split change (a timeout, a dropped connection) sends the same request again with the
same key and gets the first answer back instead of a second change.

The key is claimed with an INSERT before the view runs (a unique constraint on caller and
key), so of two requests with one key exactly one runs: the other waits for the claim's
commit at the index and then sees it. What the first one answered is kept:

* 2xx and 4xx answers are stored; a retry gets the same status and body, with the header
  `Idempotent-Replayed: true`. A refusal stays a refusal: resending cannot turn it into a
  change the caller did not see. It is still an attempt: what apps above core keep beside an
  answer and do when it is given again is theirs (`witness_register`); the audit log
  records each replayed refusal again, marked as a replay.
* A 5xx, or an exception, is not stored: the claim is released, so a retry runs again.
* The same key with another method, path or body: 422 (a client bug, or a key reused).
* The same key while the first request still runs: 409, retry shortly.

Keys are kept IDEMPOTENCY_TTL_HOURS (the beat task `core.idempotency_prune` deletes older
ones); a key older than that is treated as new.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http.request import RawPostDataException
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from fleetctl.core.models import IdempotentRequest

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255

PARAMETER = OpenApiParameter(
    HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    pattern=r"^[\x20-\x7e]{1,255}$",
    description=(
        "Any string you choose per change (1–255 printable ASCII characters, e.g. a UUID). "
        "Send the same request again with the same key and you get the first answer back, "
        f"with `{REPLAYED_HEADER}: true`, instead of a second change. The same key with "
        "another body: 422. While the first request is still running: 409, retry shortly. "
        "An answer of 5xx is not kept (a retry runs again). Keys are kept "
        "IDEMPOTENCY_TTL_HOURS (default 24 h)."),
)


@dataclass(frozen=True)
class Witness:
    """What an app above core does about an answer given again without running its view.
    `keep(request, since)`: after the first run, what to keep beside the answer (JSON, or
    None for nothing); `since` is when the request claimed its key. `replayed(request, kept,
    key)`: each time the stored answer is given again."""

    keep: Callable[[Request, datetime], Any]
    replayed: Callable[[Request, Any, str], None]


# By name; registered in the apps' ready() (core imports no app).
WITNESSES: dict[str, Witness] = {}


def witness_register(name: str, *, keep: Callable[[Request, datetime], Any],
                     replayed: Callable[[Request, Any, str], None]) -> None:
    WITNESSES[name] = Witness(keep=keep, replayed=replayed)


class KeyInUse(exceptions.APIException):
    status_code = 409
    default_code = "in_progress"
    default_detail = ("A request with this Idempotency-Key is still in progress; retry "
                      "shortly to get its answer.")


class KeyReused(exceptions.APIException):
    status_code = 422
    default_code = "idempotency_key_reused"


def _principal(request: Request) -> str | None:
    """Whom a key belongs to: the token (personal or service), else the signed-in user.
    Keys of different callers never meet."""
    token = getattr(request, "auth", None)
    if token is not None and getattr(token, "pk", None) is not None:
        return f"token:{token.pk}"
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False) and user.pk is not None:
        return f"user:{user.pk}"
    return None


def _check_key(key: str) -> None:
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        raise exceptions.ValidationError({HEADER: [
            f"An {HEADER} is 1–{MAX_KEY_LENGTH} printable ASCII characters (a UUID is a good "
            f"one); this one is {len(key)} character(s)"
            + ("" if key.isascii() and key.isprintable() else " and not printable ASCII")
            + "."]})


def _fingerprint(request: Request) -> str:
    """The request a key stands for: method, path with its query, and the body's bytes."""
    digest = hashlib.sha256()
    digest.update(f"{request.method} {request.get_full_path()}\n".encode())
    try:
        digest.update(request._request.body)
    except RawPostDataException:  # already parsed: its data stands for the body
        digest.update(json.dumps(request.data, cls=JSONEncoder, sort_keys=True).encode())
    return digest.hexdigest()


def _claim(*, principal: str, key: str, request: Request, sha256: str
           ) -> IdempotentRequest | Response:
    """The claim on the key (a new row), or the answer a retry gets (stored or refused)."""
    path = request.get_full_path()[:500]
    fields = {"principal": principal, "key": key, "method": request.method, "path": path,
              "request_sha256": sha256}
    for _ in range(2):
        try:
            with transaction.atomic():
                return IdempotentRequest.objects.create(**fields)
        except IntegrityError:
            pass
        earlier = IdempotentRequest.objects.filter(principal=principal, key=key).first()
        if earlier is None:  # released meanwhile (its request failed): claim it now
            continue
        expired = timezone.now() - timedelta(hours=settings.IDEMPOTENCY_TTL_HOURS)
        if earlier.created_at < expired:  # kept past its time, not yet pruned: a new key
            IdempotentRequest.objects.filter(pk=earlier.pk).delete()
            continue
        if (earlier.method, earlier.path, earlier.request_sha256) != (
                request.method, path, sha256):
            raise KeyReused(
                f"This {HEADER} was used at {earlier.created_at:%Y-%m-%d %H:%M:%S} UTC for "
                f"another request ({earlier.method} {earlier.path}, or another body). Use a "
                f"new key for a new request.")
        if earlier.state == IdempotentRequest.State.RUNNING:
            raise KeyInUse()
        return _replay(request, earlier, key=key)
    raise KeyInUse()


def _replay(request: Request, earlier: IdempotentRequest, *, key: str) -> Response:
    answer, kept = _unpacked(earlier.response)
    for name, value in kept.items():
        if name in WITNESSES:
            WITNESSES[name].replayed(request, value, key)
    return Response(answer, status=earlier.status_code, headers={REPLAYED_HEADER: "true"})


# Rows keep {KEPT: 1, "answer": <data>, "witnessed": {name: kept}}; a row stored before
# witnesses existed holds the answer's data alone.
KEPT = "fleetctl_idempotent_answer"


def _stored(data: Any, *, request: Request, since: datetime) -> Any:
    """The answer's data as JSON would render it (dates as strings), to keep and replay,
    with what each witness keeps beside it."""
    witnessed = {name: value for name, witness in WITNESSES.items()
                 if (value := witness.keep(request, since)) is not None}
    return json.loads(json.dumps({KEPT: 1, "answer": data, "witnessed": witnessed},
                                 cls=JSONEncoder))


def _unpacked(stored: Any) -> tuple[Any, dict[str, Any]]:
    if isinstance(stored, dict) and stored.get(KEPT) == 1:
        return stored.get("answer"), dict(stored.get("witnessed") or {})
    return stored, {}


def idempotent(view: Callable[..., Response]) -> Callable[..., Response]:
    """Decorate a DRF view method (a viewset action or `post`): with an Idempotency-Key
    header its POSTs run once per key; without one, nothing changes. Only POST is keyed (an
    action that also answers GET is read as usual)."""

    @functools.wraps(view)
    def wrapper(self: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get(HEADER)
        principal = _principal(request)
        if key is None or request.method != "POST" or principal is None:
            return view(self, request, *args, **kwargs)
        _check_key(key)
        claim = _claim(principal=principal, key=key, request=request,
                       sha256=_fingerprint(request))
        if isinstance(claim, Response):
            return claim
        try:
            try:
                response = view(self, request, *args, **kwargs)
            except Exception as exc:
                # The answer the caller will get for this exception (the API's handler);
                # one it does not handle is a 500 and is raised on, unstored.
                response = self.handle_exception(exc)
        except BaseException:
            IdempotentRequest.objects.filter(pk=claim.pk).delete()
            raise
        if transaction.get_connection().in_atomic_block and transaction.get_rollback():
            # The answer rolled the request's transaction back (a value the database refused,
            # e.g. a NUL character): the claim goes with it, and nothing can be stored.
            return response
        if response.status_code >= 500:
            IdempotentRequest.objects.filter(pk=claim.pk).delete()
            return response
        IdempotentRequest.objects.filter(pk=claim.pk).update(
            state=IdempotentRequest.State.DONE, status_code=response.status_code,
            response=_stored(response.data, request=request, since=claim.created_at),
            finished_at=timezone.now())
        return response

    return wrapper


def idempotency_prune(*, now: Any = None) -> int:
    """Delete keys older than IDEMPOTENCY_TTL_HOURS; returns how many."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.IDEMPOTENCY_TTL_HOURS)
    deleted, _ = IdempotentRequest.objects.filter(created_at__lt=cutoff).delete()
    return deleted


def object_action(*, request: Any, response: Any) -> Callable[[Callable[..., Response]], Any]:
    """A POST action on one object of a viewset (`/<id>/<name>/`) that a client may retry:
    `Idempotency-Key` honoured and documented, `request` its body's serializer, `response`
    the object's serializer answered with 200. The one declaration of such an action."""
    def declare(method: Callable[..., Response]) -> Any:
        schema = extend_schema(request=request, parameters=[PARAMETER],
                               responses={200: response})
        return schema(action(detail=True, methods=["post"])(idempotent(method)))
    return declare


def action_body(request: Request, serializer_class: Callable[..., Any],
                **options: Any) -> dict[str, Any]:
    """The validated body of an API write (an object action, a create, an update):
    `serializer_class` over the request's data (`options`, e.g. `partial=True`, passed on);
    a body that does not validate is the API's 400 naming its fields."""
    body = serializer_class(data=request.data, **options)
    body.is_valid(raise_exception=True)
    return body.validated_data  # type: ignore[no-any-return]
