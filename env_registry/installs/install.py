"""``molt-env install``: env ID -> package release -> verified wheel -> pip.

The registry resolves the ID (newest non-yanked version, or the exact ``@pin``); the wheel is downloaded and its
sha256 compared with the registry's index before pip sees it; then pip installs that local file into this
interpreter (or ``--python``), or with ``isolated`` into a venv of its own (``env_registry.installs.isolated``). pip is never
given the registry as an index, so the package's dependencies come from pip's own configuration (PyPI by default)
and nothing published here can stand in for one of them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from env_registry.errors import HashMismatch, InstallError
from env_registry.ids import parse_env_id
from env_registry.installs.isolated import install_release
from env_registry.installs.pip import pip_install
from env_registry.packages import names
from env_registry.packages.artifacts import file_sha256
from env_registry.store.client import RegistryClient
from env_registry.store.local import LocalRegistry, ReleaseInfo


def install(
    env_id: str, registry: LocalRegistry | RegistryClient, python: str | None = None, isolated: bool = False
) -> ReleaseInfo:
    """Install the package providing ``env_id`` (``ns/name-vN[@version]``); returns the release installed.

    Args:
        env_id: the ID to install, optionally pinned to a package version.
        registry: where to resolve and fetch it.
        python: the interpreter to install into (default: this one); not with ``isolated``.
        isolated: install into a venv of its own under the cache, served from there (``env_registry.installs.isolated``).

    Raises:
        InstallError: the registry's answer is not a wheel of a release providing the ID, or pip failed.
        HashMismatch: the downloaded wheel is not the one the registry's index lists.
        IsolatedInstallError: the isolated install failed (it is recorded as failed).
    """
    if isolated and python is not None:
        raise InstallError("--isolated makes its own venv; leave out --python")
    info = registry.resolve(env_id)
    wheel = info.wheel
    # the registry's answer must be what was asked: a wheel of the release it names, providing the env ID
    if (
        names.distribution_file(wheel.filename)[:2] != (info.package, info.version)
        or parse_env_id(env_id).unpinned not in info.env_ids
    ):
        raise InstallError(
            f"{registry} answered {env_id!r} with {wheel.filename!r} of {info.package} {info.version} "
            f"(env IDs {info.env_ids}), which is not a wheel of a release providing it; not installing"
        )
    with tempfile.TemporaryDirectory(prefix="molt-install-") as tmp:
        path = registry.fetch(info, wheel, Path(tmp))
        actual = file_sha256(path)
        if actual != wheel.sha256:
            raise HashMismatch(
                f"{wheel.filename} from {registry} has sha256 {actual}, but the index lists "
                f"{wheel.sha256}; refusing to install it (the file was changed after publishing)"
            )
        if isolated:
            install_release(info, path)
        else:
            pip_install([str(path)], f"{info.package} {info.version}", python=python)
    return info
