"""Model handlers and clients (pure core)."""
