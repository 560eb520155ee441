"""Redaction (content "redacted"): what is masked, and what ordinary text keeps."""

from __future__ import annotations

import pytest

from fleetctl.shadow.redact import redact, redact_value

MASKED = [
    ("write to bob.smith+news@example.co.uk today", "write to «email» today"),
    ("mail ADA@Lovelace.org.", "mail «email»."),
    ("call +1 415-555-0100 now", "call «phone» now"),
    ("office (020) 7946 0958", "office «phone»"),
    ("mobile 0612345678.", "mobile «phone»."),
    ("call 555-0100", "call «phone»"),
    ("card 4111 1111 1111 1111 expires", "card «card» expires"),
    ("card 4111-1111-1111-1111", "card «card»"),
    ("card 5500000000000004", "card «card»"),
    ("from 192.168.1.20 to 10.0.0.1", "from «ip» to «ip»"),
    ("key sk-proj-abcdefghijklmnop1234 here", "key «key» here"),
    ("OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwx", "OPENAI_API_KEY=«key»"),
    ("Authorization: Bearer eyJhbGciOi.JIUzI1NiJ9.abc", "Authorization: «key»"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123", "token «key»"),
    ("aws AKIAIOSFODNN7EXAMPLE1", "aws «key»"),
    ("sha 0123456789abcdef0123456789abcdef01 end", "sha «key» end"),
    ("blob QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0123456789== end", "blob «key» end"),
]

KEPT = [
    "In 2024 there were 12 apples and 3.5 pears, version 1.2.3.",
    "the years 1999 and 2000, on 2024-01-15 at 10:30",
    "order 12 34 56",
    "pi is 3.14159265358",
    "a list: 1, 2, 3, 4, 5",
    "the quick brown fox jumps over the lazy dog",
    "ResponseFormatJsonSchemaValidator",  # a long identifier is not a key
]


@pytest.mark.parametrize(("text", "expected"), MASKED)
def test_identifying_and_secret_shapes_are_masked(text: str, expected: str):
    assert redact(text) == expected


@pytest.mark.parametrize("text", KEPT)
def test_ordinary_text_is_kept(text: str):
    assert redact(text) == text


def test_every_string_inside_a_json_value_is_redacted():
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "I am ada@example.com"}]},
                {"role": "tool", "content": None, "n": 3}]
    assert redact_value(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "I am «email»"}]},
        {"role": "tool", "content": None, "n": 3}]
