"""The demo's two traces (called by `demo_seed`): `demo-chat`, synthetic chat to benchmark
the demo pools with (Benchmarks → New run; the seeded capacity run uses it), and
`demo-prompts`, the demo traffic's 288 prompts with their texts, for a replay shadow run.
Each created once, through the same validated paths as any trace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleetctl.accounts.actor import Actor

Create = Callable[[str, Callable[[], Any]], Any]


def seed_traces(actor: Actor, create: Create) -> None:
    """Both traces, each only if absent; `create(what, make)` is the seed's own (it reports a
    refusal and goes on)."""
    _chat_trace(actor, create)
    _prompt_trace(actor, create)


def _chat_trace(actor: Actor, create: Create) -> None:
    from fleetctl.bench import services as bench
    from fleetctl.bench.models import Trace

    if Trace.objects.filter(name="demo-chat").exists():
        return
    create("trace demo-chat", lambda: bench.trace_generate(
        actor=actor, name="demo-chat", n=2000, seed=1,
        description="Synthetic chat: lognormal lengths, 4 shared system prompts, "
                    "Poisson arrivals at 8/s.",
        prompt_tokens={"kind": "lognormal", "median": 400, "sigma": 0.6, "lo": 32,
                       "hi": 4000},
        completion_tokens={"kind": "lognormal", "median": 120, "sigma": 0.5, "lo": 8,
                           "hi": 512},
        arrival={"kind": "poisson", "rate": 8.0}, shared_prefix_groups=4,
        shared_prefix_tokens=200))


def _prompt_trace(actor: Actor, create: Create) -> None:
    """`fleetctl shadow start --plan a100-llama-8b --mode replay --trace demo-prompts`."""
    import io
    import json

    from fleetctl.bench import services as bench
    from fleetctl.bench.models import Trace
    from fleetctl.demo.traffic import PROMPTS

    if Trace.objects.filter(name="demo-prompts").exists():
        return
    lines = [json.dumps({"fleetctl_trace": 1, "name": "demo-prompts"})]
    lines += [json.dumps({"arrival_s": float(i), "prompt_tokens": 16,
                          "completion_tokens": 96,
                          "messages": [{"role": "user", "content": prompt}]})
              for i, prompt in enumerate(PROMPTS)]
    body = io.BytesIO("\n".join(lines).encode())
    create("trace demo-prompts", lambda: bench.trace_upload(
        actor=actor, name="demo-prompts", fileobj=body,
        description="The demo traffic's 288 chat prompts, one a second: replay them "
                    "in a shadow run."))
