"""The hub's cards for other ecosystems' envs (``rg:countdown``, ``textarena:Wordle-v0``, ``gym:CartPole-v1``, ...):
what the ``molt.sources`` installed on the server resolve, shown like a package's env (source ecosystem, upstream
library and version, license, kind, datasets, sample prompts) and listed per scheme with each ID's availability. The
page (``pages``) adds the ID's reference eval where the operator ran ``molt-env calibrate ID`` (read per request from
the registry's store, ``env_registry.validation.foreign``; never cached here), drawn as a native card's.

The hub fetches nothing for a card: an ``openenv:URL`` ID (a server somewhere) is refused, and so are kwargs (a card
is for the ID as its ecosystem names it). A catalog and a card are computed once per server process and kept (they
change only with the installed libraries).
"""

from __future__ import annotations

import threading
from typing import Any

from env_registry import sources
from env_registry.datasets import load_split
from env_registry.ecosystems.adapter import Adapter
from env_registry.errors import Error, UnregisteredEnv
from env_registry.ids import SCHEME_ID
from env_registry.registry import spec as registry_spec
from env_registry.sources import CatalogEntry

SAMPLE_PROMPTS = 3  # rows of each split the card shows as the model sees them
_CATALOGS: dict[str, list[CatalogEntry]] = {}
_CARDS: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()


class NotAnEcosystemCard(Error, ValueError):
    """An ID the hub will not make a card for (a URL, kwargs): HTTP 400."""


def _ecosystem(env_id: str) -> Adapter | None:
    source = sources.for_scheme(env_id)
    return source if isinstance(source, Adapter) else None


def is_foreign(env_id: str) -> bool:
    """Whether ``env_id`` names another ecosystem's env (``SCHEME:NAME`` of an installed ecosystem adapter)."""
    return _ecosystem(env_id) is not None


def schemes() -> list[str]:
    """Every ecosystem scheme installed on the server, sorted (``gym``, ``openenv``, ``rg``, ...)."""
    return sorted(source.scheme for source in sources.sources() if isinstance(source, Adapter))


def catalog(scheme: str) -> list[CatalogEntry]:
    """Every ID the source of ``scheme`` can name, with availability (computed once per process).

    Raises:
        UnregisteredEnv: ``scheme`` is none of the installed sources' (the message lists them).
    """
    source = _ecosystem(f"{scheme}:x")
    if source is None:
        raise UnregisteredEnv(f"no installed source provides the scheme {scheme!r}; schemes here: {schemes()}")
    with _LOCK:
        if scheme not in _CATALOGS:
            _CATALOGS[scheme] = [e for e in source.catalog() if e.env_id.startswith(f"{scheme}:")]
        return _CATALOGS[scheme]


def card(env_id: str) -> dict[str, Any]:
    """What the card of ``env_id`` shows: its spec, the upstream stamp, and the first prompts of each split (as
    chat messages, or the error its generator raised).

    Raises:
        NotAnEcosystemCard: a URL or an ID with kwargs.
        UnregisteredEnv: the source does not know the name (its message says "did you mean").
    """
    match = SCHEME_ID.match(env_id)
    if match is None:
        raise NotAnEcosystemCard(f"{env_id!r} is not SCHEME:NAME; kwargs (?key=value) are not part of a card's address")
    if "://" in match["name"]:
        raise NotAnEcosystemCard(
            f"{env_id!r} names a server; the hub shows cards of installed envs only, never fetches"
        )
    with _LOCK:
        if env_id in _CARDS:
            return _CARDS[env_id]
    spec = registry_spec(env_id)
    samples: dict[str, Any] = {}
    for split in sorted(spec.datasets):
        try:
            samples[split] = [row["prompt"] for row in load_split(spec, split, SAMPLE_PROMPTS)]
        except Exception as exc:  # a foreign generator's failure is shown, never a 500
            samples[split] = f"{type(exc).__name__}: {exc}"
    made = {"env_id": env_id, "spec": spec, "upstream": spec.upstream or {}, "samples": samples}
    with _LOCK:
        return _CARDS.setdefault(env_id, made)
