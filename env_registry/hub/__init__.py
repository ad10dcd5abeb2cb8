"""``molt-env serve``: the registry server (JSON API, PEP 503 index) and the hub, its server-rendered pages for
people: routes (app), pages and templates, an env's versions and their reference evals compared (versions), who
may read or write (access), the page cache, README sanitizing; and ``molt-env view`` (viewer), the pages of an eval
directory's samples, on loopback and, for an eval uploaded with its episodes, on the hub (eval_pages).

May import: ``store``, ``packages``, ``ecosystems`` (the cards of other ecosystems' envs) and the top of
``env_registry``. Nothing imports it but ``cli``.
"""
