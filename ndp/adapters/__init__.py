"""Adapters from ndp's arrays to the frameworks that consume them (imported on demand, so the
core never imports a framework)."""
