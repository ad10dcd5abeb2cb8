"""What a built release holds, read from its wheel and sdist alone, and its content hash.

The content hash covers what the sdist ships: every file's bytes, with ``pyproject.toml`` compared as parsed data
minus ``project.version`` (so a version bump alone does not change it) and ``PKG-INFO`` left out (it is generated).
Timestamps, file order and archive compression never enter it, so two builds of one tree hash the same, and a
registry recomputes it from the uploaded sdist instead of trusting the publisher.
"""

from __future__ import annotations

import configparser
import gzip
import hashlib
import json
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from env_registry.errors import InvalidArtifact, ManifestError
from env_registry.manifest import EnvManifest, manifests_from_pyproject
from env_registry.packages import names
from env_registry.registry import ENTRY_POINT_GROUP, MANIFEST_METADATA_PATH

MAX_METADATA_BYTES = 1 << 20
MAX_UNPACKED_BYTES = 512 << 20
MAX_SDIST_MEMBERS = 20_000


@dataclass(frozen=True)
class Release:
    """One package version: its two files and everything the registry indexes about it."""

    name: str  # PEP 503 normalized
    version: str
    wheel: Path
    sdist: Path
    content_hash: str
    manifests: tuple[EnvManifest, ...]
    requires_python: str | None
    summary: str
    readme: str = ""  # the wheel's long description (METADATA body), shown on the hub's package page
    readme_type: str | None = None  # its Description-Content-Type, e.g. text/markdown

    @property
    def env_ids(self) -> list[str]:
        return [m.id for m in self.manifests]


def inspect_release(wheel: Path, sdist: Path) -> Release:
    """Validate a wheel + sdist pair and read its metadata; raises ``InvalidArtifact``/``ManifestError``/``InvalidName``."""
    name, version, kind = names.distribution_file(wheel.name)
    if kind != "wheel":
        raise InvalidArtifact(f"{wheel.name!r} is not a wheel (.whl)")
    sdist_name, sdist_version, kind = names.distribution_file(sdist.name)
    if kind != "sdist" or (sdist_name, sdist_version) != (name, version):
        raise InvalidArtifact(
            f"sdist {sdist.name!r} does not match wheel {wheel.name!r}; upload the sdist of {name} {version}"
        )
    metadata, entry_points, shipped_pyproject = _read_wheel(wheel)
    for field, expected in (("Name", name), ("Version", version)):
        got = metadata.get(field, "")
        normalized = names.package_name(got) if field == "Name" else names.package_version(got)
        if normalized != expected:
            raise InvalidArtifact(
                f"{wheel.name}: METADATA field {field!r} is {got!r}, but the file name says {expected!r}"
            )
    if shipped_pyproject is None:
        raise ManifestError(
            f"{wheel.name} has no {MANIFEST_METADATA_PATH} in its .dist-info; enable the molt build hook (a "
            '[tool.hatch.build.hooks.molt] table, with "molt-ecosystem" in build-system.requires), or add '
            '[tool.hatch.build.targets.wheel.extra-metadata] "pyproject.toml" = "molt/pyproject.toml"'
        )
    manifests = manifests_from_pyproject(shipped_pyproject, f"{wheel.name} pyproject.toml")
    check_entry_points(wheel.name, manifests, entry_points)
    sdist_pyproject, digest = _read_sdist(sdist)
    if _without_version(sdist_pyproject) != _without_version(tomllib.loads(shipped_pyproject)):
        raise InvalidArtifact(
            f"{wheel.name} and {sdist.name} were built from different pyproject.toml files; build both from one tree"
        )
    return Release(
        name=name,
        version=version,
        wheel=wheel,
        sdist=sdist,
        content_hash=digest,
        manifests=tuple(manifests),
        requires_python=metadata.get("Requires-Python") or None,
        summary=metadata.get("Summary", ""),
        readme=metadata.get("Description", ""),
        readme_type=metadata.get("Description-Content-Type") or None,
    )


def read_readme(wheel: Path) -> tuple[str, str | None]:
    """``(long description, its content type or None)`` from a wheel's METADATA.

    Raises:
        InvalidArtifact: the wheel is unreadable.
    """
    metadata = _read_wheel(wheel)[0]
    return metadata.get("Description", ""), metadata.get("Description-Content-Type") or None


