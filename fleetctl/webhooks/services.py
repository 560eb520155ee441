"""Outgoing webhooks: who is told what, and each attempt to tell them.

`notify` is called by the code that decides something (the health policy, the push engine,
the plans, the ramps) inside its own transaction: the Delivery rows commit or roll back with
the decision they report, and the delivery task is queued only once they exist for the
worker to read. A receiver that is down never slows or fails the decision: delivery is a
task, retried with backoff, every attempt a row.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.audit.services import audit_record, audit_refused, refusals_audited, snapshot
from fleetctl.core.destinations import (
    WEBHOOKS,
    DestinationRefused,
    destination_request,
    url_problem,
)
from fleetctl.core.errors import ConflictError
from fleetctl.core.http import (
    OutboundCertificateError,
    OutboundError,
    OutboundTimeout,
    OutboundUnreachable,
)
from fleetctl.webhooks.models import EVENTS, Attempt, Delivery, Webhook, url_masked

if TYPE_CHECKING:
    from fleetctl.accounts.actor import Actor

log = logging.getLogger(__name__)

# Seconds before attempt 2, 3, ... after a 5xx, a 408/429 or no answer; after the last, the
# delivery is failed. Six attempts over about 43 minutes ride out a receiver's restart or a
# short outage without piling up work for one that is gone.
RETRY_DELAYS_S = (5, 30, 120, 600, 1800)
TIMEOUT_S = 5.0
# Kept on each Attempt row: enough to see what the receiver said.
EXCERPT_CHARS = 500
# 4xx answers that mean "later", not "never".
RETRYABLE_4XX = frozenset({408, 429})
# Fields an audit event shows; the secret only as whether one is set, the URL masked.
AUDITED = ["name", "events", "format", "active", "trusted"]


# --- sending -------------------------------------------------------------------------------

def notify(event: str, payload: dict[str, Any], *, text: str) -> list[int]:
    """A Delivery for every active webhook subscribed to `event` (or to every event); the
    delivery task is queued after the caller's transaction commits. Returns the delivery
    ids. An unknown event name is a programming error (ValueError); a receiver's trouble
    never reaches the caller."""
    if event not in EVENTS:
        raise ValueError(f"unknown webhook event {event!r}; known: {', '.join(sorted(EVENTS))}")
    now = timezone.now()
    body = {"text": text[:2000], "data": payload}
    ids = []
    for hook in Webhook.objects.filter(active=True).only("pk", "events"):
        if hook.events and event not in hook.events:
            continue
        ids.append(Delivery.objects.create(webhook=hook, event=event, payload=body,
                                           created_at=now, next_attempt_at=now).pk)
    if ids:
        transaction.on_commit(lambda: _queue(ids))
    return ids


def _queue(ids: list[int]) -> None:
    from fleetctl.webhooks.tasks import deliver

    for delivery_id in ids:
        try:
            deliver.delay(delivery_id)
        except Exception:  # a broker hiccup must not fail the decision made
            log.exception("could not queue webhook delivery %s", delivery_id)


def body_for(delivery: Delivery) -> dict[str, Any]:
    """What the receiver is sent, by the webhook's format."""
    text = str(delivery.payload.get("text", ""))
    data = delivery.payload.get("data", {})
    if delivery.webhook.format == Webhook.Format.SLACK:
        return {"text": text, "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": (
                f"fleetctl · {delivery.event} · delivery {delivery.pk}")}]},
        ]}
    return {"event": delivery.event, "at": delivery.created_at.isoformat(),
            "delivery": delivery.pk, "data": data}


