"""Simulated OpenAI-compatible LLM serving pools for fleetctl's demo and tests.

Pure asyncio + aiohttp: importable and runnable without Django. See README.md here.
"""

from .profiles import BUILTIN_PROFILES, Profile, ProfileError, load_profiles
from .server import PoolSpec, SimPool
from .serving import serve, serve_async

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
