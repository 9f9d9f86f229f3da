"""runtime (pure core; being built)."""
