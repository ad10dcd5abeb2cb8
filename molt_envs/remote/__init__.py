"""The env protocol: an ``Env`` or ``ChatAgent`` served in another process, and the client that drives it there.

``protocol.py`` is the wire (pydantic messages, the version, and ``protocol.schema.json``, the committed JSON schema
a test keeps equal to the models); ``server.py`` serves envs over it (FastAPI + uvicorn, what ``molt-env
serve-env`` runs); ``client.py`` holds ``RemoteEnv`` and ``RemoteChatAgent``, ordinary contract objects over an
``Endpoint``, and ``GameSession``, a served game's calls made synchronously (``env_registry.remote.RemoteGame`` is
the ``Game`` over it: this package imports nothing of ``seats``).

May import: ``molt_envs.contract`` only. Never ``envs``, ``bridges``, ``seats``, the runners or ``sessions``. This
``__init__`` re-exports nothing: import from the module that defines the name.
"""
