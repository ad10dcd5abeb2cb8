"""``register`` / ``spec`` / ``make`` with Gymnasium's version rules, fed lazily by ``molt.envs`` entry points.

Discovery reads entry-point names and the ``[tool.molt.env]`` manifests shipped in each distribution's metadata;
no env module is imported until ``make()`` (or ``load()``) asks for that one env. IDs from elsewhere (an env server's
URL, an isolated install, another ecosystem's scheme) come through ``env_registry.sources``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as metadata
import inspect
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from env_registry import remote, sources
from env_registry.errors import (
    DeprecatedEnv,
    DeprecatedEnvWarning,
    ManifestError,
    NameNotFound,
    NamespaceNotFound,
    PackageVersionMismatch,
    RegistrationError,
    VersionNotFound,
)
from env_registry.ids import EnvId, parse_env_id, split_kwargs
from env_registry.manifest import (
    ENTRY_POINT_GROUP,
    EnvManifest,
    EnvSpec,
    manifests_from_catalog,
    manifests_from_pyproject,
)
from env_registry.remote import RemoteEnvSpec

MANIFEST_METADATA_PATH = "extra_metadata/molt/pyproject.toml"
CATALOG_METADATA_PATH = "extra_metadata/molt/catalog.toml"  # optional: manifests kept out of pyproject.toml


class Registry(Mapping[str, EnvSpec]):
    """All known env specs by ID. Entry points are read on first access; ``register`` adds more at run time."""

    def __init__(self) -> None:
        self._specs: dict[str, EnvSpec] = {}
        self._discovered = False
        self._lock = threading.RLock()

    # -- Mapping (read-only view) --
    def __getitem__(self, env_id: str) -> EnvSpec:
        self._discover()
        return self._specs[env_id]

    def __iter__(self) -> Iterator[str]:
        self._discover()
        return iter(list(self._specs))

    def __len__(self) -> int:
        self._discover()
        return len(self._specs)

    # -- registration --
    def register(self, env_id: str, entry_point: str, **fields: Any) -> EnvSpec:
        parsed = parse_env_id(env_id)
        if parsed.pin is not None:
            raise RegistrationError(f"cannot register {env_id!r} with a package pin; register {parsed.unpinned!r}")
        try:
            spec = EnvSpec(id=env_id, entry_point=entry_point, **fields)
        except Exception as exc:
            raise RegistrationError(f"cannot register {env_id!r}: {exc}") from None
        self._discover()
        self._add(spec, explicit=True)
        return spec

    def _add(self, spec: EnvSpec, explicit: bool) -> None:
        parsed = parse_env_id(spec.id)
        with self._lock:
            for other_id in self._specs:
                other = parse_env_id(other_id)
                if other.base == parsed.base and (other.version is None) != (parsed.version is None):
                    raise RegistrationError(
                        f"cannot register {spec.id!r}: {other_id!r} is already registered, and an env cannot have both "
                        f"an unversioned and a versioned ID; register it as '{parsed.base}-vN'"
                    )
            if spec.id in self._specs:
                old = self._specs[spec.id]
                if not explicit:  # two installed packages claim one ID: the first found wins
                    warnings.warn(
                        f"env {spec.id!r} from package {spec.package!r} is shadowed by package "
                        f"{old.package!r}; uninstall one of them",
                        stacklevel=3,
                    )
                    return
                warnings.warn(
                    f"overriding the registration of {spec.id!r} ({old.entry_point} -> {spec.entry_point})",
                    stacklevel=3,
                )
            self._specs[spec.id] = spec

    def _discover(self) -> None:
        if self._discovered:
            return
        with self._lock:
            if self._discovered:
                return
            self._discovered = True
            manifests: dict[str, dict[str, EnvManifest]] = {}
            for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                dist = ep.dist
                name = dist.metadata["Name"] if dist is not None else None
                if name not in manifests:
                    manifests[name] = _dist_manifests(dist)
                manifest = manifests[name].get(ep.name)
                fields = manifest.model_dump() if manifest is not None else {"id": ep.name}
                fields["entry_point"] = ep.value  # the entry point is authoritative for what to import
                try:
                    spec = EnvSpec(**fields, package=name, package_version=dist.version if dist else None)
                    self._add(spec, explicit=False)
                except Exception as exc:  # one broken package must not hide every other env
                    warnings.warn(f"skipping env {ep.name!r} from package {name!r}: {exc}", stacklevel=2)
            for source in sources.sources():
                for served in source.listed():
                    self.add_served(served)

    def add_served(self, spec: RemoteEnvSpec) -> None:
        """Add a spec whose env runs in an env server (an isolated install). A package installed in this
        interpreter keeps its ID (an env server serving that very package finds itself here)."""
        self._discover()  # (a no-op when called by discovery itself)
        with self._lock:
            here = self._specs.get(spec.id)
            if here is not None and not isinstance(here, RemoteEnvSpec):
                if (here.package, here.package_version) != (spec.package, spec.package_version):
                    warnings.warn(
                        f"{spec.id!r} is installed here ({here.package} {here.package_version}) and as "
                        f"{spec.where}; using the one installed here (`pip uninstall {here.package}` to use the other)",
                        stacklevel=3,
                    )
                return
            self._specs[spec.id] = spec

    # -- lookup --
    def spec(self, env_id: str) -> EnvSpec:
        source = sources.for_scheme(env_id)
        if source is not None:  # "http://host:port/ns/name-v1", "rg:countdown": a known scheme comes first
            return source.spec(env_id)
        env_id, kwargs = split_kwargs(env_id)
        spec = self._lookup(env_id)
        if not kwargs:
            return spec
        if isinstance(spec, RemoteEnvSpec):
            raise RegistrationError(
                f"{spec.id!r} runs in {spec.where}; the kwargs {sorted(kwargs)} cannot reach it: "
                "set them in the spec the server serves"
            )
        return spec.model_copy(update={"kwargs": {**spec.kwargs, **kwargs}})  # kwargs are hashed with the spec

    def _lookup(self, env_id: str) -> EnvSpec:
        if ":" in env_id:  # "some.module:ns/name-v1" imports the module (which registers) first
            module, env_id = env_id.split(":", 1)
            try:
                importlib.import_module(module)
            except ImportError as exc:
                schemes = sorted({scheme for source in sources.sources() for scheme in source.schemes})
                raise NameNotFound(
                    f"could not import module {module!r} to register {env_id!r}: {exc}; {module!r} is no known ID "
                    f"scheme either (known schemes: {', '.join(f'{s}:' for s in schemes)})"
                ) from exc
        self._discover()
        parsed = parse_env_id(env_id)
        spec = self._specs.get(parsed.unpinned)
        if spec is None and parsed.version is None:
            versions = self._versions(parsed)
            if versions:
                latest = f"{parsed.base}-v{max(versions)}"
                warnings.warn(
                    f"using the latest version {latest!r} for the unversioned ID {parsed.base!r}; "
                    "pin a version for reproducible runs",
                    DeprecatedEnvWarning,
                    stacklevel=3,
                )
                spec = self._specs[latest]
        if spec is None:
            for source in sources.sources():
                reason = source.missing(parsed.unpinned)
                if reason is not None:
                    raise reason
            self._raise_not_found(parsed)
        versions = self._versions(parsed)
        if parsed.version is not None and versions and parsed.version < max(versions):
            warnings.warn(
                f"{parsed.unpinned!r} is out of date; consider {parsed.base}-v{max(versions)}",
                DeprecatedEnvWarning,
                stacklevel=3,
            )
        if parsed.pin is not None and spec.package_version != parsed.pin:
            raise PackageVersionMismatch(
                f"{env_id!r} pins package version {parsed.pin}, but {spec.id!r} comes from "
                f"{spec.package or 'a run-time registration'} {spec.package_version or '(no package version)'}; "
                f"run `molt-env install {parsed}` to install that version"
            )
        return spec

    def _versions(self, parsed: EnvId) -> list[int]:
        found = (parse_env_id(i) for i in self._specs)
        return [e.version for e in found if e.base == parsed.base and e.version is not None]

    def _raise_not_found(self, parsed: EnvId) -> None:
        known = [parse_env_id(i) for i in self._specs]
        namespaces = sorted({e.namespace for e in known if e.namespace})
        if parsed.namespace is not None and parsed.namespace not in namespaces:
            raise NamespaceNotFound(
                f"namespace {parsed.namespace!r} not found.{_did_you_mean(parsed.namespace, namespaces)}"
                f" Install the package that provides it, or see `molt-env list`."
            )
        names = sorted({e.name for e in known if e.namespace == parsed.namespace})
        if parsed.name not in names:
            where = f" in namespace {parsed.namespace!r}" if parsed.namespace else ""
            raise NameNotFound(
                f"env {parsed.base!r} not found{where}.{_did_you_mean(parsed.name, names)}"
                f" See `molt-env list` for every registered ID."
            )
        versions = sorted(self._versions(parsed))
        has_default = parsed.base in self._specs
        if not versions and has_default:
            raise DeprecatedEnv(f"{parsed.unpinned!r} does not exist; {parsed.base!r} is registered without a version")
        if parsed.version > max(versions):
            listed = ", ".join(f"v{v}" for v in versions)
            raise VersionNotFound(f"version v{parsed.version} of {parsed.base!r} does not exist; available: {listed}")
        raise DeprecatedEnv(
            f"{parsed.unpinned!r} is deprecated and no longer registered; use '{parsed.base}-v{max(versions)}'"
        )

    def load(self, env_id: str | EnvSpec) -> type:
        """Import and return the class an ID's (or a spec's) entry point names."""
        spec = env_id if isinstance(env_id, EnvSpec) else self.spec(env_id)
        if isinstance(spec, RemoteEnvSpec):
            raise RegistrationError(
                f"{spec.id!r} runs in {spec.where}; there is no class to import here: use make() or runner_for()"
            )
        module_name, _, attr = spec.entry_point.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise RegistrationError(f"entry point {spec.entry_point!r} of {spec.id!r} cannot be loaded: {exc}") from exc
        return obj

    def factory(self, env_id: str | EnvSpec, **kwargs: Any) -> tuple[EnvSpec, Callable[[], Any]]:
        """Resolve once (a spec is taken as is); return the spec (with ``kwargs`` overlaid) and a function making
        fresh stamped instances."""
        spec = env_id if isinstance(env_id, EnvSpec) else self.spec(env_id)
        if isinstance(spec, RemoteEnvSpec):
            if kwargs:
                raise RegistrationError(
                    f"{spec.id!r} runs in {spec.where}; make() kwargs {sorted(kwargs)} cannot reach it: "
                    "set them in the spec the server serves"
                )
            return spec, remote.factory(spec)
        cls = self.load(spec)
        merged = {**spec.kwargs, **kwargs}
        _check_kwargs(cls, merged, spec.id)
        stamped = spec.model_copy(update={"kwargs": merged}) if kwargs else spec

        def new_instance() -> Any:
            instance = cls(**merged)
            instance.spec = stamped
            return instance

        return stamped, new_instance

    def make(self, env_id: str, **kwargs: Any) -> Any:
        """A fresh instance of the env; ``kwargs`` overlay the spec's ``kwargs``."""
        return self.factory(env_id, **kwargs)[1]()


