"""The HTTP sidecar: app factory, run store, decision log, metrics (adapts HTTP to the core)."""
