"""The local directory registry: publish rules, yank, resolution, search, install into a fresh venv."""

from __future__ import annotations

import shutil
import threading

import pytest
from packaging_support import hatch_build, in_venv, run_cli, set_version

from env_registry.packages.scaffold import init
from env_registry.store.local import Conflict, LocalRegistry, NotFound


def test_publish_rules_yank_and_resolution(echo, tmp_path, make_registry):
    registry = make_registry(tmp_path / "reg")
    r = echo.releases
    registry.publish(r["1.0.0"])
    with pytest.raises(Conflict, match=r"acme-echo 1.0.0 is already published \(with the same content\)"):
        registry.publish(r["1.0.0"])
    registry.publish(r["1.0.1"])
    registry.publish(r["1.0.2"])
    with pytest.raises(Conflict, match="same content .* as the published version 1.0.2.*--allow-same-content"):
        registry.publish(r["1.0.3"])
    assert registry.resolve("acme/echo-v1").version == "1.0.2"
    assert registry.publish(r["1.0.3"], allow_same_content=True).version == "1.0.3"
    assert registry.resolve("acme/echo-v1").version == "1.0.3"
    assert registry.resolve("acme/echo").version == "1.0.3"  # unversioned: the highest -vN
    registry.yank("acme-echo", "1.0.3", "same as 1.0.2")
    registry.yank("acme-echo", "1.0.2", "wrong grader")
    assert registry.resolve("acme/echo-v1").version == "1.0.1"
    pinned = registry.resolve("acme/echo-v1@1.0.2")
    assert pinned.yanked and pinned.yanked_reason == "wrong grader"
    with pytest.raises(NotFound, match="has no package version 9.9"):
        registry.resolve("acme/echo-v1@9.9")
    with pytest.raises(NotFound, match="no package .* provides env ID 'acme/nope-v1'"):
        registry.resolve("acme/nope-v1")
    package = registry.package("Acme_Echo")
    assert [v.version for v in package.releases] == ["1.0.0", "1.0.1", "1.0.2", "1.0.3"]
    assert package.latest == "1.0.1" and package.env_ids == ["acme/echo-v1"]
    [index] = registry.env_ids()
    assert (index.env_id, index.package, index.versions, index.latest) == (
        "acme/echo-v1",
        "acme-echo",
        ["1.0.0", "1.0.1", "1.0.2", "1.0.3"],
        "1.0.1",
    )
    assert [p.name for p in registry.search("ECHO")] == ["acme-echo"]  # name, env ID, description and tags
    assert [p.name for p in registry.search("single-turn")] == ["acme-echo"]
    assert registry.search("nothing-like-this") == []
    # every file sits where the catalogue says, with the hash it says
    for release in package.releases:
        for file in release.files:
            assert registry.file_path("acme-echo", file.filename).stat().st_size == file.size


def test_a_version_with_different_content_is_refused(echo, tmp_path, make_registry):
    registry = make_registry(tmp_path / "reg")
    registry.publish(echo.releases["1.0.1"])
    src = tmp_path / "changed"
    shutil.copytree(echo.src, src, ignore=shutil.ignore_patterns("dist"))
    set_version(src, "1.0.1")
    (src / "README.md").write_text("different content under the same version\n")
    changed = hatch_build(src, tmp_path / "out")
    assert changed.content_hash != echo.releases["1.0.1"].content_hash
    with pytest.raises(Conflict, match=r"1.0.1 is already published \(with different content\).*immutable"):
        registry.publish(changed)
    assert registry.release("acme-echo", "1.0.1").content_hash == echo.releases["1.0.1"].content_hash


def test_an_env_id_belongs_to_one_package(echo, tmp_path, make_registry):
    registry = make_registry(tmp_path / "reg")
    registry.publish(echo.releases["1.0.0"])
    impostor = init(tmp_path / "impostor", "acme/echo-v1", package="evil-echo")
    with pytest.raises(Conflict, match="env ID 'acme/echo-v1' is already provided by package 'acme-echo'"):
        registry.publish(hatch_build(impostor, tmp_path / "out"))
    squatter = init(tmp_path / "squatter", "acme/echo-v9", package="evil-echo")  # would win unversioned installs
    with pytest.raises(Conflict, match="env 'acme/echo' is already provided by package 'acme-echo'"):
        registry.publish(hatch_build(squatter, tmp_path / "out2"))
    assert registry.resolve("acme/echo-v1").package == registry.resolve("acme/echo").package == "acme-echo"


def test_concurrent_publishes_of_one_version_one_wins(echo, tmp_path, make_registry):
    registry_root = tmp_path / "reg"
    make_registry(registry_root)
    variants = []
    for i in range(6):
        src = tmp_path / f"variant{i}"
        shutil.copytree(echo.src, src, ignore=shutil.ignore_patterns("dist"))
        set_version(src, "3.0.0")
        (src / "README.md").write_text(f"variant {i}\n")
        variants.append(hatch_build(src, tmp_path / f"out{i}"))
    barrier = threading.Barrier(len(variants))
    outcomes: list[str] = []

    def publish(release):
        registry = make_registry(registry_root)  # its own connections, as separate processes would have
        barrier.wait()
        try:
            registry.publish(release)
            outcomes.append(release.content_hash)
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=publish, args=(v,)) for v in variants]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o != "conflict"]
    assert len(winners) == 1 and outcomes.count("conflict") == 5
    registry = make_registry(registry_root)
    assert registry.release("acme-echo", "3.0.0").content_hash == winners[0]
    files = sorted(p.name for p in (registry_root / "files" / "acme-echo").iterdir())
    assert files == ["acme_echo-3.0.0-py3-none-any.whl", "acme_echo-3.0.0.tar.gz"]
    assert not list((registry_root / "staging").iterdir())


def test_cli_publish_search_yank_install_from_a_directory(echo, tmp_path, new_venv):
    reg = str(tmp_path / "reg")
    out = run_cli("publish", str(echo.src), "--registry", reg)  # echo.src is at version 1.0.3
    assert out.returncode == 0, out.stderr
    assert "published acme-echo 1.0.3 (acme/echo-v1)" in out.stdout
    again = run_cli("publish", str(echo.src), "--registry", reg)
    assert again.returncode == 2 and "already published" in again.stderr
    LocalRegistry(reg).publish(echo.releases["1.0.0"])
    found = run_cli("search", "echo", "--registry", reg)
    assert found.returncode == 0 and "acme-echo 1.0.3  acme/echo-v1" in found.stdout
    python = new_venv()
    installed = run_cli("install", "acme/echo-v1", "--registry", reg, "--python", str(python))
    assert installed.returncode == 0, installed.stderr
    assert "installed acme-echo 1.0.3" in installed.stdout and "verified" in installed.stdout
    made = in_venv(
        python,
        "import env_registry as e; env = e.make('acme/echo-v1'); "
        "print(env.spec.package, env.spec.package_version, type(env).__name__)",
    )
    assert made.stdout.split() == ["acme-echo", "1.0.3", "EchoEnv"], made.stderr
    yanked = run_cli("yank", "acme/echo-v1@1.0.3", "--registry", reg, "--reason", "wrong grader")
    assert yanked.returncode == 0 and "yanked acme-echo 1.0.3: wrong grader" in yanked.stdout
    assert LocalRegistry(reg).resolve("acme/echo-v1").version == "1.0.0"
    no_pin = run_cli("yank", "acme/echo-v1", "--registry", reg)
    assert no_pin.returncode == 2 and "exact package version" in no_pin.stderr
