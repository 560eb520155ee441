"""Gateway adapters, one module each, registered by kind on import."""

from fleetctl.traffic.adapters import base  # noqa: F401
