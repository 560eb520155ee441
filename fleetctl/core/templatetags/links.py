"""`{{ value|safe_url }}`: the URL if it may be a link (fleetctl/core/links.py), else ""."""

from __future__ import annotations

from django import template

from fleetctl.core.links import is_safe_link

register = template.Library()


@register.filter
def safe_url(value: object) -> str:
    # Checked again when rendered: rows written before the validator existed (or by a path
    # that skipped it) must not become a script link either.
    url = str(value) if value is not None else ""
    return url if is_safe_link(url) else ""
