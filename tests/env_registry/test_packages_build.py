"""Env packages from scaffold to build: `molt-env init | check | build`, manifest validation, the content hash."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import zipfile

import pytest
from packaging_support import hatch_build, run_cli

from env_registry.errors import ManifestError
from env_registry.packages import names
from env_registry.packages.artifacts import InvalidArtifact, content_hash, inspect_release
from env_registry.packages.build import BuildError, build, read_source


@pytest.mark.parametrize("kind", ["env", "chat_agent"])
def test_init_check_build_through_the_cli(tmp_path, kind):
    src = tmp_path / "my_env"
    out = run_cli("init", str(src), "--id", "acme/cli-echo-v1", "--kind", kind)
    assert out.returncode == 0, out.stderr
    check = run_cli("check", str(src))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "manifest OK: acme-cli-echo 0.1.0 provides acme/cli-echo-v1" in check.stdout
    assert "0 failed" in check.stdout
    if kind == "env":  # the reference completion of every sampled row earned the top reward
        assert check.stdout.count("reference action: reward=1.0") == 3
    built = run_cli("build", str(src))
    assert built.returncode == 0, built.stderr
    info = json.loads(built.stdout)
    assert info["package"] == "acme-cli-echo" and info["env_ids"] == ["acme/cli-echo-v1"]
    with zipfile.ZipFile(info["wheel"]) as wheel:
        shipped = wheel.read("acme_cli_echo-0.1.0.dist-info/extra_metadata/molt/pyproject.toml").decode()
        entry_points = wheel.read("acme_cli_echo-0.1.0.dist-info/entry_points.txt").decode()
        assert "acme_cli_echo/data/train.jsonl" in wheel.namelist()
    assert shipped == (src / "pyproject.toml").read_text()
    assert '"acme/cli-echo-v1"' in shipped and "[molt.envs]" in entry_points
    assert content_hash(tmp_path / "my_env" / "dist" / "acme_cli_echo-0.1.0.tar.gz") == info["content_hash"]


def test_init_refuses_a_non_empty_directory_and_bad_ids(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    out = run_cli("init", str(tmp_path / "taken"), "--id", "acme/x-v1")
    assert out.returncode == 2 and "not empty" in out.stderr
    out = run_cli("init", str(tmp_path / "new"), "--id", "acme/../x-v1")
    assert out.returncode == 2 and "not a valid env ID" in out.stderr
    out = run_cli("init", str(tmp_path / "new"), "--id", "acme/x")
    assert out.returncode == 2 and "versioned env ID" in out.stderr


def test_check_of_a_source_tree_reports_a_broken_env(tmp_path):
    src = tmp_path / "broken"
    assert run_cli("init", str(src), "--id", "acme/broken-v1").returncode == 0
    env_py = src / "acme_broken" / "env.py"
    env_py.write_text(env_py.read_text().replace("reward=1.0 if exact else 0.0", "reward=5.0"))
    out = run_cli("check", str(src))
    assert out.returncode == 1
    assert "reward 5.0 outside the declared reward_range [0.0, 1.0]" in out.stdout
    pyproject = src / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('kind = "env"', 'kind = "robot"'))
    out = run_cli("check", str(src))
    assert out.returncode == 1 and "field 'kind'" in out.stdout and "'robot'" in out.stdout


def test_two_builds_of_one_tree_hash_the_same_and_content_changes_do_not(echo, tmp_path):
    src = tmp_path / "tree"
    shutil.copytree(echo.src, src, ignore=shutil.ignore_patterns("dist"))
    first = build(src, tmp_path / "a")
    second = build(src, tmp_path / "b")
    assert first.content_hash == second.content_hash == echo.releases["1.0.3"].content_hash
    assert echo.releases["1.0.2"].content_hash == echo.releases["1.0.3"].content_hash  # only the version differs
    assert len({echo.releases[v].content_hash for v in ("1.0.0", "1.0.1", "1.0.2")}) == 3
    data = src / "acme_echo" / "data" / "train.jsonl"
    data.write_text(data.read_text() + '{"text": "one more row"}\n')
    assert build(src, tmp_path / "c").content_hash != first.content_hash


def test_the_hash_ignores_archive_timestamps_and_order(echo, tmp_path):
    sdist = echo.releases["1.0.0"].sdist
    with tarfile.open(sdist, "r:gz") as tf:
        members = [(m, tf.extractfile(m).read() if m.isfile() else None) for m in tf.getmembers()]
    repacked = tmp_path / sdist.name
    with tarfile.open(repacked, "w:gz") as tf:
        for member, data in reversed(members):
            member.mtime += 12345
            tf.addfile(member, None if data is None else io.BytesIO(data))
    assert repacked.read_bytes() != sdist.read_bytes()
    assert content_hash(repacked) == echo.releases["1.0.0"].content_hash


MANIFEST = 'kind = "env"\n'  # the manifest's first line: more fields go after it


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        ([("reward_range = [0.0, 1.0]", "reward_range = [1.0, 0.0]")], ["field 'reward_range'", "[1.0, 0.0]"]),
        ([(MANIFEST, MANIFEST + 'id = "acme/../bad-v1"\n')], ["field 'id'", "'acme/../bad-v1'"]),
        ([('version = "0.1.0"', 'version = "not-a-version"')], ["'not-a-version'", "PEP 440"]),
        ([('name = "acme-bad"', 'name = "acme/../bad"')], ["package name", "'acme/../bad'"]),
        (  # the long form states the ID and entry point in the manifest too: they must match the entry points
            [
                (MANIFEST, MANIFEST + 'id = "acme/bad-v1"\nentry_point = "acme_bad.env:BadEnv"\n'),
                ('"acme/bad-v1" = "acme_bad.env:BadEnv"', '"acme/other-v1" = "acme_bad.env:BadEnv"'),
            ],
            ["'acme/bad-v1'", 'add "acme/bad-v1" = "acme_bad.env:BadEnv"'],
        ),
    ],
)
def test_manifest_validation_at_build_names_field_and_value(tmp_path, edits, expected):
    src = tmp_path / "bad"
    assert run_cli("init", str(src), "--id", "acme/bad-v1").returncode == 0
    pyproject = src / "pyproject.toml"
    text = pyproject.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    pyproject.write_text(text)
    out = run_cli("build", str(src))
    assert out.returncode == 2, out.stdout
    for needle in expected:
        assert needle in out.stderr
    assert not (src / "dist").exists()  # validation runs before anything is built


def test_a_wheel_without_the_shipped_manifest_is_refused(tmp_path):
    src = tmp_path / "nometa"
    assert run_cli("init", str(src), "--id", "acme/nometa-v1").returncode == 0
    pyproject = src / "pyproject.toml"
    text = pyproject.read_text()
    assert "[tool.hatch.build.hooks.molt]" in text
    pyproject.write_text(text.replace("[tool.hatch.build.hooks.molt]", ""))
    with pytest.raises(ManifestError, match="extra-metadata"):
        build(src, tmp_path / "out")


def test_the_build_hook_validates_the_manifest_whoever_builds(tmp_path):
    src = tmp_path / "hooked"
    assert run_cli("init", str(src), "--id", "acme/hooked-v1").returncode == 0
    pyproject = src / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("reward_range = [0.0, 1.0]", "reward_range = [1.0, 0.0]"))
    with pytest.raises(ManifestError, match=r"field 'reward_range'.*\[1\.0, 0\.0\]"):
        hatch_build(src, tmp_path / "out")  # hatchling itself, as pip or `python -m build` run it
    assert not list((tmp_path / "out").glob("*.whl"))


def test_source_without_pyproject_or_with_dynamic_version(tmp_path):
    with pytest.raises(BuildError, match="no pyproject.toml"):
        read_source(tmp_path)
    src = tmp_path / "dyn"
    assert run_cli("init", str(src), "--id", "acme/dyn-v1").returncode == 0
    pyproject = src / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'dynamic = ["version"]'))
    with pytest.raises(ManifestError, match=r"'project.version' must be a static string"):
        read_source(src)


def test_mismatched_or_malformed_artifacts_are_refused(echo, tmp_path):
    one, two = echo.releases["1.0.0"], echo.releases["1.0.1"]
    with pytest.raises(InvalidArtifact, match="does not match wheel"):
        inspect_release(one.wheel, two.sdist)
    garbage = tmp_path / "acme_echo-1.0.0-py3-none-any.whl"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(InvalidArtifact, match="not a readable wheel"):
        inspect_release(garbage, one.sdist)
    evil = tmp_path / "evil"
    evil.mkdir()
    sdist = evil / one.sdist.name
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(one.wheel, arcname="../../etc/evil")
    with pytest.raises(InvalidArtifact, match="outside"):
        content_hash(sdist)


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", "-lead", "trail-", "x" * 101, "a b", "ü", "a\x00b", ".."])
def test_package_names_reject_traversal_and_odd_characters(bad):
    with pytest.raises(names.InvalidName):
        names.package_name(bad)


@pytest.mark.parametrize(
    "bad",
    [
        "../x-1.0-py3-none-any.whl",
        "..",
        "x-1.0.zip",
        "x-1.0+local.tar.gz",
        ".hidden-1.0.tar.gz",
        "a\\b-1.0.tar.gz",
        "x-notaversion.tar.gz",
    ],
)
def test_file_names_reject_traversal_and_odd_forms(bad):
    with pytest.raises(names.InvalidName):
        names.distribution_file(bad)


def test_names_normalize():
    assert names.package_name("Acme_Echo.x") == "acme-echo-x"
    assert names.distribution_file("acme_echo-1.0.2-py3-none-any.whl") == ("acme-echo", "1.0.2", "wheel")
    assert names.package_version("1.0.0-RC1") == "1.0.0rc1"
