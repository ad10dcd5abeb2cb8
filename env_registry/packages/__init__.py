"""An env package as files: ``molt-env init`` (scaffold), ``molt-env check ./dir`` (source_check), ``molt-env build``,
the ``molt`` hatchling build hook, what a built release holds and its content hash (artifacts), the names a registry
accepts.

May import: the top of ``env_registry`` (IDs, manifests, the registry) and ``molt_envs``. Nothing imports it but the
rooms above it (store, installs, validation, hub, cli).
"""
