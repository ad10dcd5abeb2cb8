"""Reference evals of other ecosystems' envs: ``molt-env calibrate rg:products --root ROOT --reference-endpoint URL``.

A foreign ID (``rg:products``, ``textarena:TicTacToe-v0``: ``SCHEME:NAME`` of an installed ecosystem adapter) is
never published, so no publish gate calibrates it; the operator runs ``calibrate`` instead. It plays the ID with the
reference policy exactly as the gate plays a published env (``calibration.reference_eval``: ``molt-env eval``'s loop,
the same prompts and seeds, the same figures), in the operator's process; the ID's env code runs where the adapter
always runs it, in an env server of its own process (``env_registry.ecosystems.adapter``), never in the hub.

The figures are kept in the registry's store under the ID, as ``<root>/calibrations/<quoted ID>.json`` (the file store
every server process and replica of the registry reads; written atomically), and the write advances the database's
content stamp, so cached hub pages are re-rendered. The hub's foreign card reads them with ``foreign_calibration``.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

from env_registry import sources
from env_registry.errors import Error
from env_registry.ids import SCHEME_ID
from env_registry.store import database
from env_registry.store.local import LocalRegistry
from env_registry.validation.calibration import Reference, reference_eval, sanitize

DIRECTORY = "calibrations"


def check_foreign(env_id: str) -> None:
    """Refuse an ID that has no foreign card to show a calibration on.

    Raises:
        Error: not ``SCHEME:NAME`` of an installed ecosystem (a published ID is the gate's to calibrate), a server
            URL, or kwargs; the message names the ID and what to do.
    """
    from env_registry.ecosystems.adapter import Adapter

    match = SCHEME_ID.match(env_id)
    source = sources.for_scheme(env_id)
    if match is None or not isinstance(source, Adapter):
        raise Error(
            f"{env_id!r} is not another ecosystem's ID (SCHEME:NAME, e.g. rg:products); a published env is "
            "calibrated by the publish gate (molt-env serve --validate --reference-endpoint/--reference-checkpoint)"
        )
    if "://" in match["name"] or "?" in env_id:
        raise Error(
            f"{env_id!r} names a server or carries kwargs; calibrate an installed ID as its ecosystem names it "
            "(its hub card has no kwargs)"
        )
    source.spec(env_id)  # an unknown name fails here, with "did you mean"


def calibration_path(registry: LocalRegistry, env_id: str) -> Path:
    """Where the calibration of a foreign ID is kept in the registry's file store."""
    return registry.root / DIRECTORY / f"{quote(env_id, safe='')}.json"


def calibrate(registry: LocalRegistry, env_id: str, reference: Reference) -> dict[str, Any]:
    """Play ``env_id`` with the reference policy, store its figures under the ID and return them.

    Raises:
        Error: a bad ID (``check_foreign``), an unreachable endpoint, or an eval that failed; nothing is stored then.
    """
    check_foreign(env_id)
    figures = asyncio.run(reference_eval(env_id, reference, reference.endpoint))
    kept = sanitize(figures)
    if kept is None:
        raise Error(f"the reference eval of {env_id} returned no figures")
    store_calibration(registry, env_id, kept)
    return kept


def store_calibration(registry: LocalRegistry, env_id: str, figures: dict[str, Any]) -> None:
    """Keep ``figures`` as the calibration of ``env_id`` (replacing an earlier one), advancing the content stamp."""
    path = calibration_path(registry, env_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with database.write(registry.engine, exclusive=False):  # the stamp advances as the file lands
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibration-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"env_id": env_id, **figures}, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def foreign_calibration(registry: LocalRegistry, env_id: str) -> dict[str, Any] | None:
    """The stored calibration of a foreign ID (None without one, or when it is unreadable), bounded as the gate's."""
    try:
        data = json.loads(calibration_path(registry, env_id).read_text())
    except (OSError, ValueError):
        return None
    return sanitize(data) if isinstance(data, dict) and data.get("env_id") == env_id else None
