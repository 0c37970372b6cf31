"""textgen-launcher: resolves a model, then spawns and supervises the shards and the router."""