def _check_kwargs(cls: Any, kwargs: dict[str, Any], env_id: str) -> None:
    """Refuse a kwarg the env's constructor does not take, naming it and the ones it does (no check when it takes
    ``**kwargs`` or has no signature to read)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    takes = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(kwargs) - set(takes))
    if unknown:
        raise RegistrationError(
            f"{env_id!r} takes no kwarg {unknown[0]!r} ({cls.__name__} takes {', '.join(takes) or 'none'}); "
            f"drop it or use one of those"
        )


def _dist_manifests(dist: metadata.Distribution | None) -> dict[str, EnvManifest]:
    """The manifests a distribution ships: its pyproject's ``[tool.molt.env]`` and its catalog's ``[[env]]``."""
    if dist is None:
        return {}
    found: dict[str, EnvManifest] = {}
    where = f"{dist.metadata['Name']} {dist.version}"
    has_catalog = dist.read_text(CATALOG_METADATA_PATH) is not None
    entry_points = {ep.name: ep.value for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP}
    for path in (MANIFEST_METADATA_PATH, CATALOG_METADATA_PATH):
        text = dist.read_text(path)
        if text is None or (path == MANIFEST_METADATA_PATH and "tool.molt.env" not in text and has_catalog):
            continue  # a package may keep every manifest in its catalog
        source = f"{where} {path.rpartition('/')[2]}"
        try:
            if path == MANIFEST_METADATA_PATH:  # completed from the pyproject's own entry points
                manifests = manifests_from_pyproject(text, source)
            else:
                manifests = manifests_from_catalog(text, source, entry_points)
        except ManifestError as exc:
            warnings.warn(str(exc), stacklevel=3)
            continue
        for m in manifests:
            if m.id in found:
                warnings.warn(
                    f"{where}: {m.id!r} has manifests in pyproject.toml and catalog.toml; keep one", stacklevel=3
                )
            found.setdefault(m.id, m)
    return found


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


registry = Registry()


def register(env_id: str, entry_point: str, **fields: Any) -> EnvSpec:
    """Register an env at run time (installed packages register through the ``molt.envs`` entry points instead).

    Args:
        env_id: ``[namespace/]name[-vN]`` (no ``@`` pin).
        entry_point: ``"package.module:Class"`` of the ``Env`` or ``ChatAgent``.
        **fields: any other ``EnvSpec`` field (kind, kwargs, max_turns, datasets, ...).

    Returns:
        The registered ``EnvSpec``.

    Raises:
        InvalidEnvId: if ``env_id`` is not a valid ID.
        RegistrationError: for a pinned ID, fields that do not make a valid spec, or an ID that conflicts with a
            registered versioned/unversioned one.
    """
    return registry.register(env_id, entry_point, **fields)


def spec(env_id: str) -> EnvSpec:
    """The ``EnvSpec`` registered under ``env_id``, without importing the env's module.

    An unversioned ID resolves to the latest version and an older version still works, both with a
    ``DeprecatedEnvWarning``; ``"module:ns/name-v1"`` imports ``module`` first (so it can register).

    Args:
        env_id: ``[module:][namespace/]name[-vN][@package_version]``.

    Returns:
        The spec.

    Raises:
        InvalidEnvId: if ``env_id`` is not a valid ID.
        NamespaceNotFound, NameNotFound, VersionNotFound: if nothing is registered under it (the message suggests
            close names or lists the versions); NameNotFound also when a ``"module:"`` prefix cannot be imported.
        DeprecatedEnv: for an older version that is no longer registered.
        PackageVersionMismatch: if an ``@version`` pin differs from the installed package's version.
    """
    return registry.spec(env_id)


def make(env_id: str, **kwargs: Any) -> Any:
    """A fresh instance of the env (one per episode), stamped with its spec.

    Args:
        env_id: as for ``spec``.
        **kwargs: overlay the spec's ``kwargs`` (passed to the env's constructor).

    Returns:
        The new ``Env`` or ``ChatAgent``.

    Raises:
        InvalidEnvId, UnregisteredEnv (NamespaceNotFound, NameNotFound, VersionNotFound), DeprecatedEnv,
            PackageVersionMismatch: as ``spec`` raises them.
        RegistrationError: if the entry point's module or class cannot be loaded.
    """
    return registry.make(env_id, **kwargs)


def pprint_registry(print_output: bool = True) -> str:
    """Every registered ID grouped by namespace, versions together, with its kind and package.

    Args:
        print_output: also print it.

    Returns:
        The listing.
    """
    groups: dict[str, list[str]] = {}
    for env_id in sorted(registry):
        groups.setdefault(parse_env_id(env_id).namespace or "(no namespace)", []).append(env_id)
    lines = []
    for namespace, ids in groups.items():
        lines.append(f"===== {namespace} =====")
        lines.extend(
            f"  {i}  [{registry[i].kind}, {registry[i].package or 'registered at run time'} "
            f"{registry[i].package_version or ''}".rstrip()
            + (", isolated]" if isinstance(registry[i], RemoteEnvSpec) else "]")
            for i in ids
        )
    text = "\n".join(lines) if lines else "no environments registered"
    if print_output:
        print(text)
    return text
