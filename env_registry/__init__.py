"""Versioned env IDs, specs and manifests, discovery, and ``make``.

``make("ns/name-v1")`` returns a fresh env instance. Importing this package never imports torch or ray.
"""

from env_registry.conformance import check_env
from env_registry.datasets import count_rows, iter_split, load_split
from env_registry.errors import (
    DeprecatedEnv,
    DeprecatedEnvWarning,
    Error,
    InvalidEnvId,
    ManifestError,
    NameNotFound,
    NamespaceNotFound,
    NotAGymnasiumEnv,
    PackageVersionMismatch,
    RegistrationError,
    UnregisteredEnv,
    VersionNotFound,
)
from env_registry.ids import EnvId, parse_env_id
from env_registry.manifest import EnvManifest, EnvSpec, manifest_json_schema, read_pyproject_manifests
from env_registry.registry import make, pprint_registry, register, registry, spec
from env_registry.runners import runner_for

__all__ = [
    "DeprecatedEnv",
    "DeprecatedEnvWarning",
    "EnvId",
    "EnvManifest",
    "EnvSpec",
    "Error",
    "InvalidEnvId",
    "ManifestError",
    "NameNotFound",
    "NamespaceNotFound",
    "NotAGymnasiumEnv",
    "PackageVersionMismatch",
    "RegistrationError",
    "UnregisteredEnv",
    "VersionNotFound",
    "check_env",
    "count_rows",
    "iter_split",
    "load_split",
    "make",
    "manifest_json_schema",
    "parse_env_id",
    "pprint_registry",
    "read_pyproject_manifests",
    "register",
    "registry",
    "runner_for",
    "spec",
]
