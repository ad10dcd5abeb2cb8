"""The ``molt`` hatchling build hook, which an env package enables with one line of its ``pyproject.toml``::

    [build-system]
    requires = ["hatchling>=1.25", "molt-ecosystem>=0.1"]
    build-backend = "hatchling.build"

    [tool.hatch.build.hooks.molt]

Every build of the package, by any frontend (``molt-env build``, ``python -m build``, ``pip install``, ``uv``), then
validates its manifests as ``molt-env build`` does (so a wheel the registry would refuse is never made) and ships
``pyproject.toml`` in the wheel's ``.dist-info`` (``MANIFEST_METADATA_PATH``), where discovery and the registry read
the manifests without importing the env. It does what ``[tool.hatch.build.targets.wheel.extra-metadata]
"pyproject.toml" = "molt/pyproject.toml"`` does, which keeps working. Hatchling finds the hook through this
distribution's ``hatch`` entry point.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.plugin import hookimpl

from env_registry.packages.build import read_source
from env_registry.registry import MANIFEST_METADATA_PATH


class MoltBuildHook(BuildHookInterface):
    """Validates the manifests and ships ``pyproject.toml`` in the wheel's metadata (wheel and editable builds)."""

    PLUGIN_NAME = "molt"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Raises ``ManifestError`` (naming the field and value) for a manifest ``molt-env build`` would refuse."""
        read_source(self.root)
        if self.target_name == "wheel":
            build_data["extra_metadata"]["pyproject.toml"] = MANIFEST_METADATA_PATH.removeprefix("extra_metadata/")


@hookimpl
def hatch_register_build_hook() -> type[BuildHookInterface]:
    return MoltBuildHook
