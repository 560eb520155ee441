"""`POST /v1/embeddings` for a simulated pool: deterministic vectors from the input.

The request is OpenAI's: `model`, `input` (a string, an array of strings, an array of token
ids or an array of such arrays), optional `dimensions` (1 to 4,096; default 256, smaller than
a real model's so batch output files stay small) and `encoding_format` (`float` or
`base64`). Each input's vector is a function of (model, input, dimensions) only: unit length,
its components drawn from a generator seeded with a stable hash of the three, so two pools
serving one model answer the same input with the same vector, in any process. Usage counts
the inputs' tokens with the simulator's tokenizer (`prompt_tokens` = `total_tokens`).

Embeddings do not queue on the pool's engine (they generate no tokens): the answer waits
only for the pool's network latency, and faults (down, injected errors) apply as to any
request.
"""

from __future__ import annotations

import base64
import math
import random
import struct
from dataclasses import dataclass
from typing import Any

from .apierror import ApiError
from .textgen import count_tokens, stable_hash

DEFAULT_DIMENSIONS = 256
MAX_DIMENSIONS = 4096
MAX_INPUTS = 2048
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str, ...]  # token-id inputs as their ids joined by spaces
    token_counts: tuple[int, ...]
    dimensions: int
    encoding_format: str


def _bad(message: str, param: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _inputs(raw: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if raw is None:
        raise _bad("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    if isinstance(raw, str):
        items: list[Any] = [raw]
    elif _is_ids(raw):
        items = [raw]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise _bad("Invalid 'input': expected a non-empty string, an array of strings, an "
                   "array of token ids or an array of such arrays.", "input", "invalid_type")
    if len(items) > MAX_INPUTS:
        raise _bad(f"Invalid 'input': at most {MAX_INPUTS} inputs per request, got "
                   f"{len(items)}.", "input")
    texts: list[str] = []
    counts: list[int] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise _bad(f"Invalid 'input[{i}]': an empty string cannot be embedded.",
                           "input")
            texts.append(item)
            counts.append(count_tokens(item))
        elif _is_ids(item):
            texts.append(" ".join(str(t) for t in item))
            counts.append(len(item))
        else:
            raise _bad(f"Invalid 'input[{i}]': expected a non-empty string or an array of "
                       f"token ids.", "input", "invalid_type")
    return tuple(texts), tuple(counts)


def parse_embeddings(body: dict[str, Any]) -> EmbeddingRequest:
    model = body.get("model")
    if model is None:
        raise _bad("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise _bad("Invalid 'model': expected a non-empty string.", "model", "invalid_type")
    texts, counts = _inputs(body.get("input"))
    dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
    if dimensions is None:
        dimensions = DEFAULT_DIMENSIONS
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) \
            or not 1 <= dimensions <= MAX_DIMENSIONS:
        raise _bad(f"Invalid 'dimensions': expected an integer from 1 to {MAX_DIMENSIONS}, got "
                   f"{dimensions!r}.", "dimensions")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise _bad(f"Invalid 'encoding_format': expected 'float' or 'base64', got "
                   f"{encoding!r}.", "encoding_format")
    return EmbeddingRequest(model=model, inputs=texts, token_counts=counts,
                            dimensions=dimensions, encoding_format=encoding)


def vector(model: str, text: str, dimensions: int) -> list[float]:
    """The input's unit vector: the same for the same (model, text, dimensions) anywhere."""
    draw = random.Random(stable_hash("embedding", model, text, dimensions))
    values = [draw.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 7) for v in values]


def _encoded(values: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI's base64 encoding
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


def embeddings_body(req: EmbeddingRequest) -> dict[str, Any]:
    tokens = sum(req.token_counts)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i,
                  "embedding": _encoded(vector(req.model, text, req.dimensions),
                                        req.encoding_format)}
                 for i, text in enumerate(req.inputs)],
        "model": req.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
