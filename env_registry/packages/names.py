"""Names a registry accepts: package names, versions, distribution file names and publisher names.

Everything that ends up in a file path, a URL or an SQL row passes through here first, so no name can climb out of
the registry's directory or smuggle odd characters into an index page.
"""

from __future__ import annotations

import re

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from env_registry.errors import InvalidName

MAX_NAME_LENGTH = 100
_PACKAGE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")  # PEP 508 names
_PUBLISHER = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def package_name(name: str) -> str:
    """The PEP 503 normalized form of a valid package name (``Acme_Echo`` -> ``acme-echo``)."""
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH or not _PACKAGE.fullmatch(name):
        raise InvalidName(
            f"package name {name!r:.120} is invalid; use letters, digits, '.', '_' and '-' (starting and "
            f"ending with a letter or digit, at most {MAX_NAME_LENGTH} characters), e.g. 'acme-echo'"
        )
    return canonicalize_name(name)


def package_version(version: str) -> str:
    """The normalized form of a valid PEP 440 version (``1.0`` stays ``1.0``, ``1.0.0-RC1`` -> ``1.0.0rc1``)."""
    try:
        parsed = Version(version)
    except (InvalidVersion, TypeError):
        raise InvalidName(f"version {version!r:.80} is not a valid PEP 440 version; use e.g. '1.0.2'") from None
    if parsed.local is not None:
        raise InvalidName(f"version {version!r} has a local part ('+{parsed.local}'); registries refuse local versions")
    return str(parsed)


_FILENAME = re.compile(r"[A-Za-z0-9._+!-]+")  # what wheel and sdist names use; no path, quote or markup


def distribution_file(filename: str) -> tuple[str, str, str]:
    """``(normalized name, version, "wheel"|"sdist")`` of a wheel or ``.tar.gz`` sdist file name."""
    if not isinstance(filename, str) or not _FILENAME.fullmatch(filename) or filename.startswith("."):
        raise InvalidName(
            f"file name {filename!r:.120} is invalid; give a bare wheel or sdist file name "
            "(letters, digits and . _ + ! - only)"
        )
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
            kind = "wheel"
        elif filename.endswith(".tar.gz"):
            name, version = parse_sdist_filename(filename)
            kind = "sdist"
        else:
            raise InvalidName(f"file {filename!r:.120} is neither a wheel (.whl) nor an sdist (.tar.gz)")
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion) as exc:
        raise InvalidName(f"file name {filename!r:.120} is invalid: {exc}") from None
    return package_name(name), package_version(str(version)), kind


def publisher_name(name: str) -> str:
    if not isinstance(name, str) or not _PUBLISHER.fullmatch(name):
        raise InvalidName(f"publisher name {name!r:.80} is invalid; use 1-64 lowercase letters, digits, '_' or '-'")
    return name