def content_hash(sdist: Path) -> str:
    """The content hash of an sdist (see the module docstring)."""
    names.distribution_file(sdist.name)
    return _read_sdist(sdist)[1]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_wheel(wheel: Path) -> tuple[dict[str, str], dict[str, str], str | None]:
    """``(METADATA headers, molt.envs entry points, shipped pyproject text or None)``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            dist_infos = {n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
            if len(dist_infos) != 1:
                raise InvalidArtifact(
                    f"{wheel.name} must hold exactly one .dist-info directory, found {sorted(dist_infos) or 'none'}"
                )
            dist_info = dist_infos.pop()

            def read(member: str) -> str | None:
                try:
                    info = zf.getinfo(f"{dist_info}/{member}")
                except KeyError:
                    return None
                if info.file_size > MAX_METADATA_BYTES:
                    raise InvalidArtifact(f"{wheel.name}: {member} is larger than {MAX_METADATA_BYTES} bytes")
                return zf.read(info).decode("utf-8")

            metadata_text = read("METADATA")
            if metadata_text is None:
                raise InvalidArtifact(f"{wheel.name} has no {dist_info}/METADATA")
            if "\x00" in metadata_text:  # no database text column takes it (PostgreSQL refuses NUL)
                raise InvalidArtifact(f"{wheel.name}: METADATA contains a NUL character; remove it from the README")
            entry_points_text = read("entry_points.txt") or ""
            pyproject = read(MANIFEST_METADATA_PATH)
    except (zipfile.BadZipFile, UnicodeDecodeError, OSError, EOFError) as exc:
        raise InvalidArtifact(f"{wheel.name} is not a readable wheel: {exc}") from None
    headers = HeaderParser().parsestr(metadata_text)
    fields = ("Name", "Version", "Requires-Python", "Summary", "Description", "Description-Content-Type")
    metadata = {key: str(headers[key]) for key in fields if key in headers}
    body = headers.get_payload()
    if isinstance(body, str) and body.strip():  # metadata 2.1+: the description is the message body
        metadata["Description"] = body
    for line in headers.get_all("Requires-Dist") or []:
        try:
            url = Requirement(str(line)).url
        except InvalidRequirement as exc:
            raise InvalidArtifact(
                f"{wheel.name}: Requires-Dist {str(line)!r:.120} is not a requirement: {exc}"
            ) from None
        if url:  # pip would fetch (and maybe build) it at install time, from anywhere
            raise InvalidArtifact(
                f"{wheel.name}: Requires-Dist {str(line)!r:.120} is a direct reference ({url}); "
                "depend on a released package by name and version instead"
            )
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # env IDs are case-sensitive
    try:
        parser.read_string(entry_points_text)
    except configparser.Error as exc:
        raise InvalidArtifact(f"{wheel.name}: entry_points.txt is malformed: {exc}") from None
    entry_points = dict(parser[ENTRY_POINT_GROUP]) if parser.has_section(ENTRY_POINT_GROUP) else {}
    return metadata, entry_points, pyproject


def check_entry_points(where: str, manifests: list[EnvManifest], entry_points: dict[str, str]) -> None:
    declared = {m.id: m.entry_point for m in manifests}
    for env_id, target in declared.items():
        if entry_points.get(env_id) != target:
            raise ManifestError(
                f"{where}: manifest id {env_id!r} has entry_point {target!r}, but the "
                f'[project.entry-points."{ENTRY_POINT_GROUP}"] table maps it to '
                f'{entry_points.get(env_id)!r}; add "{env_id}" = "{target}" there'
            )
    extra = sorted(set(entry_points) - set(declared))
    if extra:
        raise ManifestError(
            f"{where}: entry point(s) {extra} in group {ENTRY_POINT_GROUP!r} have no [[tool.molt.env]] "
            "manifest; add one per env ID"
        )


class _Bounded:
    """The decompressed stream of an sdist, refusing any read that would take it past MAX_UNPACKED_BYTES in all
    before reading: tarfile reads a pax or long-name header's data in one piece, whatever size the header claims,
    so a few hundred KB of gzip could otherwise make the server allocate gigabytes."""

    def __init__(self, raw: Any, name: str) -> None:
        self.raw, self.name, self.total = raw, name, 0

    def read(self, size: int = -1) -> bytes:
        if size < 0 or self.total + size > MAX_UNPACKED_BYTES:
            raise InvalidArtifact(f"{self.name} unpacks to more than {MAX_UNPACKED_BYTES} bytes")
        data = self.raw.read(size)
        self.total += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()


def _read_sdist(sdist: Path) -> tuple[dict[str, Any], str]:
    """``(parsed pyproject.toml, content hash)``; every member must sit under ``<file name minus .tar.gz>/``."""
    top = sdist.name.removesuffix(".tar.gz")
    entries: list[tuple[str, str]] = []
    pyproject: dict[str, Any] | None = None
    unpacked = 0
    try:
        with gzip.open(sdist) as raw, tarfile.open(fileobj=_Bounded(raw, sdist.name), mode="r:") as tf:
            for count, member in enumerate(tf):
                if count >= MAX_SDIST_MEMBERS:
                    raise InvalidArtifact(f"{sdist.name} has more than {MAX_SDIST_MEMBERS} members")
                path = member.name.removeprefix("./")
                head, _, rel = path.partition("/")
                if head != top or ".." in rel.split("/"):
                    raise InvalidArtifact(f"{sdist.name}: member {member.name!r} is outside {top + '/'!r}")
                if member.isdir():
                    continue
                if not member.isfile():
                    raise InvalidArtifact(f"{sdist.name}: member {member.name!r} is a link or device; ship plain files")
                unpacked += member.size
                if unpacked > MAX_UNPACKED_BYTES:
                    raise InvalidArtifact(f"{sdist.name} unpacks to more than {MAX_UNPACKED_BYTES} bytes")
                data = tf.extractfile(member).read()  # type: ignore[union-attr]
                if rel == "PKG-INFO":
                    continue
                if rel == "pyproject.toml":
                    pyproject = tomllib.loads(data.decode("utf-8"))
                    data = json.dumps(_without_version(pyproject), sort_keys=True, separators=(",", ":")).encode()
                entries.append((rel, hashlib.sha256(data).hexdigest()))
    except (tarfile.TarError, OSError, EOFError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArtifact(f"{sdist.name} is not a readable .tar.gz sdist: {exc}") from None
    except RecursionError:
        raise InvalidArtifact(f"{sdist.name}: its pyproject.toml nests deeper than a parser goes") from None
    if pyproject is None:
        raise InvalidArtifact(f"{sdist.name} has no {top}/pyproject.toml")
    digest = hashlib.sha256()
    for rel, file_digest in sorted(entries):
        digest.update(f"{rel}\0{file_digest}\n".encode())
    return pyproject, digest.hexdigest()


def _without_version(pyproject: dict[str, Any]) -> dict[str, Any]:
    project = {k: v for k, v in pyproject.get("project", {}).items() if k != "version"}
    return {**pyproject, "project": project}


def inspect_wheel(wheel: Path) -> tuple[str, str, list[EnvManifest]]:
    """``(name, version, manifests)`` of a wheel alone, read from its metadata without importing anything.

    Raises:
        InvalidArtifact: not a readable wheel, or its METADATA disagrees with its file name.
        ManifestError: no shipped manifest, an invalid one, or entry points that do not match it.
    """
    name, version, kind = names.distribution_file(wheel.name)
    if kind != "wheel":
        raise InvalidArtifact(f"{wheel.name!r} is not a wheel (.whl)")
    metadata, entry_points, shipped_pyproject = _read_wheel(wheel)
    if names.package_name(metadata.get("Name", "")) != name:
        raise InvalidArtifact(f"{wheel.name}: METADATA names {metadata.get('Name')!r}, the file name {name!r}")
    if shipped_pyproject is None:
        raise ManifestError(f"{wheel.name} has no {MANIFEST_METADATA_PATH} in its .dist-info")
    manifests = manifests_from_pyproject(shipped_pyproject, f"{wheel.name} pyproject.toml")
    check_entry_points(wheel.name, manifests, entry_points)
    return name, version, manifests
