"""Where env IDs come from besides ``register()`` and ``molt.envs`` entry points: the ``molt.sources`` entry points.

A source is an object (a ``Source``) that may do any of four things:

- resolve the IDs of its ``schemes``: ``spec("http://host:port/ns/name-v1")`` for the ``http`` scheme. An ID whose
  text before its first ``:`` is a known scheme goes to that source, before the ``module:ns/name-vN`` form is tried
  (so ``rg:countdown`` is reasoning-gym's countdown, not ID ``countdown`` of a module ``rg``);
- list what its scheme can name (``catalog()``: ``molt-env list --source rg``), available or not and why;
- list specs the registry adds the first time it looks (``listed()``: an isolated install's IDs);
- explain an ID it was to provide but cannot (``missing(env_id)``: a failed isolated install).

Sources are named in the ``molt.sources`` entry-point group (``name = "pkg.mod:SOURCE"``; this project's own are in
its ``pyproject.toml``) and loaded the first time the registry needs one. The registry imports none of them: the rooms
that provide them (``serving``, ``installs``, ``ecosystems``) sit above it and import it, never the reverse.
"""

from __future__ import annotations

import importlib.metadata as metadata
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from env_registry.errors import UnregisteredEnv
from env_registry.manifest import EnvSpec

ENTRY_POINT_GROUP = "molt.sources"
_LOADED: list[Source] | None = None
_LOCK = threading.Lock()


@dataclass(frozen=True)
class CatalogEntry:
    """One ID a scheme can name, as ``molt-env list --source SCHEME`` shows it."""

    env_id: str
    kind: str = "env"
    available: bool = True
    reason: str = ""  # why it is unavailable (e.g. "downloads NLTK corpora at run time")
    description: str = ""


class Source:
    """One place env IDs come from. Subclasses override what they provide; the defaults provide nothing."""

    schemes: tuple[str, ...] = ()

    def spec(self, env_id: str) -> EnvSpec:
        """The spec of ``env_id``, an ID of one of ``schemes`` (the scheme included), as ``make()`` uses it."""
        raise UnregisteredEnv(f"{type(self).__name__} resolves no IDs; it was asked for {env_id!r}")

    def local_spec(self, env_id: str) -> EnvSpec:
        """The spec an env server serving ``env_id`` runs in its own process (``spec`` may point at that server)."""
        return self.spec(env_id)

    def catalog(self) -> list[CatalogEntry]:
        """Every ID this source's schemes can name."""
        return []

    def listed(self) -> Iterable[EnvSpec]:
        """Specs to add to the registry when it first looks."""
        return ()

    def missing(self, env_id: str) -> Exception | None:
        """Why ``env_id``, which this source was to provide, is not there; ``None`` when it knows nothing of it."""
        return None


def sources() -> list[Source]:
    """Every ``molt.sources`` entry point, loaded once per process; one that fails to load is skipped with a warning."""
    global _LOADED
    with _LOCK:
        if _LOADED is None:
            loaded = []
            for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
                try:
                    source = ep.load()
                except Exception as exc:  # one broken source must not hide every other env
                    warnings.warn(f"skipping the env source {ep.name!r} ({ep.value}): {exc}", stacklevel=2)
                    continue
                loaded.append(source)
            _LOADED = loaded
        return _LOADED


def for_scheme(env_id: str) -> Source | None:
    """The source whose scheme ``env_id`` starts with (``scheme:``), if any."""
    scheme, sep, _ = env_id.partition(":")
    if not sep:
        return None
    return next((s for s in sources() if scheme in s.schemes), None)
