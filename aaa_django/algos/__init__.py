"""Agent algorithms built on the engine (pure core)."""
