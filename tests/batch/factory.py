"""Batch inputs and jobs for tests, made through the services (validated as an upload is).

    path = write_input(tmp_path / "in.jsonl", 100)           # custom_id req-0 … req-99
    job = make_job(system, sim_pool, n=100, tmp_path=tmp_path, chunk_size=10)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetctl.accounts.actor import Actor
from fleetctl.batch import services
from fleetctl.batch.models import BatchFile, BatchJob
from fleetctl.fleet.models import Pool

MODEL = "llama-3.1-8b-instruct"


def request_line(i: int, *, model: str = MODEL, url: str = "/v1/chat/completions",
                 max_tokens: int = 16, custom_id: str | None = None) -> dict[str, Any]:
    """One input line's request: a short chat (or completion) whose answer is deterministic
    on the simulator (temperature 0)."""
    if url == "/v1/embeddings":
        body: dict[str, Any] = {"model": model, "input": f"passage {i}", "dimensions": 8}
    elif url == "/v1/completions":
        body = {"model": model, "prompt": f"question {i}",
                "max_tokens": max_tokens, "temperature": 0}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": max_tokens, "temperature": 0}
    return {"custom_id": custom_id if custom_id is not None else f"req-{i}",
            "method": "POST", "url": url, "body": body}


def write_input(path: Path, n: int, *, model: str = MODEL, url: str = "/v1/chat/completions",
                max_tokens: int = 16) -> Path:
    """Write an n-line input file (custom_id req-0 … req-{n-1}) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            out.write(json.dumps(request_line(i, model=model, url=url,
                                              max_tokens=max_tokens)) + "\n")
    return path


def upload(actor: Actor, path: Path, *, name: str | None = None) -> BatchFile:
    """services.file_upload of the file at `path`."""
    with Path(path).open("rb") as stream:
        return services.file_upload(actor=actor, name=name or Path(path).name, stream=stream)


def make_job(actor: Actor, pool: Pool, n: int = 20, *, tmp_path: Path,
             model: str = MODEL, url: str = "/v1/chat/completions", max_tokens: int = 16,
             **options: Any) -> BatchJob:
    """An n-request input written under tmp_path, uploaded, and a job on `pool` created from
    it with `options` (services.job_create's: concurrency, chunk_size, drill, ...)."""
    path = write_input(Path(tmp_path) / f"input-{n}-{_seq()}.jsonl", n, model=model, url=url,
                       max_tokens=max_tokens)
    batch_file = upload(actor, path)
    return services.job_create(actor=actor, input_file=batch_file, pool=pool, **options)


_counter = {"n": 0}


def _seq() -> int:
    _counter["n"] += 1
    return _counter["n"]
