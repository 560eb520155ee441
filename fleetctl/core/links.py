"""Which stored URLs may become a link on a page.

A URL that someone stored and a person later clicks is a way to run script in that person's
session (`javascript:`, `data:`), or to send them somewhere they did not expect
(`//elsewhere`). So a link is either an absolute http(s) URL with a host, or a path on this
site. The validator refuses anything else when it is written; the `safe_url` template filter
(templatetags/links.py) applies the same test when it is rendered, so rows stored before the
validator existed cannot run either.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

# Browsers drop tabs and newlines inside a URL ("java\tscript:") and read a backslash as a
# slash ("/\\host" is "//host"), so neither is allowed anywhere in a link.
_FORBIDDEN_CHARACTERS = frozenset("\\") | {chr(code) for code in range(0x21)} | {"\x7f"}


def is_safe_link(url: str) -> bool:
    """True for `https://host/…`, `http://host/…` and `/path…` (not `//host`)."""
    if not url or any(character in _FORBIDDEN_CHARACTERS for character in url):
        return False
    if url.startswith("/"):
        return not url.startswith("//")
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced "[" in the host
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)


def validate_link_url(value: str) -> None:
    if not is_safe_link(value):
        raise ValidationError(
            f"{value[:80]!r} is not a link fleetctl will show: give an http:// or https:// URL "
            "with a host, or a path on this site starting with a single /.",
            code="unsafe_url",
        )
