"""Environment IDs: ``[namespace/]name[-vN][@package_version]``, as Gymnasium plus an optional package pin; another
ecosystem's ``SCHEME:NAME``; and the ``?key=value&...`` kwargs any of them may carry."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from env_registry.errors import InvalidEnvId

MAX_ID_LENGTH = 128
_ID = re.compile(
    r"^(?:(?P<namespace>[A-Za-z0-9][A-Za-z0-9_-]*)/)?"
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*?)"
    r"(?:-v(?P<version>\d+))?"
    r"(?:@(?P<pin>[A-Za-z0-9][A-Za-z0-9_.+!-]*))?$"
)

SCHEME_ID = re.compile(r"^(?P<scheme>[a-z][a-z0-9_-]*):(?P<name>[^\s?]+)$")  # "rg:countdown", "openenv:http://h:1"
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class EnvId:
    """A parsed env ID (see ``parse_env_id``); ``str()`` gives it back in canonical form.

    Attributes:
        namespace: before the ``/``, or None. name: the env's name. version: N of ``-vN``, or None.
        pin: the package version after ``@``, or None.
    """

    namespace: str | None
    name: str
    version: int | None
    pin: str | None = None  # a package version, e.g. "1.4.2"

    @property
    def base(self) -> str:
        """``namespace/name`` without version or pin."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def unpinned(self) -> str:
        """``namespace/name-vN`` without the pin."""
        return self.base if self.version is None else f"{self.base}-v{self.version}"

    def __str__(self) -> str:
        return self.unpinned if self.pin is None else f"{self.unpinned}@{self.pin}"


def parse_env_id(env_id: str) -> EnvId:
    """Parse ``[namespace/]name[-vN][@package_version]``.

    Args:
        env_id: the ID, e.g. ``"acme/echo-v1@1.0.2"``.

    Returns:
        Its ``EnvId``.

    Raises:
        InvalidEnvId: if it is not a string, not of that form, or longer than ``MAX_ID_LENGTH`` (the message shows
            the form with an example).
    """
    if not isinstance(env_id, str):
        raise InvalidEnvId(f"an env ID must be a string, got {type(env_id).__name__} {env_id!r}")
    match = _ID.fullmatch(env_id) if len(env_id) <= MAX_ID_LENGTH else None
    if match is None or ".." in env_id:
        raise InvalidEnvId(
            f"{env_id!r} is not a valid env ID; use [namespace/]name[-vN][@package_version] with letters, digits, "
            f"'_', '-', '.' (at most {MAX_ID_LENGTH} characters), e.g. 'acme/echo-v1' or 'acme/echo-v1@1.0.2'"
        )
    version = match["version"]
    return EnvId(match["namespace"], match["name"], int(version) if version is not None else None, match["pin"])


def split_kwargs(env_id: str) -> tuple[str, dict[str, Any]]:
    """``"ID?key=value&key2=value2"`` -> ``("ID", {"key": value, ...})``; an ID without ``?`` has no kwargs.

    Values parse as JSON where they do (``3``, ``true``, ``[1, 2]``, ``"x"``), else stay strings; ``%xx`` and ``+``
    are URL-decoded first.

    Raises:
        InvalidEnvId: a part is not ``key=value``, a key is not an identifier, or a key is given twice.
    """
    base, sep, query = env_id.partition("?")
    if not sep:
        return env_id, {}
    kwargs: dict[str, Any] = {}
    for part in query.split("&"):
        key, eq, raw = part.partition("=")
        key = unquote_plus(key)
        if not eq or not _KEY.fullmatch(key):
            raise InvalidEnvId(
                f"{env_id!r}: {part!r} is not key=value with an identifier key; write ID?key=value&key2=value2"
            )
        if key in kwargs:
            raise InvalidEnvId(f"{env_id!r}: the kwarg {key!r} is given twice; give each key once")
        value = unquote_plus(raw)
        try:
            kwargs[key] = json.loads(value)
        except ValueError:
            kwargs[key] = value
    return base, kwargs