def signature(secret: str, body: bytes) -> str:
    """The X-Fleetctl-Signature header's value: HMAC-SHA256 of the exact body sent."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def delivery_attempt(*, delivery_id: int) -> str:
    """One attempt. 2xx: delivered. 4xx other than 408/429: failed at once (the receiver
    refuses it; sending it again changes nothing). 5xx, 408/429 or no answer: retrying, the
    next attempt due after RETRY_DELAYS_S, failed once they are spent. A receiver fleetctl
    may not reach (core.destinations: loopback, metadata, its own services...) or a webhook
    paused meanwhile: failed at once, nothing sent. Every attempt is an Attempt row. Returns
    the delivery's status; a delivery already settled is left alone (a task run twice sends
    once more at most, never after success)."""
    with transaction.atomic():
        delivery = (Delivery.objects.select_for_update(skip_locked=True)
                    .select_related("webhook").filter(pk=delivery_id).first())
        if delivery is None:
            return "missing-or-busy"
        if delivery.status in (Delivery.Status.DELIVERED, Delivery.Status.FAILED):
            return str(delivery.status)
        number = delivery.attempts + 1
        hook = delivery.webhook
        at = timezone.now()
        # Under the row lock: a second run of the task for this delivery skips it meanwhile.
        code, duration, excerpt, error, refused = _send(hook, delivery)
        if refused:
            status, retry = Delivery.Status.FAILED, None
        elif code is not None and 200 <= code < 300:
            status, retry = Delivery.Status.DELIVERED, None
        elif code is not None and 400 <= code < 500 and code not in RETRYABLE_4XX:
            status, retry = Delivery.Status.FAILED, None
            error = f"{hook.url_shown} answered HTTP {code}: refused, not retried"
        else:
            if code is not None:
                error = f"{hook.url_shown} answered HTTP {code}"
            spent = number > len(RETRY_DELAYS_S)
            status = Delivery.Status.FAILED if spent else Delivery.Status.RETRYING
            retry = None if spent else RETRY_DELAYS_S[number - 1]
            if spent:
                error += f" (gave up after {number} attempts)"
        Attempt.objects.create(delivery=delivery, number=number, at=at, status_code=code,
                               error=error, duration_ms=duration, response_excerpt=excerpt)
        delivery.attempts = number
        delivery.status = status
        delivery.last_error = error
        delivery.delivered_at = timezone.now() if status == Delivery.Status.DELIVERED else None
        delivery.next_attempt_at = at + timedelta(seconds=retry) if retry is not None else None
        delivery.save(update_fields=["attempts", "status", "last_error", "delivered_at",
                                     "next_attempt_at"])
        if retry is not None:
            transaction.on_commit(lambda: _queue_retry(delivery_id, retry))
    return str(status)


def _send(hook: Webhook, delivery: Delivery
          ) -> tuple[int | None, float | None, str, str, bool]:
    """POST the delivery: (status code, ms, excerpt kept, error, refused without sending).
    Errors name the receiver by scheme and host only (its path may be a secret) and never
    carry what an unreachable address said; the excerpt is the receiver's answer for a
    trusted webhook, its status line otherwise."""
    if not hook.active:
        return None, None, "", f"webhook {hook.name} is paused: not sent", True
    body = json.dumps(body_for(delivery), separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "fleetctl-webhooks",
               "X-Fleetctl-Event": delivery.event, "X-Fleetctl-Delivery": str(delivery.pk)}
    if hook.secret:
        headers["X-Fleetctl-Signature"] = signature(hook.secret, body)
    try:
        answer = destination_request("POST", hook.url, purpose=WEBHOOKS, content=body,
                                     headers=headers, timeout_s=TIMEOUT_S,
                                     max_body=EXCERPT_CHARS * 4 if hook.trusted else 0)
    except DestinationRefused as exc:
        return None, None, "", f"not sent: {exc}", True
    except OutboundError as exc:
        return None, None, "", f"{hook.url_shown}: {_failure(exc)}", False
    if hook.trusted:
        excerpt = answer.text[:EXCERPT_CHARS]
    else:
        excerpt = f"HTTP {answer.status_code} {answer.reason}"[:100]
    return answer.status_code, answer.latency_ms, excerpt, "", False


def _failure(exc: OutboundError) -> str:
    """What went wrong, in words that say nothing the receiver's host said."""
    if isinstance(exc, OutboundTimeout):
        return f"no answer within {TIMEOUT_S:g} s"
    if isinstance(exc, OutboundCertificateError):
        return "its TLS certificate did not verify"
    if isinstance(exc, OutboundUnreachable):
        return "could not connect"
    return "the connection failed before an answer"


def _queue_retry(delivery_id: int, countdown: float) -> None:
    from fleetctl.webhooks.tasks import deliver

    deliver.apply_async((delivery_id,), countdown=countdown)


def deliveries_prune(*, older_than_days: int = 30) -> int:
    cutoff = timezone.now() - timedelta(days=older_than_days)
    deleted, _ = Delivery.objects.filter(created_at__lt=cutoff).delete()
    return deleted


# --- registry ------------------------------------------------------------------------------

