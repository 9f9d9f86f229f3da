"""Tools: the @tool decorator, the registry, the tool handler and its execution guard (pure core)."""
