"""Simulated OpenAI-compatible LLM serving pools for fleetctl's demo and tests.

Pure asyncio + aiohttp: importable and runnable without Django. See README.md here.
"""

from importlib import import_module
from typing import Any

# Where each public name lives. Loaded on first use (PEP 562), so that importing a light
# submodule (the CLI's parser, the profiles, the metrics names) does not pay for aiohttp and
# the server: `fleetctl --help` and every CLI call import this package.
_LAZY = {"BUILTIN_PROFILES": "profiles", "Profile": "profiles", "ProfileError": "profiles",
         "load_profiles": "profiles", "PoolSpec": "server", "SimPool": "server",
         "serve": "serving", "serve_async": "serving"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_LAZY[name]}", __name__), name)


__all__ = [
    "BUILTIN_PROFILES",
    "PoolSpec",
    "Profile",
    "ProfileError",
    "SimPool",
    "load_profiles",
    "serve",
    "serve_async",
]
