"""What the bridges and the games share, below both: named callables, the random player, an episode's seed.

``load_callable`` resolves the ``"package.module:attr"`` names that JSON-only env kwargs and scripted seat policies
use; ``random_legal_action`` is the ``"random"`` policy; ``seed_from`` reads an episode's seed from its dataset
label. ``molt_envs.seats`` (the ``Game`` contract) and ``molt_envs.bridges`` (Gymnasium and PettingZoo) both import
them from here; ``molt_envs.bridges`` still exports all three. Imports nothing from ``molt_envs``.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from typing import Any


def load_callable(name: str | None, default: Callable[..., Any] | None, what: str = "callable") -> Callable[..., Any]:
    """Resolve ``"package.module:attr"`` (or return ``default`` for None).

    Raises:
        ValueError: ``name`` is malformed, its module does not import, or it has no such attribute; the message
            names the value and the argument (``what``) it was given for.
    """
    if name is None and default is not None:
        return default
    module, _, attr = (name or "").partition(":")
    if not module or not attr:
        raise ValueError(f"{what} {name!r} must look like 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"{what} {name!r} cannot be imported ({type(exc).__name__}: {exc}); name a function of an installed "
            "module as 'package.module:function'"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} {name!r}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{what} {name!r} is a {type(obj).__name__}, not a callable")
    return obj


def random_legal_action(observation: Any, agent: str, env: Any, rng: random.Random) -> Any:
    """A uniformly random legal action (from the action mask when the observation has one)."""
    if isinstance(observation, dict) and "action_mask" in observation:
        return rng.choice([i for i, ok in enumerate(observation["action_mask"]) if ok])
    return rng.randrange(env.action_space(agent).n)


def seed_from(label: Any) -> int | None:
    """An episode seed from a dataset label: an int, or a dict with a ``"seed"``; else None (unseeded)."""
    if isinstance(label, dict):
        label = label.get("seed")
    try:
        return int(label)
    except (TypeError, ValueError):
        return None
