"""``molt-env serve``: the registry server (JSON API, PEP 503 index) and the hub, its server-rendered pages for
people: routes (app), pages and templates, who may read or write (access), the page cache, README sanitizing;
and ``molt-env view`` (viewer), the same pages' machinery over an eval directory's samples, on loopback.

May import: ``store``, ``packages``, ``ecosystems`` (the cards of other ecosystems' envs) and the top of
``env_registry``. Nothing imports it but ``cli``.
"""
