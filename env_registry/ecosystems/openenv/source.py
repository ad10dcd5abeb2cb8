"""The ``openenv:`` scheme's source: ``openenv:http://host:port`` (a running server) and ``openenv:PACKAGE`` (an
installed OpenEnv env package, served here by uvicorn in a process of its own); the spec of each, its seed rows."""

from __future__ import annotations

import difflib
import importlib.metadata as metadata
import importlib.resources
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from env_registry.ecosystems.adapter import Adapter
from env_registry.ecosystems.openenv.wire import (
    _MODULE,
    ENTRY_POINT,
    ENV_KEYS,
    GENERATOR,
    KWARG_TYPES,
    MCP_ACTIONS,
    SPEC_KEYS,
    SPLITS,
    instructions,
    probe,
    probed,
)
from env_registry.errors import NameNotFound, UnregisteredEnv
from env_registry.manifest import EnvSpec
from env_registry.serving.managed_servers import ManagedServer, managed_endpoint
from env_registry.sources import CatalogEntry

# run by the serving interpreter: uvicorn on a free loopback port; prints its URL once it answers, exits when this
# process's end of its stdin closes (so it never outlives us, even killed)
LAUNCHER = r"""
import os, socket, sys, threading, time
import uvicorn
app, app_dir = sys.argv[1], sys.argv[2]
if app_dir:
    sys.path.insert(0, app_dir)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_max_size=64 << 20))
def watch():
    while not server.started:
        time.sleep(0.05)
    print(f"openenv app {app} ready at http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    sys.stdin.read()
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
server.run(sockets=[sock])
"""


