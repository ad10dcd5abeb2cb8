"""Session fixtures of the package and registry-server tests: scaffolded + built releases, a live server, and
the two database backends (SQLite in the registry root; a throwaway PostgreSQL cluster, ``pg_cluster``).

``packaging_support`` and ``pg_cluster`` (their helpers) are importable by name. Tests that use ``server`` or
``make_registry`` run once per backend unless they pin one with
``@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib puts no test directory on sys.path

import pg_cluster  # noqa: E402
from packaging_support import hatch_build, make_venv, run_cli, set_version, start_server  # noqa: E402
from verifiers_support import vf_venv  # noqa: E402,F401  (the verifiers venv, one per session)

from env_registry.packages.artifacts import Release  # noqa: E402
from env_registry.packages.build import build  # noqa: E402
from env_registry.packages.scaffold import init  # noqa: E402
from env_registry.store.local import LocalRegistry  # noqa: E402

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


# A README written to run code in a reader's browser: every payload must arrive inert on the package page.
XSS_README = """# Hostile README

Some **bold** text, a table and a [good link](https://example.com/docs).

| column | value |
|--------|-------|
| a      | 1     |

<script>window.__xss = 1; alert("script")</script>
<img src="x" onerror="window.__xss = 1; alert('onerror')">
<a href="javascript:window.__xss=1;alert('href')">javascript link</a>
[markdown javascript link](javascript:window.__xss=1)
<a href="JaVaScRiPt:window.__xss=1">mixed-case scheme</a>
<a href="java&#x09;script:window.__xss=1">entity-split scheme</a>
<svg onload="window.__xss=1"><circle r="4"/></svg>
<iframe src="javascript:window.__xss=1"></iframe>
<object data="javascript:window.__xss=1"></object>
<embed src="javascript:window.__xss=1">
<math><mtext><table><mglyph><style><img src=x onerror="window.__xss=1"></style></mglyph></table></mtext></math>
<div style="background:url(javascript:window.__xss=1)" onmouseover="window.__xss=1">hover me</div>
<form action="/logout" method="post"><button formaction="javascript:window.__xss=1">press</button></form>
<meta http-equiv="refresh" content="0;url=javascript:window.__xss=1">
<base href="javascript:window.__xss=1//">
<details open ontoggle="window.__xss=1"><summary>toggle</summary>d</details>
<a href="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==">data link</a>
<noscript><p title="</noscript><img src=x onerror=window.__xss=1>"></noscript>
<input autofocus onfocus="window.__xss=1">
<video><source onerror="window.__xss=1"></video>
"""


@pytest.fixture(scope="session")
def hostile(tmp_path_factory) -> Release:
    """acme-hostile 0.1.0 (acme/hostile-v1): an XSS README, and markup in its manifest's description and tags."""
    root = tmp_path_factory.mktemp("hostile")
    src = init(root / "src", "acme/hostile-v1", package="acme-hostile")
    (src / "README.md").write_text(XSS_README)
    pyproject = (src / "pyproject.toml").read_text()
    pyproject = pyproject.replace(
        'tags = ["echo", "single-turn", "text"]', 'tags = ["echo", "<img src=x onerror=window.__xss=1>"]'
    )
    # the [project] description (the summary) and the manifest's
    (src / "pyproject.toml").write_text(
        pyproject.replace('description = "', 'description = "<script>window.__xss=1</script>', 2)
    )
    return hatch_build(src, root / "dist")


@pytest.fixture(scope="session")
def hub_demo(tmp_path_factory) -> dict[str, Release]:
    """hub-demo 1.0.0 and 1.1.0 (hub/demo-v1), the pages' example package."""
    root = tmp_path_factory.mktemp("hub-demo")
    src = init(root / "src", "hub/demo-v1", package="hub-demo")
    built = {}
    for version in ("1.0.0", "1.1.0"):
        set_version(src, version)
        (src / "README.md").write_text(f"# Hub demo\n\nThe demo env, release **{version}**.\n")
        built[version] = hatch_build(src, root / version)
    return built


@pytest.fixture(scope="session")
def hub_versions(tmp_path_factory) -> dict[str, Release]:
    """hub-versions 1.0.0 and 1.1.0 (hub/versions-v1): the env whose versions the hub compares (its own package, so
    the verdicts and evals its tests store change no other test's pages)."""
    root = tmp_path_factory.mktemp("hub-versions")
    src = init(root / "src", "hub/versions-v1", package="hub-versions")
    built = {}
    for version in ("1.0.0", "1.1.0"):
        set_version(src, version)
        (src / "README.md").write_text(f"# Hub versions\n\nRelease {version}.\n")
        built[version] = hatch_build(src, root / version)
    return built


@pytest.fixture(scope="session")
def private_server(tmp_path_factory):
    """``molt-env serve --private`` (SQLite), with a token for publisher 'acme'."""
    live = start_server(tmp_path_factory.mktemp("private") / "registry", "--private")
    yield live
    live.stop()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL cluster of this test session (started on first use, removed at the end)."""
    cluster = pg_cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def backend(request) -> str:
    """The registry database of a test: the SQLite file in the root, or a PostgreSQL database."""
    return request.param


@pytest.fixture(scope="session")
def server(tmp_path_factory, backend, request):
    """``molt-env serve`` on loopback over a fresh registry directory (and a fresh database on PostgreSQL), with a
    token for publisher 'acme'."""
    db = request.getfixturevalue("postgres").new_database() if backend == "postgresql" else None
    live = start_server(tmp_path_factory.mktemp(f"server-{backend}") / "registry", *(["--db", db] if db else []))
    yield live
    live.stop()


@pytest.fixture
def make_registry(backend, request):
    """``make_registry(root)`` -> a ``LocalRegistry`` over ``root`` on this test's backend; the same root gives the
    same database (a new PostgreSQL database per root)."""
    databases: dict[str, str | None] = {}
    opened: list[LocalRegistry] = []

    def make(root) -> LocalRegistry:
        key = str(root)
        if key not in databases:
            databases[key] = request.getfixturevalue("postgres").new_database() if backend == "postgresql" else None
        opened.append(LocalRegistry(root, db=databases[key]))
        return opened[-1]

    yield make
    for registry in opened:
        registry.close()


@pytest.fixture
def new_venv(tmp_path):
    """``new_venv(name)`` -> the python of a new venv (see ``packaging_support.make_venv``)."""
    return lambda name="venv": make_venv(tmp_path / name)
