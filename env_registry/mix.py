"""Weighted env mixes: the repeatable ``--env ID[:weight]`` flag of ``molt-env eval`` (and of training).

An ID may itself hold ``:`` or ``@`` (``module:ns/name-v1``, ``ns/name-v1@1.4.2``, ``http://host:port/ns/name-v1``,
``rg:countdown``, ``openenv:http://host:port``),
so a weight is only what follows the *last* ``:`` when that looks like a number, or when nothing else could stand
there (a ``:`` after an ID that has a ``/`` namespace or a version can only introduce a weight).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from env_registry.errors import Error, InvalidEnvId
from env_registry.ids import parse_env_id, split_kwargs
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