def _check(hook: Webhook) -> None:
    problems: dict[str, list[str]] = {}
    parts = urlsplit(hook.url or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        problems["url"] = ["Give an http:// or https:// URL, e.g. "
                           "https://hooks.example.com/fleetctl."]

    if not isinstance(hook.events, list) or not all(isinstance(e, str) for e in hook.events):
        problems["events"] = ["A list of event names (empty: every event)."]
    else:
        unknown = sorted(set(hook.events) - set(EVENTS))
        if unknown:
            problems["events"] = [f"Unknown event(s): {', '.join(unknown)}. "
                                  f"Known: {', '.join(sorted(EVENTS))}."]
        hook.events = sorted(set(hook.events))
    if problems:
        raise ValidationError(problems)
    # `events` is checked above (an empty list, every event, is what model validation would
    # call blank).
    hook.full_clean(exclude=["events"])


def _picture(hook: Webhook) -> dict[str, Any]:
    """What the audit log keeps: the URL masked like for readers, with a fingerprint so an
    auditor sees that it changed (the audit log is readable by every role)."""
    digest = hashlib.sha256(hook.url.encode()).hexdigest()[:12]
    return {**snapshot(hook, AUDITED), "url": f"{url_masked(hook.url)} (sha256 {digest})",
            "has_secret": bool(hook.secret)}


def _refuse_destination(actor: Actor, action: str, target: object, url: str) -> None:
    """400 (audited: pointing a webhook at fleetctl's own host is worth an auditor's eye)
    when the URL reaches what a webhook may not: core.destinations says what and why."""
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return  # _check names the problem with the other fields'
    why = url_problem(url, purpose=WEBHOOKS)
    if why is not None:
        audit_refused(actor=actor, action=action, target=target,
                      message=f"URL refused: {why.replace(url, url_masked(url))}")
        raise ValidationError({"url": [f"{why}."]})


def _require_trust(actor: Actor, hook: Webhook | str) -> None:
    """Only an administrator marks a receiver trusted (its answers kept for readers)."""
    actor.require(roles.ADMIN_MANAGE, action="webhook.trust", target=hook)


def webhook_create(*, actor: Actor, name: str, url: str, events: list[str] | None = None,
                   format: str = Webhook.Format.JSON, secret: str = "",
                   active: bool = True, trusted: bool = False) -> Webhook:
    actor.require(roles.FLEET_MANAGE, action="webhook.create", target="webhooks.webhook")
    if trusted:
        _require_trust(actor, "webhooks.webhook")
    _refuse_destination(actor, "webhook.create", "webhooks.webhook", url)
    hook = Webhook(name=name, url=url, events=list(events or []), format=format,
                   secret=secret, active=active, trusted=trusted, created_by=actor.label)
    _check(hook)
    with transaction.atomic():
        hook.save()
        # The secret never goes in the audit log: only whether there is one.
        audit_record(actor=actor, action="webhook.create", target=hook, after=_picture(hook))
    return hook


def webhook_update(*, actor: Actor, webhook: Webhook, **changes: Any) -> Webhook:
    """Change any of name, url, events, format, active, secret (a new secret replaces the
    old one; an empty string removes it) and, for an administrator, trusted. A new URL set
    by anyone else is not trusted until an administrator says so."""
    actor.require(roles.FLEET_MANAGE, action="webhook.update", target=webhook)
    unknown = sorted(set(changes) - {"url", "events", "format", "active", "secret", "name",
                                     "trusted"})
    if unknown:
        raise ValidationError({name: ["This field cannot be changed here."] for name in unknown})
    if "trusted" in changes and bool(changes["trusted"]) != webhook.trusted:
        _require_trust(actor, webhook)
    if isinstance(changes.get("url"), str) and changes["url"] != webhook.url:
        _refuse_destination(actor, "webhook.update", webhook, changes["url"])
    with transaction.atomic():
        locked = Webhook.objects.select_for_update().get(pk=webhook.pk)
        before = _picture(locked)
        old_secret = locked.secret
        if changes.get("url", locked.url) != locked.url and not actor.can(roles.ADMIN_MANAGE):
            changes["trusted"] = False
        for field, value in changes.items():
            setattr(locked, field, list(value) if field == "events" else value)
        _check(locked)
        locked.save()
        after = _picture(locked)
        changed = {k for k in after if before[k] != after[k]}
        if locked.secret != old_secret:
            changed.add("secret")
            before["secret"], after["secret"] = "(hidden)", "(changed)"
        if changed:
            audit_record(actor=actor, action="webhook.update", target=locked,
                         before={k: before[k] for k in sorted(changed)},
                         after={k: after[k] for k in sorted(changed)})
    return locked


def webhook_delete(*, actor: Actor, webhook: Webhook) -> None:
    actor.require(roles.FLEET_MANAGE, action="webhook.delete", target=webhook)
    with transaction.atomic():
        deliveries = webhook.deliveries.count()
        audit_record(actor=actor, action="webhook.delete", target=webhook,
                     before=_picture(webhook),
                     message=f"Webhook {webhook.name} deleted with its {deliveries} "
                             f"delivery record(s)")
        webhook.delete()


def webhook_test(*, actor: Actor, webhook: Webhook) -> Delivery:
    """Send `webhook.test` to this one webhook (whatever it subscribes to), now."""
    actor.require(roles.FLEET_MANAGE, action="webhook.test", target=webhook)
    text = f"fleetctl test delivery to webhook {webhook.name}, sent by {actor.label}"
    with refusals_audited(actor=actor, action="webhook.test", target=webhook), \
            transaction.atomic():
        if not Webhook.objects.select_for_update().get(pk=webhook.pk).active:
            raise ConflictError(f"Webhook {webhook.name} is paused: nothing is sent to it, "
                                f"tests included. Make it active first.")
        delivery = Delivery.objects.create(
            webhook=webhook, event="webhook.test", next_attempt_at=timezone.now(),
            payload={"text": text, "data": {"webhook": webhook.name, "by": actor.label}})
        audit_record(actor=actor, action="webhook.test", target=webhook,
                     message=f"delivery {delivery.pk}")
        transaction.on_commit(lambda: _queue([delivery.pk]))
    return delivery
