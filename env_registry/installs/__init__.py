"""Env packages from a registry into an interpreter: ``molt-env install`` (hash-checked wheel -> pip) and isolated
installs (a venv of the package's own, served from there; its ``SOURCE`` lists their IDs in the registry).

May import: ``serving``, ``store``, ``packages`` and the top of ``env_registry``.
"""
