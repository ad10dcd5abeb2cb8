"""What the registry answers with: its records (packages, releases, files, env IDs, tokens, eval summaries) and
the errors of its rules. The JSON API serves these models as they are."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from env_registry.errors import Error


class Conflict(Error):
    """The publish or yank collides with what the registry already holds (HTTP 409)."""


class NotFound(Error, LookupError):
    """No such package, version, env ID or file (HTTP 404)."""


class Forbidden(Error, PermissionError):
    """The token's publisher does not own the package (HTTP 403)."""


class FileInfo(BaseModel):
    filename: str
    kind: str  # "wheel" | "sdist"
    sha256: str
    size: int
    url: str  # relative to the registry root: files/<package>/<filename>


class ReleaseInfo(BaseModel):
    package: str
    version: str
    content_hash: str
    summary: str
    requires_python: str | None
    env_ids: list[str]
    manifests: list[dict[str, Any]]
    publisher: str | None
    uploaded: float
    yanked: bool
    yanked_reason: str | None
    files: list[FileInfo]
    downloads: int = 0  # wheel downloads from the server
    validation_status: str | None = None  # None: not validated

    @property
    def wheel(self) -> FileInfo:
        return next(f for f in self.files if f.kind == "wheel")


class PackageInfo(BaseModel):
    name: str
    owner: str | None
    latest: str | None  # newest non-yanked version
    env_ids: list[str]
    releases: list[ReleaseInfo]


class EnvIdInfo(BaseModel):
    env_id: str
    package: str
    versions: list[str]  # every published package version providing it, oldest first
    latest: str | None  # what an unpinned install gets (newest non-yanked)


class TokenInfo(BaseModel):
    id: int
    publisher: str
    created: float
    revoked: float | None


class EvalRecord(BaseModel):
    """An eval summary stored for one release (``molt-env eval ... --publish-results``)."""

    id: int
    package: str
    version: str
    env_id: str
    publisher: str | None  # None: stored through a local directory registry
    uploaded: float
    summary: dict[str, Any]
    samples: bool = False  # its episodes are stored (``molt-env eval --out DIR --publish-results``)
