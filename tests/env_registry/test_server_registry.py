"""The registry server as users meet it: `molt-env serve` under uvicorn on loopback, the CLI, real pip in new venvs."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from packaging_support import hatch_build, in_venv, rewrite_wheel, run_cli, start_server

from env_registry.packages.scaffold import init
from env_registry.store.client import RegistryClient
from env_registry.store.local import Conflict, Forbidden

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))


def ensure_published(server, release) -> None:
    """Publish unless this exact release is already there (tests share one server and may run in any order)."""
    try:
        RegistryClient(server.url, server.token).publish(release)
    except Conflict as exc:
        assert "with the same content" in str(exc), exc


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # backend-independent; heavy: run once
def test_publish_install_make_yank_through_the_server(server, echo, new_venv):
    client = RegistryClient(server.url, server.token)
    for version in ("1.0.0", "1.0.1"):
        ensure_published(server, echo.releases[version])
    out = run_cli(
        "publish", str(echo.src), "--registry", server.url, "--token", server.token, "--allow-same-content"
    )  # the tree is at 1.0.3, whose content nobody published here yet
    assert out.returncode == 0, out.stderr
    with pytest.raises(Conflict, match="same content"):
        client.publish(echo.releases["1.0.2"])  # 1.0.2 has the content of 1.0.3
    client.publish(echo.releases["1.0.2"], allow_same_content=True)

    found = run_cli("search", "echo", "--registry", server.url)
    assert found.returncode == 0 and "acme-echo 1.0.3  acme/echo-v1" in found.stdout

    python = new_venv()
    out = run_cli("install", "acme/echo-v1", "--registry", server.url, "--python", str(python))
    assert out.returncode == 0, out.stderr
    assert "installed acme-echo 1.0.3" in out.stdout
    code = (
        "import env_registry as e; env = e.make('acme/echo-v1'); print(env.spec.package_version); "
        "print(e.make('acme/echo-v1@1.0.3').spec.hash)\n"
        "try:\n    e.make('acme/echo-v1@1.0.1')\nexcept e.PackageVersionMismatch as exc:\n    print('mismatch', exc)"
    )
    made = in_venv(python, code)
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    assert lines[0] == "1.0.3" and "mismatch" in lines[2] and "molt-env install acme/echo-v1@1.0.1" in lines[2]

    out = run_cli(
        "yank", "acme/echo-v1@1.0.3", "--registry", server.url, "--token", server.token, "--reason", "wrong grader"
    )
    assert out.returncode == 0, out.stderr
    page = httpx.get(f"{server.url}/simple/acme-echo/").text
    assert re.search(r'acme_echo-1\.0\.3-py3-none-any\.whl#sha256=[0-9a-f]{64}"[^>]*data-yanked="wrong grader"', page)
    assert client.resolve("acme/echo-v1").version == "1.0.2"
    out = run_cli("install", "acme/echo-v1@1.0.1", "--registry", server.url, "--python", str(python))
    assert out.returncode == 0, out.stderr
    out = run_cli("install", "acme/echo-v1@1.0.3", "--registry", server.url, "--python", str(python))
    assert out.returncode == 0 and "is yanked: wrong grader" in out.stderr  # an exact pin still installs it
    assert (
        in_venv(
            python, "import env_registry as e; print(e.make('acme/echo-v1@1.0.3').spec.package_version)"
        ).stdout.strip()
        == "1.0.3"
    )
    # installed into the new venv only, not into the interpreter running the tests
    assert subprocess.run([sys.executable, "-c", "import acme_echo"], capture_output=True).returncode != 0


def test_plain_pip_installs_from_the_simple_index(server, letter_count, new_venv):
    ensure_published(server, letter_count)  # the eval tests publish it to the session's server too
    page = httpx.get(f"{server.url}/simple/acme-letter-count/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    wheel_sha = next(
        f.sha256 for f in RegistryClient(server.url).resolve("acme/letter-count-v1").files if f.kind == "wheel"
    )
    assert f"#sha256={wheel_sha}" in page.text and 'data-requires-python="&gt;=3.11"' in page.text
    assert httpx.get(f"{server.url}/simple/Acme_Letter.Count/", follow_redirects=False).status_code == 301
    python = new_venv()
    pip = in_venv(
        python,
        "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install', "
        f"'--disable-pip-version-check', '--index-url', '{server.url}/simple/', 'acme-letter-count']))",
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    made = in_venv(
        python,
        "import env_registry as e; env = e.make('acme/letter-count-v1'); "
        "print(env.spec.package, env.spec.package_version, env.spec.datasets['test'].path)",
    )
    assert made.stdout.split() == ["acme-letter-count", "1.0.0", "data/test.jsonl"], made.stderr


def test_the_package_scoped_index_serves_only_its_package(server, echo):
    ensure_published(server, echo.releases["1.0.0"])
    scoped = httpx.get(f"{server.url}/p/acme-echo/simple/")
    assert (
        scoped.status_code == 200 and scoped.text.count("<a ") == 1 and "/p/acme-echo/simple/acme-echo/" in scoped.text
    )
    assert "acme_echo-1.0.0-py3-none-any.whl#sha256=" in httpx.get(f"{server.url}/p/acme-echo/simple/acme-echo/").text
    # a dependency name asked of this index is never answered here: pip falls through to its other index
    for other in ("numpy", "acme-letter-count", "requests"):
        assert httpx.get(f"{server.url}/p/acme-echo/simple/{other}/").status_code == 404


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # backend-independent; heavy: run once
def test_a_tampered_file_is_refused(server, tmp_path, new_venv):
    src = init(tmp_path / "tamper", "acme/tamper-v1")
    release = hatch_build(src, tmp_path / "dist")
    RegistryClient(server.url, server.token).publish(release)
    stored = server.root / "files" / "acme-tamper" / release.wheel.name
    evil = rewrite_wheel(
        stored,
        tmp_path / release.wheel.name,
        "acme_tamper/env.py",
        lambda text: text + "\nimport os  # injected after publishing\n",
    )
    shutil.copyfile(evil, stored)
    python = new_venv()
    out = run_cli("install", "acme/tamper-v1", "--registry", server.url, "--python", str(python))
    assert out.returncode == 2 and "refusing to install it" in out.stderr and "sha256" in out.stderr
    pip = in_venv(
        python,
        "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install', "
        f"'--disable-pip-version-check', '--index-url', '{server.url}/simple/', 'acme-tamper']))",
    )
    assert pip.returncode != 0 and "HASH" in (pip.stdout + pip.stderr).upper()
    assert in_venv(python, "import acme_tamper").returncode != 0


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # reads registry.db; test_hub_postgres covers PostgreSQL
def test_tokens_missing_invalid_revoked_and_foreign(server, echo, tmp_path):
    files = {"wheel": ("acme_echo-9.0.0-py3-none-any.whl", b"x"), "sdist": ("acme_echo-9.0.0.tar.gz", b"x")}
    missing = httpx.post(f"{server.url}/api/packages", files=files)
    assert missing.status_code == 401 and "needs a token" in missing.json()["detail"]
    assert "WWW-Authenticate" in missing.headers
    wrong = httpx.post(f"{server.url}/api/packages", files=files, headers={"Authorization": "Bearer molt_nope"})
    assert wrong.status_code == 403 and "unknown or revoked" in wrong.json()["detail"]
    assert httpx.post(f"{server.url}/api/packages/acme-echo/1.0.0/yank", json={"reason": "x"}).status_code == 401

    minted = run_cli("token", "mint", "--root", str(server.root), "--publisher", "mallory")
    assert minted.returncode == 0, minted.stderr
    token_id = int(re.search(r"token (\d+)", minted.stdout)[1])
    mallory = RegistryClient(server.url, minted.stdout.strip().splitlines()[-1])
    src = tmp_path / "takeover"
    shutil.copytree(echo.src, src, ignore=shutil.ignore_patterns("dist"))
    (src / "README.md").write_text("takeover attempt\n")
    src_text = (src / "pyproject.toml").read_text()
    (src / "pyproject.toml").write_text(re.sub(r'(?m)^version = ".*"$', 'version = "7.0.0"', src_text, count=1))
    takeover = hatch_build(src, tmp_path / "out")
    ensure_published(server, echo.releases["1.0.0"])
    with pytest.raises(Forbidden, match="belongs to publisher 'acme', not 'mallory'"):
        mallory.publish(takeover)
    with pytest.raises(Forbidden, match="belongs to publisher 'acme'"):
        mallory.yank("acme-echo", "1.0.0", "mine now")
    assert run_cli("token", "revoke", str(token_id), "--root", str(server.root)).returncode == 0
    listed = run_cli("token", "list", "--root", str(server.root)).stdout
    assert f"{token_id}\tmallory\trevoked" in listed and "acme\tactive" in listed
    with pytest.raises(Forbidden, match="unknown or revoked"):
        mallory.publish(takeover)
    assert "molt_" not in (server.root / "registry.db").read_bytes().decode("latin-1")  # only digests are stored


@pytest.mark.parametrize(
    "path",
    [
        "/api/packages/%2E%2E",
        "/api/packages/acme%3Becho",
        "/api/packages/a%20b/1.0",
        "/files/%2E%2E/registry.db",
        "/files/acme-echo/%2E%2E",
        "/files/acme-echo/.registry.db",
        "/simple/%2E%2E/",
        "/p/%2E%2E/simple/",
        "/api/resolve?env_id=../../etc",
        "/api/resolve?env_id=acme/echo-v1@1.0%2Bevil",
    ],
)
def test_traversal_and_odd_names_are_400(server, path):
    response = httpx.get(server.url + path)
    assert response.status_code == 400, (path, response.status_code, response.text)
    assert re.search(r"invalid|not a valid|refuse", response.json()["detail"]), response.text


@pytest.mark.parametrize(
    "path",
    [
        "/api/packages/acme-echo/..%2F..",
        "/files/acme-echo/..%2F..%2Fregistry.db",
        "/files/acme-echo/..%2Fregistry.db",
        "/simple/..%2F..%2F/",
    ],
)
def test_encoded_slashes_never_reach_a_file(server, path):
    response = httpx.get(server.url + path)
    assert response.status_code in (400, 404), (path, response.status_code)
    assert b"SQLite" not in response.content


def test_uploads_with_bad_names_or_manifests_are_400(server, echo, tmp_path):
    headers = {"Authorization": f"Bearer {server.token}"}
    good = echo.releases["1.0.0"]

    def upload(wheel_name, wheel_bytes, sdist_name=good.sdist.name, sdist_bytes=None):
        files = {"wheel": (wheel_name, wheel_bytes), "sdist": (sdist_name, sdist_bytes or good.sdist.read_bytes())}
        return httpx.post(f"{server.url}/api/packages", files=files, headers=headers)

    traversal = upload("../../acme_echo-1.0.0-py3-none-any.whl", good.wheel.read_bytes())
    assert traversal.status_code == 400 and "file name" in traversal.json()["detail"]
    evil_manifest = rewrite_wheel(
        good.wheel,
        tmp_path / good.wheel.name,
        "extra_metadata/molt/pyproject.toml",
        lambda text: text.replace('"acme/echo-v1" = ', '"../../evil-v1" = '),  # the manifest takes its id from here
    )
    bad = upload(good.wheel.name, evil_manifest.read_bytes())
    assert bad.status_code == 400 and "field 'id'" in bad.json()["detail"] and "../../evil-v1" in bad.json()["detail"]
    (tmp_path / "r").mkdir()
    bad_range = rewrite_wheel(
        good.wheel,
        tmp_path / "r" / good.wheel.name,
        "extra_metadata/molt/pyproject.toml",
        lambda text: text.replace("reward_range = [0.0, 1.0]", "reward_range = [2.0, 1.0]"),
    )
    bad = upload(good.wheel.name, bad_range.read_bytes())
    assert bad.status_code == 400 and "field 'reward_range'" in bad.json()["detail"]
    assert upload(good.wheel.name, b"not a zip").status_code == 400
    swapped = upload(good.sdist.name, good.sdist.read_bytes(), good.wheel.name, good.wheel.read_bytes())
    assert swapped.status_code == 400


def test_private_server_and_upload_limit(tmp_path, echo):
    private = start_server(tmp_path / "private", "--private", "--max-upload-mb", "0.01")
    try:
        assert httpx.get(f"{private.url}/api/packages").status_code == 401
        assert httpx.get(f"{private.url}/simple/").status_code == 401
        auth = {"Authorization": f"Bearer {private.token}"}
        assert httpx.get(f"{private.url}/api/packages", headers=auth).status_code == 200
        assert httpx.get(f"{private.url}/simple/", auth=("__token__", private.token)).status_code == 200  # pip's way
        assert httpx.get(f"{private.url}/simple/", auth=("__token__", "molt_wrong")).status_code == 403
        big = {"wheel": ("acme_echo-1.0.0-py3-none-any.whl", b"0" * 20_000), "sdist": ("acme_echo-1.0.0.tar.gz", b"0")}
        too_large = httpx.post(f"{private.url}/api/packages", files=big, headers=auth)
        assert too_large.status_code == 413 and "at most 10485 bytes" in too_large.json()["detail"]
        client = RegistryClient(private.url, private.token)
        client.publish(echo.releases["1.0.0"])  # a few KB: under the limit
        assert client.resolve("acme/echo-v1").version == "1.0.0"
    finally:
        private.stop()


def test_twenty_concurrent_publishes_leave_a_consistent_index(server, tmp_path):
    releases = []
    for i in range(16):
        releases.append(hatch_build(init(tmp_path / f"c{i}", f"conc/pkg{i}-v1"), tmp_path / f"d{i}"))
    racers = []
    for i in range(4):  # four different trees of one package version: exactly one may win
        src = init(tmp_path / f"race{i}", "conc/race-v1")
        (src / "README.md").write_text(f"racer {i}\n")
        racers.append(hatch_build(src, tmp_path / f"r{i}"))
    barrier = threading.Barrier(20)
    results: dict[str, list] = {"ok": [], "conflict": [], "other": []}

    def publish(release):
        client = RegistryClient(server.url, server.token)
        barrier.wait()
        try:
            results["ok"].append(client.publish(release))
        except Conflict as exc:
            results["conflict"].append(str(exc))
        except Exception as exc:  # noqa: BLE001 - recorded and asserted empty below
            results["other"].append(repr(exc))

    threads = [threading.Thread(target=publish, args=(r,)) for r in releases + racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["other"] == []
    assert len(results["ok"]) == 17 and len(results["conflict"]) == 3
    assert all("409" in c and "conc-race 0.1.0 is already published" in c for c in results["conflict"])
    winner = next(r for r in results["ok"] if r.package == "conc-race")
    packages = {p["name"]: p for p in httpx.get(f"{server.url}/api/packages").json() if p["name"].startswith("conc-")}
    assert len(packages) == 17
    root_index = httpx.get(f"{server.url}/simple/").text
    for name in packages:
        assert f'/simple/{name}/"' in root_index
        page = httpx.get(f"{server.url}/simple/{name}/").text
        links = re.findall(r'href="([^"#]+)#sha256=([0-9a-f]{64})"', page)
        assert len(links) == 2 and all(f"/files/{name}/" in href for href, _ in links)
        for href, sha256 in links:
            assert hashlib.sha256(httpx.get(server.url + href).content).hexdigest() == sha256
    assert RegistryClient(server.url).resolve("conc/race-v1").content_hash == winner.content_hash
    assert winner.content_hash in {r.content_hash for r in racers}
    for i in range(16):
        assert RegistryClient(server.url).resolve(f"conc/pkg{i}-v1").package == f"conc-pkg{i}"
    env_index = {e["env_id"]: e for e in httpx.get(f"{server.url}/api/envs").json() if e["env_id"].startswith("conc/")}
    assert len(env_index) == 17 and env_index["conc/race-v1"] == {
        "env_id": "conc/race-v1",
        "package": "conc-race",
        "versions": ["0.1.0"],
        "latest": "0.1.0",
    }
    assert sorted(p.name for p in (server.root / "files" / "conc-race").iterdir()) == [
        "conc_race-0.1.0-py3-none-any.whl",
        "conc_race-0.1.0.tar.gz",
    ]
    assert not list((server.root / "staging").iterdir())


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # backend-independent; heavy: run once
def test_openapi_fuzz_finds_no_server_errors(server, tmp_path):
    out = subprocess.run(
        [
            SCHEMATHESIS,
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "12",
            "--header",
            f"Authorization: Bearer {server.token}",
            "--generation-database",
            "none",
            "--seed",
            "7",
            "--no-color",
            "--request-timeout",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "passed" in out.stdout.lower()
