"""The registry behind ``--registry``: a directory (``LocalRegistry``) or a server URL (``RegistryClient``).

Both answer the same calls (publish, yank, package, search, resolve, fetch) and raise the same errors, so the CLI
and ``install`` never care which one they talk to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from env_registry.errors import Error
from env_registry.packages.artifacts import Release
from env_registry.store.eval_summaries import parse_summary
from env_registry.store.local import (
    Conflict,
    EvalRecord,
    FileInfo,
    Forbidden,
    LocalRegistry,
    NotFound,
    PackageInfo,
    ReleaseInfo,
)

DEFAULT_REGISTRY = "~/.molt/registry"
TIMEOUT = httpx.Timeout(60.0, connect=10.0)
ERRORS: dict[int, type[Error]] = {401: Forbidden, 403: Forbidden, 404: NotFound, 409: Conflict}


class RegistryClient:
    """The JSON API of a registry server (see ``env_registry.hub.app``)."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def __repr__(self) -> str:
        return f"RegistryClient({self.url!r})"

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            with httpx.Client(base_url=self.url, headers=self._headers, timeout=TIMEOUT) as http:
                response = http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise Error(f"cannot reach the registry at {self.url}: {type(exc).__name__}: {exc}") from None
        if response.is_success:
            return response.json()
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise ERRORS.get(response.status_code, Error)(f"{self.url} answered {response.status_code}: {detail}")

    def publish(self, release: Release, allow_same_content: bool = False) -> ReleaseInfo:
        if not self.token:
            raise Forbidden(f"publishing to {self.url} needs a token: pass --token or set $MOLT_TOKEN")
        with release.wheel.open("rb") as wheel, release.sdist.open("rb") as sdist:
            files = {
                "wheel": (release.wheel.name, wheel, "application/octet-stream"),
                "sdist": (release.sdist.name, sdist, "application/octet-stream"),
            }
            data = {"allow_same_content": "true" if allow_same_content else "false"}
            return ReleaseInfo.model_validate(self._call("POST", "/api/packages", files=files, data=data))

    def yank(self, package: str, version: str, reason: str) -> ReleaseInfo:
        return ReleaseInfo.model_validate(
            self._call("POST", f"/api/packages/{package}/{version}/yank", json={"reason": reason})
        )

    def package(self, package: str) -> PackageInfo:
        return PackageInfo.model_validate(self._call("GET", f"/api/packages/{package}"))

    def publish_eval(self, package: str, version: str, summary: dict[str, Any]) -> EvalRecord:
        """Upload an eval summary (``summary.json`` of ``molt-env eval``) for one release; needs a token.

        Args:
            package: the package name.
            version: the package version the summary evaluated.
            summary: the parsed ``summary.json`` (checked here first, then again by the server).

        Returns:
            The summary as the registry stored it.

        Raises:
            InvalidSummary: the summary misses a required key or has a wrong value.
            Forbidden: no token, or the token is unknown or revoked.
            NotFound: the registry has no such release.
            Conflict: the summary names another version, or an env ID the release does not provide.
        """
        if not self.token:
            raise Forbidden(f"uploading eval results to {self.url} needs a token: pass --token or set $MOLT_TOKEN")
        body = parse_summary(summary)
        return EvalRecord.model_validate(self._call("POST", f"/api/packages/{package}/{version}/evals", json=body))

    def publish_eval_samples(self, package: str, version: str, eval_id: int, samples: Path) -> EvalRecord:
        """Upload the episodes of an eval summary uploaded before (its ``samples.jsonl``, the lines of its env); the
        hub shows them at ``/evals/<id>/``. Needs the token that uploaded the summary.

        Raises:
            Forbidden: no token, or not the summary's uploader.
            NotFound: no such release or eval.
            Conflict: the eval's episodes are stored already.
            Error: the registry refused the file (too large, not sample records of the eval's env).
        """
        if not self.token:
            raise Forbidden(f"uploading eval results to {self.url} needs a token: pass --token or set $MOLT_TOKEN")
        with Path(samples).open("rb") as f:  # streamed, with its Content-Length (the server refuses chunked bodies)
            body = self._call(
                "POST",
                f"/api/packages/{package}/{version}/evals/{eval_id}/samples",
                content=f,
                headers={"Content-Type": "application/x-ndjson"},
            )
        return EvalRecord.model_validate(body)

    def evals(self, package: str, version: str) -> list[EvalRecord]:
        """The eval summaries stored for one release, oldest first."""
        return [EvalRecord.model_validate(e) for e in self._call("GET", f"/api/packages/{package}/{version}/evals")]

    def validation(self, package: str, version: str) -> tuple[str | None, dict[str, Any] | None]:
        """``(status, report)`` of a release's validation by the server's publish gate (as ``LocalRegistry``'s)."""
        body = self._call("GET", f"/api/packages/{package}/{version}/validation")
        return body["status"], body["report"]

    def search(self, query: str) -> list[PackageInfo]:
        return [PackageInfo.model_validate(p) for p in self._call("GET", "/api/search", params={"q": query})]

    def resolve(self, env_id: str) -> ReleaseInfo:
        return ReleaseInfo.model_validate(self._call("GET", "/api/resolve", params={"env_id": env_id}))

    def fetch(self, info: ReleaseInfo, file: FileInfo, dest: Path) -> Path:
        """Download one release file into ``dest`` (a directory); the caller verifies its hash."""
        target = dest / Path(file.filename).name
        try:
            with (
                httpx.Client(base_url=self.url, headers=self._headers, timeout=TIMEOUT) as http,
                http.stream("GET", f"/{file.url}") as response,
            ):
                if not response.is_success:
                    raise ERRORS.get(response.status_code, Error)(
                        f"downloading {self.url}/{file.url} failed with HTTP {response.status_code}"
                    )
                with target.open("wb") as f:
                    for chunk in response.iter_bytes():
                        f.write(chunk)
        except httpx.HTTPError as exc:
            raise Error(f"downloading {self.url}/{file.url} failed: {type(exc).__name__}: {exc}") from None
        return target


def open_registry(location: str | None = None, token: str | None = None) -> LocalRegistry | RegistryClient:
    """``location`` is a directory or an ``http(s)://`` URL; default ``$MOLT_REGISTRY`` or ``~/.molt/registry``."""
    location = location or os.environ.get("MOLT_REGISTRY") or DEFAULT_REGISTRY
    if location.startswith(("http://", "https://")):
        return RegistryClient(location, token or os.environ.get("MOLT_TOKEN"))
    return LocalRegistry(location)
