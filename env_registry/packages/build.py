"""``molt-env build``: validate an env package's source tree, build its wheel + sdist with PyPA ``build``, hash it.

The build runs without isolation when this interpreter already satisfies the project's ``build-system.requires``
(fast, offline); otherwise ``build`` makes its usual isolated environment (which needs the package index).
"""

from __future__ import annotations

import importlib.metadata as metadata
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from env_registry.errors import BuildError, ManifestError
from env_registry.manifest import ENTRY_POINT_GROUP, EnvManifest, pyproject_manifests
from env_registry.packages import names
from env_registry.packages.artifacts import Release, check_entry_points, inspect_release

BUILD_TIMEOUT_S = 600


@dataclass(frozen=True)
class Source:
    """An env package source tree, validated before anything is built or imported."""

    root: Path
    name: str  # PEP 503 normalized
    version: str
    manifests: tuple[EnvManifest, ...]
    build_requires: tuple[str, ...]


def read_source(root: str | Path) -> Source:
    """Validate ``root/pyproject.toml``: static name and version, manifests, and matching ``molt.envs`` entry points."""
    root = Path(root).resolve()
    path = root / "pyproject.toml"
    if not path.is_file():
        raise BuildError(f"{root} has no pyproject.toml; is it an env package? (`molt-env init` makes one)")
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: not valid TOML: {exc}") from None
    project = data.get("project", {})
    for field in ("name", "version"):
        if field in project.get("dynamic", []) or not isinstance(project.get(field), str):
            raise ManifestError(
                f"{path}: field 'project.{field}' must be a static string, got "
                f"{project.get(field, '(dynamic)' if field in project.get('dynamic', []) else None)!r}"
            )
    name = names.package_name(project["name"])
    version = names.package_version(project["version"])
    manifests = pyproject_manifests(data, str(path))
    check_entry_points(str(path), manifests, project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))
    requires = tuple(data.get("build-system", {}).get("requires", ["setuptools"]))
    return Source(root, name, version, tuple(manifests), requires)


def build(root: str | Path, out_dir: str | Path | None = None, isolated: bool | None = None) -> Release:
    """Build wheel + sdist into ``out_dir`` (default ``root/dist``) and return the inspected ``Release``.

    ``isolated=None`` picks: no isolation when every build requirement is installed here, else isolation.
    """
    source = read_source(root)
    out = Path(out_dir).resolve() if out_dir else source.root / "dist"
    if isolated is None:
        isolated = not all(_installed(r) for r in source.build_requires)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out) as tmp:
        cmd = [sys.executable, "-m", "build", "--outdir", tmp, str(source.root)]
        if not isolated:
            cmd.insert(3, "--no-isolation")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BuildError(f"building {source.root} took longer than {BUILD_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-25:]
            raise BuildError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n" + "\n".join(tail))
        wheels, sdists = sorted(Path(tmp).glob("*.whl")), sorted(Path(tmp).glob("*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            raise BuildError(
                f"the build of {source.root} made {[p.name for p in wheels + sdists]}; expected one wheel and one sdist"
            )
        moved = []
        for built in (wheels[0], sdists[0]):
            target = out / built.name
            shutil.move(built, target)
            moved.append(target)
    release = inspect_release(*moved)
    if (release.name, release.version) != (source.name, source.version):
        raise BuildError(
            f"the build made {release.name} {release.version}, but pyproject.toml says {source.name} {source.version}"
        )
    return release


def _installed(requirement: str) -> bool:
    try:
        req = Requirement(requirement)
        return req.specifier.contains(metadata.version(req.name), prereleases=True)
    except (InvalidRequirement, metadata.PackageNotFoundError):
        return False
