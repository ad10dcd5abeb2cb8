"""Other ecosystems' envs and trainers, one module per ecosystem, each holding both directions: their envs under
this registry's IDs, and this registry's IDs as their envs (``gymnasium``: every molt ID as a ``gymnasium.Env``;
``import env_registry.gym`` registers them).

May import: ``serving``, ``installs`` and the top of ``env_registry``; never ``evaluation``, ``validation``, ``hub``.
Nothing above an adapter knows which ecosystem an ID came from.
"""
