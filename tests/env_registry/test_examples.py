"""The example env packages of examples/envs/ (the long form and the minimal one) and a fresh `molt-env init`, as a
user gets them: each builds, installs into a fresh venv, makes, passes `molt-env check` there and passes its own
tests there."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from packaging_support import in_venv, run_cli

from env_registry.manifest import read_pyproject_manifests
from env_registry.packages.build import build
from env_registry.registry import MANIFEST_METADATA_PATH

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "envs"
COPY_IGNORE = shutil.ignore_patterns("dist", "build", "__pycache__", ".pytest_cache")


@pytest.mark.parametrize(
    ("source", "env_id", "made", "own_tests"),
    [
        ("acme_letter_count", "acme/letter-count-v1", ["LetterCountEnv", "acme-letter-count", "16"], 9),
        ("acme_letter_count_mini", "acme/letter-count-mini-v1", ["LetterCountEnv", "acme-letter-count-mini", "16"], 1),
        ("init", "acme/init-echo-v1", ["InitEchoEnv", "acme-init-echo", "4"], 2),
    ],
)
def test_a_package_builds_installs_makes_checks_and_passes_its_own_tests(
    source, env_id, made, own_tests, tmp_path, new_venv
):
    src = tmp_path / "src"
    if source == "init":
        assert run_cli("init", str(src), "--id", env_id).returncode == 0
    else:
        shutil.copytree(EXAMPLES / source, src, ignore=COPY_IGNORE)
    release = build(src, tmp_path / "dist")
    assert release.env_ids == [env_id]
    with zipfile.ZipFile(release.wheel) as wheel:  # the manifest travels in the wheel's metadata
        (shipped,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{MANIFEST_METADATA_PATH}")]
        assert wheel.read(shipped).decode() == (src / "pyproject.toml").read_text()
    python = new_venv()
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check"]
    installed = subprocess.run([*pip, str(release.wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    out = in_venv(
        python,
        f"import env_registry as e; env = e.make({env_id!r}); "
        "print(type(env).__name__, env.spec.package, len(e.load_split(env.spec, 'test')))",
    )
    assert out.stdout.split() == made, out.stderr
    checked = subprocess.run(
        [str(python), "-m", "env_registry.cli", "check", env_id], capture_output=True, text=True, timeout=300
    )
    assert checked.returncode == 0 and "reference action: reward=1.0" in checked.stdout, checked.stdout
    assert " 0 failed" in checked.stdout
    tests = subprocess.run(  # without this venv's pytest plugins (a package's tests need none of them): 4x faster
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(src / "tests")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert tests.returncode == 0 and f"{own_tests} passed" in tests.stdout, tests.stdout + tests.stderr


def test_the_minimal_example_declares_what_the_long_one_does():
    (long,) = read_pyproject_manifests(EXAMPLES / "acme_letter_count" / "pyproject.toml")
    (mini,) = read_pyproject_manifests(EXAMPLES / "acme_letter_count_mini" / "pyproject.toml")
    assert (mini.id, mini.entry_point) == ("acme/letter-count-mini-v1", "acme_letter_count_mini:LetterCountEnv")
    assert mini.datasets == long.datasets  # keys and template written once, given to both splits
    same = ("kind", "reward_range", "deterministic", "modality", "tools", "lifecycle", "kwargs")
    assert mini.model_dump(include=set(same)) == long.model_dump(include=set(same))
