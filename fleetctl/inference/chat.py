"""A stored prompt as a person reads it on a page: shadow pairs and eval items show theirs."""

from __future__ import annotations

import json
from typing import Any


def prompt_text(prompt: Any) -> str:
    """A chat request's messages one per line as "role: text" (structured parts as JSON), a
    completion prompt as it is; nothing for None."""
    if prompt is None or isinstance(prompt, str):
        return prompt or ""
    if not isinstance(prompt, list):
        return json.dumps(prompt, ensure_ascii=False)
    lines = []
    for message in prompt:
        if isinstance(message, dict):
            body = message.get("content")
            text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
            lines.append(f"{message.get('role', '?')}: {text}")
        else:
            lines.append(json.dumps(message, ensure_ascii=False))
    return "\n".join(lines)
