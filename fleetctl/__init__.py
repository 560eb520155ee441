"""fleetctl: the control plane for staged LLM-serving migrations across accelerator fleets."""

__version__ = "0.1.0"
