"""Session fixtures of the package and registry-server tests: scaffolded + built releases, a live server.

``packaging_support`` (their helpers) is importable by name.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib puts no test directory on sys.path

from packaging_support import make_venv, run_cli, set_version, start_server  # noqa: E402

from env_registry.artifacts import Release  # noqa: E402
from env_registry.build import build  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "envs" / "acme_letter_count"


@dataclass
class EchoBuilds:
    src: Path
    releases: dict[str, Release]  # 1.0.0, 1.0.1, 1.0.2 differ in content; 1.0.3 has the content of 1.0.2


@pytest.fixture(scope="session")
def echo(tmp_path_factory) -> EchoBuilds:
    """``molt-env init`` of acme/echo-v1, built with PyPA build at four versions (built once per session)."""
    root = tmp_path_factory.mktemp("echo")
    src = root / "acme_echo"
    out = run_cli("init", str(src), "--id", "acme/echo-v1")
    assert out.returncode == 0, out.stderr
    readme = (src / "README.md").read_text()
    releases = {}
    for version in ("1.0.0", "1.0.1", "1.0.2"):
        set_version(src, version)
        (src / "README.md").write_text(f"{readme}\nRelease {version}.\n")  # a real content change per version
        releases[version] = build(src, root / "dist" / version)
    set_version(src, "1.0.3")
    releases["1.0.3"] = build(src, root / "dist" / "1.0.3")
    return EchoBuilds(src, releases)


@pytest.fixture(scope="session")
def letter_count(tmp_path_factory) -> Release:
    """The example package examples/envs/acme_letter_count, built with PyPA build."""
    return build(EXAMPLE, tmp_path_factory.mktemp("letter-count-dist"))


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """``molt-env serve`` on loopback over a fresh registry directory, with a token for publisher 'acme'."""
    live = start_server(tmp_path_factory.mktemp("server") / "registry")
    yield live
    live.stop()


@pytest.fixture
def new_venv(tmp_path):
    """``new_venv(name)`` -> the python of a new venv (see ``packaging_support.make_venv``)."""
    return lambda name="venv": make_venv(tmp_path / name)
