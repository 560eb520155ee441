"""Masking what must not be kept from a shadow pair's prompt and answers (content "redacted").

A run whose content policy is "redacted" stores the prompt and the three answers so people
can read why the candidate diverged, but with the things that identify a person or unlock an
account replaced by a label: e-mail addresses, phone numbers, card-like digit runs, IPv4
addresses and API-key-like tokens (sk-..., bearer tokens, long hex or base64 strings). It is a
best effort on the shapes that leak most often, not a guarantee; a run that must keep no text
at all uses content "off".

Order matters: keys and e-mails first (they contain digits a phone or card pattern would
otherwise half-eat), then cards before phones (a 16-digit card would read as a phone).
"""

from __future__ import annotations

import re
from typing import Any

# (label, pattern): each match is replaced by «label».
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("key", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}")),
    ("key", re.compile(r"\b(?:sk|pk|rk|ak)-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_]{12,}\b")),
    ("key", re.compile(r"\b(?:ghp|gho|ghs|xox[abprs]|AKIA)[-_]?[A-Za-z0-9_-]{12,}\b")),
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
    ("ip", re.compile(r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b")),
    ("key", re.compile(r"\b[0-9a-fA-F]{32,}\b")),
    # Long base64-ish runs: at least 32 characters mixing letters and digits.
    ("key", re.compile(r"(?<![A-Za-z0-9+/])(?=[A-Za-z0-9+/_-]*\d)(?=[A-Za-z0-9+/_-]*[A-Za-z])"
                       r"[A-Za-z0-9+/_-]{32,}={0,2}")),
    ("card", re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")),
    ("phone", re.compile(r"(?<![\w+(.])(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)[ .-]?|\d{2,4})"
                         r"(?:[ .-]?\d{2,4}){1,4}(?!\w|\.\d)")),
)


# A phone number has at least this many digits: shorter runs are dates, counts, versions.
PHONE_MIN_DIGITS = 7
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _phone(match: re.Match[str]) -> str:
    found = match.group(0)
    if sum(c.isdigit() for c in found) < PHONE_MIN_DIGITS or _DATE.fullmatch(found):
        return found
    return "«phone»"


def redact(text: str) -> str:
    """The text with every match of PATTERNS replaced by «label»."""
    for label, pattern in PATTERNS:
        text = pattern.sub(_phone if label == "phone" else f"«{label}»", text)
    return text


def redact_value(value: Any) -> Any:
    """`redact` applied to every string inside a JSON value (messages, tool calls)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_value(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    return value
