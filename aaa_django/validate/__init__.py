"""validate (pure core; being built)."""
