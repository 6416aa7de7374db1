"""Built-in model configs: config.json-shaped data read by the same parser as real checkpoints."""
