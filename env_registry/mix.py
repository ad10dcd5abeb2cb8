"""Weighted env mixes: the repeatable ``--env ID[:weight]`` flag of ``molt-env eval`` (and of training).

An ID may itself hold ``:`` or ``@`` (``module:ns/name-v1``, ``ns/name-v1@1.4.2``, ``http://host:port/ns/name-v1``,
``rg:countdown``, ``openenv:http://host:port``),
so a weight is only what follows the *last* ``:`` when that looks like a number, or when nothing else could stand
there (a ``:`` after an ID that has a ``/`` namespace or a version can only introduce a weight).

``env_lock`` records a resolved mix (``molt_env_lock.json``: each env's ID, package, version, spec hash, weight,
kwargs and adapted library), which training checkpoints and evals stamp; ``lock_changes`` names what differs.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_registry.errors import Error, InvalidEnvId
from env_registry.ids import parse_env_id, split_kwargs
from env_registry.manifest import EnvSpec
from env_registry.registry import spec as registry_spec
from env_registry.sources import for_scheme

_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_URL = re.compile(r"https?://", re.IGNORECASE)
_URL_AUTHORITY = re.compile(r"https?://[^/?:]*$", re.IGNORECASE)  # a URL's host with nothing after it yet
_PORT = re.compile(r"\d+([/?].*)?")  # a URL's port, and its path or query


class InvalidEnvMix(Error, ValueError):
    """An ``--env ID[:weight]`` value whose weight is not a positive number, or an ID given twice."""


@dataclass(frozen=True)
class MixEntry:
    """One env of a mix: its ID as given (module prefix, pin or URL kept) and its normalized weight."""

    env_id: str
    weight: float


def split_weight(value: str) -> tuple[str, float | None]:
    """``"ns/name-v1:2"`` -> ``("ns/name-v1", 2.0)``; ``"ns/name-v1"`` -> ``("ns/name-v1", None)``.

    Args:
        value: one ``--env`` value.

    Returns:
        The ID part and the weight (``None`` when no weight was given).

    Raises:
        InvalidEnvMix: the weight is not a finite number > 0, or is empty.
    """
    head, sep, tail = value.rpartition(":")
    if not sep:
        return value, None
    if _URL_AUTHORITY.search(head) and _PORT.fullmatch(tail):  # "openenv:http://127.0.0.1:8000?seeds=[1]": a port
        return value, None
    if _NUMBER.fullmatch(tail.strip()):
        return head, _positive(float(tail), value)
    if not tail:
        raise InvalidEnvMix(f"--env {value!r} ends with ':' but no weight; write ID or ID:WEIGHT (e.g. ID:0.5)")
    if "/" in tail or (_URL.match(value) and head.lower() in ("http", "https")) or _MODULE.fullmatch(head):
        return value, None  # "module:ns/name-v1", "http://host:port/ns/name-v1", "module:name-v1"
    raise InvalidEnvMix(
        f"--env {value!r}: the weight {tail!r} is not a number; write ID:WEIGHT with a number > 0 (e.g. {head}:0.5)"
    )


def _positive(weight: float, value: str) -> float:
    if not (math.isfinite(weight) and weight > 0):
        raise InvalidEnvMix(f"--env {value!r}: the weight must be a finite number > 0, got {weight!r}")
    return weight


def check_id_syntax(env_id: str) -> None:
    """Refuse an ID that no lookup could resolve, before anything starts.

    Raises:
        InvalidEnvId: the ID part (after a ``module:`` prefix; URLs are left to their server) is malformed.
    """
    if _URL.match(env_id) or for_scheme(env_id) is not None:  # a scheme's source checks its own names
        return
    env_id = split_kwargs(env_id)[0]
    parse_env_id(env_id.split(":", 1)[1] if ":" in env_id else env_id)


def parse_env_mix(values: Sequence[str], resolve: Callable[[str], Any] | None = None) -> list[MixEntry]:
    """Parse repeated ``--env ID[:weight]`` values; weights default to 1 and are normalized to sum to 1.

    Args:
        values: the flag's values, in order.
        resolve: called with each ID (e.g. ``env_registry.spec``) so an unknown ID fails here, before any work.

    Returns:
        One entry per ID, in the order given.

    Raises:
        InvalidEnvMix: no value, a bad weight, or an ID given twice.
        InvalidEnvId: a malformed ID.
        Error: whatever ``resolve`` raises for an unknown ID (``NameNotFound``, ...), with the value named.
    """
    if not values:
        raise InvalidEnvMix("give at least one --env ID (repeat --env ID:WEIGHT for a mix)")
    parsed: list[tuple[str, float]] = []
    for value in values:
        env_id, weight = split_weight(value.strip())
        try:
            check_id_syntax(env_id)
        except InvalidEnvId as exc:
            raise InvalidEnvId(f"--env {value!r}: {exc}") from None
        if any(env_id == seen for seen, _ in parsed):
            raise InvalidEnvMix(f"--env {env_id!r} is given twice; give each env once (with a weight for a mix)")
        if resolve is not None:
            try:
                resolve(env_id)
            except Error as exc:
                raise type(exc)(f"--env {value!r}: {exc}") from None
        parsed.append((env_id, 1.0 if weight is None else weight))
    total = sum(w for _, w in parsed)
    return [MixEntry(env_id, weight / total) for env_id, weight in parsed]


# -- the env lock: which exact envs a run trained or evaluated on --

LOCK_FILE = "molt_env_lock.json"
LOCK_FORMAT = 1


def lock_entry(env_id: str, spec: EnvSpec, weight: float) -> dict[str, Any]:
    """One env of a lock: ``id`` as given (the key of its per-env metrics), the spec's ID, package, version, spec
    hash, weight in the mix, kwargs and ``upstream`` (the adapted library and its version, for another
    ecosystem's env)."""
    return {
        "id": env_id,
        "spec_id": spec.id,
        "package": spec.package,
        "version": spec.package_version,
        "spec_hash": spec.hash,
        "weight": weight,
        "kwargs": dict(spec.kwargs),
        "upstream": dict(spec.upstream),
    }


def env_lock(mix: Sequence[MixEntry], resolve: Callable[[str], EnvSpec] | None = None) -> dict[str, Any]:
    """The lock of a resolved mix (``molt_env_lock.json``): ``{"format": 1, "envs": [lock_entry, ...]}`` in the
    mix's order. ``resolve`` defaults to ``env_registry.spec``."""
    resolve = resolve or registry_spec
    return lock_from((e.env_id, resolve(e.env_id), e.weight) for e in mix)


def lock_from(envs: Iterable[tuple[str, EnvSpec, float]]) -> dict[str, Any]:
    """The lock of envs already resolved: ``(ID as given, spec, weight)`` each, in order."""
    return {"format": LOCK_FORMAT, "envs": [lock_entry(env_id, spec, weight) for env_id, spec, weight in envs]}


def lock_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """A sentence per env of ``new`` whose version, spec hash or adapted library's version differs from ``old``'s
    (an env is matched by its ``id``, else by its ``spec_id``); empty when ``old`` is None or nothing changed."""
    if not old:
        return []
    by_id = {e["id"]: e for e in old.get("envs", [])}
    by_spec: dict[str, list[dict[str, Any]]] = {}
    for e in old.get("envs", []):
        by_spec.setdefault(e.get("spec_id") or e["id"], []).append(e)
    changes = []
    for now_ in new.get("envs", []):
        was = by_id.get(now_["id"])
        if was is None and len(by_spec.get(now_["spec_id"], [])) == 1:
            was = by_spec[now_["spec_id"]][0]
        if was is None or was.get("spec_hash") == now_["spec_hash"]:
            continue
        what = []
        if was.get("version") != now_["version"]:
            what.append(f"{now_['package'] or 'version'} {was.get('version')} -> {now_['version']}")
        up_was, up_now = was.get("upstream") or {}, now_["upstream"] or {}
        if up_was.get("version") != up_now.get("version"):
            library = up_now.get("library") or up_was.get("library")
            what.append(f"{library} {up_was.get('version')} -> {up_now.get('version')}")
        if (was.get("kwargs") or {}) != now_["kwargs"]:
            what.append(f"kwargs {was.get('kwargs') or {}} -> {now_['kwargs']}")
        what.append(f"spec hash {was.get('spec_hash')} -> {now_['spec_hash']}")
        changes.append(f"{now_['id']}: " + ", ".join(what))
    return changes


def write_lock(directory: str | Path, lock: dict[str, Any]) -> Path:
    """Write ``lock`` to ``directory/molt_env_lock.json`` (atomically); returns the path."""
    path = Path(directory) / LOCK_FILE
    tmp = path.with_name(LOCK_FILE + ".tmp")
    tmp.write_text(json.dumps(lock, indent=1) + "\n")
    os.replace(tmp, path)
    return path
