"""Envs behind env servers: ``molt-env serve-env``, the servers this process starts in other interpreters
(isolated installs), env servers by URL (the ``http``/``https`` ID schemes, ``SOURCE`` in ``urls``), and the
conformance suite of env servers, ours or not (``server_check``: ``molt-env check URL``).

May import: the top of ``env_registry`` and ``molt_envs``. Never ``installs``, ``store`` or the rooms above.
"""