def seed_rows(split: str, start: int = 0, size: int = 0, seeds: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """One row per reset seed (``seeds``, else ``start .. start + size - 1``); its label is ``{"seed": s}``."""
    for seed in seeds if seeds is not None else range(start, start + size):
        yield {"prompt": f"OpenEnv episode reset with seed {seed} ({split})", "label": {"seed": seed}}


# -- a served package --
class OpenEnvServer(ManagedServer):
    """An OpenEnv package's app served by uvicorn under ``python`` (``serve_as``: the app, ``pkg.server.app:app``)."""

    def command(self) -> list[str]:
        app_dir = ""
        if self.python == sys.executable:  # found on this process's sys.path, which the child does not inherit
            spec = importlib.util.find_spec(self.serve_as.partition(".")[0])
            if spec is not None and spec.submodule_search_locations:
                app_dir = str(Path(next(iter(spec.submodule_search_locations))).parent)
        return [self.python, "-c", LAUNCHER, self.serve_as, app_dir]

    def ready_url(self, line: str) -> str | None:
        match = re.search(r" ready at (http://\S+)", line)
        return match[1] if match and f"openenv app {self.serve_as} " in line else None

    def check(self) -> None:
        probe(self.base_url)


def package_endpoint(package: str, app: str, python: str) -> Any:
    """The endpoint of this process's server of ``package`` (started on first use)."""
    where = f"OpenEnv package {package} ({app} under {python})"
    return managed_endpoint(python, f"openenv:{package}", where, None, app, OpenEnvServer)


def package_manifest(package: str) -> dict[str, Any]:
    """The package's ``openenv.yaml`` (empty when it has none, or it cannot be read here)."""
    try:
        import yaml

        text = (importlib.resources.files(package) / "openenv.yaml").read_text()
        manifest = yaml.safe_load(text)
    except Exception:  # no manifest, no yaml, an unreadable one: the layout's defaults
        return {}
    return manifest if isinstance(manifest, dict) else {}


# -- the source --
class OpenEnv(Adapter):
    scheme = "openenv"
    library = "openenv"
    module = "openenv"
    extra = "openenv"
    license = "BSD-3-Clause"
    own_process = False  # its env already is a server of its own; only OpenEnv's client runs here

    def names(self) -> list[str]:
        """The OpenEnv env packages installed here (distributions ``openenv-NAME``; ``openenv-core`` is the library)."""
        found = set()
        for dist in metadata.distributions():
            name = dist.metadata["Name"] or ""
            if name.lower().startswith("openenv-") and name.lower() != "openenv-core":
                module = name[len("openenv-") :].replace("-", "_")
                if importlib.util.find_spec(module) is not None:
                    found.add(module)
        return sorted(found)

    def catalog(self) -> list[CatalogEntry]:
        entries = []
        for name in self.names():
            manifest = package_manifest(name)
            about = manifest.get("description") or f"OpenEnv env package {name}"
            entries.append(CatalogEntry(f"openenv:{name}", "env", True, "", f"{about} (served here by uvicorn)"))
        return entries

    def check_name(self, name: str) -> None:
        if name.startswith(("http://", "https://")):
            return
        if not _MODULE.fullmatch(name):
            raise NameNotFound(
                f"openenv:{name} names neither a server (openenv:http://host:port) nor an OpenEnv env package "
                "(openenv:PACKAGE, its import name)"
            )

    def local_spec(self, env_id: str) -> EnvSpec:
        name, kwargs = self.split(env_id)
        name = name.rstrip("/") if name.startswith(("http://", "https://")) else name
        version = self.version()
        self.check_name(name)
        unknown = sorted(set(kwargs) - set(ENV_KEYS) - set(SPEC_KEYS))
        if unknown:
            raise UnregisteredEnv(
                f"{env_id!r}: unknown kwarg {unknown[0]!r}; openenv: IDs take {', '.join(ENV_KEYS + SPEC_KEYS)}"
            )
        for key, (ok, expected) in KWARG_TYPES.items():
            if key in kwargs and not ok(kwargs[key]):
                raise UnregisteredEnv(f"{env_id!r}: {key} must be {expected}, got {kwargs[key]!r}")
        env_kwargs: dict[str, Any] = {k: kwargs[k] for k in ENV_KEYS if k in kwargs}
        manifest: dict[str, Any] = {}
        if name.startswith(("http://", "https://")):
            if "python" in kwargs:
                raise UnregisteredEnv(f"{env_id!r}: 'python' is for packages; a URL's server runs where it runs")
            base_url = where = name
            env_kwargs["base_url"] = base_url
        else:
            app, manifest = self._app(name, kwargs.get("python"))
            where = f"package {name}"
            base_url = package_endpoint(name, app, kwargs.get("python") or sys.executable).base_url
            env_kwargs.update(package=name, app=app)
        answers = probed(base_url) if "base_url" in env_kwargs else probe(base_url)
        action, meta = answers["schema"]["action"], answers["metadata"]
        mcp = action.get("title") in MCP_ACTIONS
        env_kwargs.update(
            action_schema=action,
            mcp=mcp,
            instructions=instructions(meta["name"], meta.get("description") or "", action, mcp),
        )
        declared = manifest.get("validation")
        declared = declared.get("reward") if isinstance(declared, dict) else None
        reward_range = kwargs.get("reward_range", declared.get("range") if isinstance(declared, dict) else None)
        seeds = kwargs.get("seeds")
        held_out = (
            f"both splits are the seeds {seeds}"
            if seeds
            else "train resets with seeds 0..999, test with 1000000..1000199 (disjoint)"
        )
        upstream = {
            "ecosystem": self.scheme,
            "library": self.library,
            "version": version,
            "license": self.license,
            "server": meta["name"],
            "server_version": str(meta.get("version") or "unknown"),
        }
        try:
            return EnvSpec(
                id=f"openenv:{name}",
                entry_point=ENTRY_POINT,
                kind="env",
                description=f"OpenEnv env {meta['name']} ({where}): {meta.get('description') or ''}".rstrip(": "),
                tags=["openenv", "multi-turn", "text", *(["tools"] if mcp else [])],
                reward_range=tuple(reward_range) if reward_range is not None else (0.0, 1.0),
                deterministic=False,
                max_turns=kwargs.get("max_turns"),
                kwargs=env_kwargs,
                datasets={
                    split: {"generator": GENERATOR, "kwargs": {"seeds": seeds} if seeds else dict(rows)}
                    for split, rows in SPLITS.items()
                },
                card={
                    "source": f"reset seeds of the OpenEnv env {meta['name']} ({where})",
                    "license": "unknown (the OpenEnv env's own)",
                    "held_out": held_out,
                },
                upstream=upstream,
            )
        except ValueError as exc:  # pydantic: a bad reward_range or max_turns
            raise UnregisteredEnv(f"{env_id!r}: {exc}") from None

    def _app(self, package: str, python: str | None) -> tuple[str, dict[str, Any]]:
        """The app (``pkg.server.app:app``) of an OpenEnv package and its ``openenv.yaml``; checked here unless it
        is served from another interpreter (``python``), which checks it by starting."""
        if python is None and importlib.util.find_spec(package) is None:
            known = self.names()
            close = [f"openenv:{n}" for n in difflib.get_close_matches(package, known, n=3)]
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise NameNotFound(
                f"no OpenEnv env package {package!r} is installed here.{hint} Install it (OpenEnv env packages are "
                f"distributions named openenv-NAME), serve it from another venv "
                f"(openenv:{package}?python=/path/to/venv/bin/python), or give a running server's URL "
                "(openenv:http://host:port)"
            )
        manifest = package_manifest(package) if python is None else {}
        app = f"{package}.{manifest.get('app') or 'server.app:app'}"
        if python is None and importlib.util.find_spec(app.partition(":")[0]) is None:
            raise NameNotFound(
                f"{package!r} has no module {app.partition(':')[0]}: an OpenEnv env package serves its app from "
                f"{package}/server/app.py (or the 'app:' of its openenv.yaml)"
            )
        return app, manifest


SOURCE = OpenEnv()
