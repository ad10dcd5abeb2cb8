"""Discovery through `molt.envs` entry points of packages installed with real pip, read lazily.

Two fixture packages are built from source and pip-installed into a target directory; a fresh interpreter with
that directory on its path lists IDs without importing any env module, and `make()` of one env imports only it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"
[project]
name = "{dist}"
version = "{version}"
[project.entry-points."molt.envs"]
"{env_id}" = "{pkg}.env:TheEnv"
[tool.hatch.build.targets.wheel]
packages = ["{pkg}"]
[tool.hatch.build.targets.wheel.extra-metadata]
"pyproject.toml" = "molt/pyproject.toml"
[tool.molt.env]
id = "{env_id}"
entry_point = "{pkg}.env:TheEnv"
description = "fixture env {pkg}"
max_turns = 2
reward_range = [0.0, 2.0]
[tool.molt.env.datasets.train]
path = "data/train.jsonl"
"""

ENV_MODULE = """
from molt_envs import Env, Result

class TheEnv(Env):
    def __init__(self, bonus=0.0):
        self.bonus = bonus

    async def step(self, state):
        return Result(reward=1.0 + self.bonus)
"""


def make_package(root: Path, dist: str, pkg: str, env_id: str, version: str) -> Path:
    src = root / dist
    (src / pkg / "data").mkdir(parents=True)
    (src / "pyproject.toml").write_text(PYPROJECT.format(dist=dist, pkg=pkg, env_id=env_id, version=version))
    (src / pkg / "__init__.py").write_text("")
    (src / pkg / "env.py").write_text(ENV_MODULE)
    (src / pkg / "data" / "train.jsonl").write_text('{"prompt": "hi", "label": "x"}\n{"prompt": "yo", "label": "y"}\n')
    return src


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fixture_pkgs")
    target = root / "site"
    for dist, pkg, env_id in [
        ("fixture-alpha", "fixture_alpha", "fix/alpha-v1"),
        ("fixture-beta", "fixture_beta", "fix/beta-v2"),
    ]:
        src = make_package(root, dist, pkg, env_id, "1.2.0")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "--target",
                str(target),
                str(src),
            ],
            check=True,
            capture_output=True,
        )
    return target


def run_in_fresh_interpreter(site: Path, code: str) -> dict:
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_listing_reads_metadata_only(site):
    result = run_in_fresh_interpreter(
        site,
        """
        import json, sys, env_registry
        ids = sorted(env_registry.registry)
        spec = env_registry.spec("fix/alpha-v1")
        print(json.dumps({"ids": ids, "imported": sorted(m for m in sys.modules if m.startswith("fixture_")),
                          "package": spec.package, "version": spec.package_version, "max_turns": spec.max_turns,
                          "description": spec.description, "range": spec.reward_range}))
    """,
    )
    assert {"fix/alpha-v1", "fix/beta-v2", "molt/gsm8k-v1"} <= set(result["ids"])
    assert result["imported"] == []  # nothing imported to list or describe
    assert (result["package"], result["version"], result["max_turns"]) == ("fixture-alpha", "1.2.0", 2)
    assert result["description"] == "fixture env fixture_alpha" and result["range"] == [0.0, 2.0]


def test_make_imports_only_that_env(site):
    result = run_in_fresh_interpreter(
        site,
        """
        import asyncio, json, sys, env_registry
        env = env_registry.make("fix/alpha-v1", bonus=0.5)
        r = asyncio.run(env.step({"action_text": "", "observation_text": "", "label": None}))
        rows = env_registry.load_split(env.spec, "train")
        print(json.dumps({"reward": r.reward, "imported": sorted(m for m in sys.modules if m.startswith("fixture_")),
                          "rows": len(rows), "first": rows[0]["prompt"], "pinned": env_registry.spec("fix/beta-v2@1.2.0").id}))
    """,
    )
    assert result["reward"] == 1.5
    assert result["imported"] == ["fixture_alpha", "fixture_alpha.env"]  # beta was never imported
    assert result["rows"] == 2 and result["first"] == [{"role": "user", "content": "hi"}]
    assert result["pinned"] == "fix/beta-v2"


def test_check_cli_on_an_installed_package(site):
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "env_registry.cli", "check", "fix/alpha-v1"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stdout
    assert "conformance report for fix/alpha-v1 (fixture-alpha 1.2.0)" in out.stdout
    assert "PASS  row 1: garbage action: reward=1.0" in out.stdout
