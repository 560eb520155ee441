"""Gateway adapters, one module each, registered by kind when first needed (see
base.adapter_for; importing them here would make a cycle with the process helpers)."""
