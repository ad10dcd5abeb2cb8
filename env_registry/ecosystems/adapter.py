"""What every ecosystem's ``SCHEME:NAME`` source shares: its library as an optional extra, its version stamped on the
spec, names checked against the source's own catalog, kwargs, and the env run in a process of its own.

A subclass says which library it adapts (``library``, ``module``, ``extra``), lists its names (``names``) and builds the
in-process spec of one (``build``). ``make("rg:countdown")`` then gets a spec whose env runs in an env server this
process starts (``molt-env serve-env rg:countdown`` under ``python()``: this interpreter, or the venv the library lives
in), so foreign env code never runs in the caller's interpreter; the server itself asks for ``local_spec``. Subclasses
whose env is already a server elsewhere (OpenEnv) set ``own_process = False``.
"""

from __future__ import annotations

import difflib
import importlib.metadata as metadata
import importlib.util
import sys
from typing import Any

from env_registry.errors import NameNotFound, UnregisteredEnv
from env_registry.ids import split_kwargs
from env_registry.manifest import EnvSpec
from env_registry.remote import RemoteEnvSpec
from env_registry.serving.managed_servers import managed_endpoint
from env_registry.sources import Source

PROJECT = "molt-ecosystem"


class MissingLibrary(UnregisteredEnv):
    """The library a scheme adapts is not installed in the interpreter that would run it."""


class Adapter(Source):
    """A ``SCHEME:NAME`` source adapting one foreign library (see the module docstring)."""

    scheme: str = ""
    library: str = ""  # its distribution name on PyPI ("reasoning-gym")
    module: str = ""  # its import name ("reasoning_gym")
    extra: str = ""  # this project's extra that installs it: pip install 'molt-ecosystem[EXTRA]'
    license: str | None = None  # the library's license, where it states one
    own_process = True

    @property
    def schemes(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.scheme,)

    # -- what a subclass provides --
    def names(self) -> list[str]:
        """Every name the library's own catalog has (for ``catalog`` and "did you mean")."""
        raise NotImplementedError

    def build(self, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The spec fields (``entry_point``, ``kind``, ``kwargs``, ``datasets``, ...) of ``name`` with ``kwargs``;
        raises ``ValueError`` naming a bad kwarg and the type it expects."""
        raise NotImplementedError

    def python(self) -> str:
        """The interpreter the env server of this scheme runs under."""
        return sys.executable

    # -- shared --
    def version(self) -> str:
        """The installed library's version; ``MissingLibrary`` naming the install command when it is absent."""
        try:
            if importlib.util.find_spec(self.module) is None:
                raise metadata.PackageNotFoundError(self.library)
            return metadata.version(self.library)
        except (metadata.PackageNotFoundError, ValueError):
            raise MissingLibrary(
                f"the {self.scheme}: scheme needs {self.library}, which is not installed here; "
                f"pip install '{PROJECT}[{self.extra}]'"
            ) from None

    def split(self, env_id: str) -> tuple[str, dict[str, Any]]:
        """``"rg:countdown?min_numbers=3"`` -> ``("countdown", {"min_numbers": 3})``."""
        base, kwargs = split_kwargs(env_id)
        return base.partition(":")[2], kwargs

    def check_name(self, name: str) -> None:
        known = self.names()
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" Did you mean {', '.join(f'{self.scheme}:{c}' for c in close)}?" if close else ""
            raise NameNotFound(
                f"{self.library} has no env {name!r}.{hint} `molt-env list --source {self.scheme}` lists all "
                f"{len(known)}."
            )

    def local_spec(self, env_id: str) -> EnvSpec:
        name, kwargs = self.split(env_id)
        upstream = {"ecosystem": self.scheme, "library": self.library, "version": self.version()}
        if self.license:
            upstream["license"] = self.license
        self.check_name(name)
        try:
            fields = self.build(name, kwargs)
        except ValueError as exc:
            raise UnregisteredEnv(f"{env_id!r}: {exc}") from None
        return EnvSpec(id=f"{self.scheme}:{name}", upstream=upstream, **fields)

    def spec(self, env_id: str) -> EnvSpec:
        local = self.local_spec(env_id)  # name, kwargs and library are checked here, in the caller's process
        if not self.own_process:
            return local
        python, where = self.python(), f"the {self.library} env server of {env_id}"
        spec_hash = local.hash

        def endpoint() -> Any:
            return managed_endpoint(python, local.id, where, spec_hash, serve_as=env_id)

        return RemoteEnvSpec.served(local.model_dump(mode="json"), spec_hash, where, endpoint)
