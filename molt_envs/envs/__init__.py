"""Built-in environments. Each is registered through the ``molt.envs`` entry points in pyproject.toml."""
