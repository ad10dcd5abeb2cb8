"""The publish gate: ``molt-env serve --validate`` validates every upload in a worker process (``molt-env validate``,
the package's code in the sandbox jail), holds ``pending`` and ``failed`` versions back from resolution, install and
the simple index, serves the report at ``/api/packages/<pkg>/<version>/validation`` and shows it on the hub."""

from __future__ import annotations

import html

import httpx
import pytest
from packaging_support import run_cli, start_server

from env_registry.packages.scaffold import init
from env_registry.store.local import NotFound
from env_registry.store.validation_states import FAILED, PASSED


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
def test_pending_and_failed_releases_are_held_back(tmp_path, echo, make_registry):
    """The store's rules, without a gate running: what a pending, failed and passed release resolves to."""
    registry = make_registry(tmp_path / "registry")
    registry.publish(echo.releases["1.0.0"])
    held = registry.publish(echo.releases["1.0.1"], pending_validation=True)
    assert held.validation_status == "pending"
    assert [r.version for r in registry.pending_validations()] == ["1.0.1"]
    assert registry.resolve("acme/echo-v1").version == "1.0.0"  # unpinned: skips the pending release
    assert registry.package("acme-echo").latest == "1.0.0"
    assert next(e for e in registry.env_ids() if e.env_id == "acme/echo-v1").latest == "1.0.0"
    with pytest.raises(NotFound, match="still being validated"):
        registry.resolve("acme/echo-v1@1.0.1")
    assert [link.filename for link in registry.index_links("acme-echo") if "1.0.1" in link.filename] == []

    registry.set_validation("acme-echo", "1.0.1", FAILED, {"checks": [], "ok": False})
    assert registry.pending_validations() == []
    with pytest.raises(NotFound, match=r"failed validation .* /api/packages/acme-echo/1.0.1/validation"):
        registry.resolve("acme/echo-v1@1.0.1")
    assert registry.resolve("acme/echo-v1").version == "1.0.0"
    assert registry.validation("acme-echo", "1.0.1") == (FAILED, {"checks": [], "ok": False})

    registry.set_validation("acme-echo", "1.0.1", PASSED, {"checks": [], "ok": True})
    assert registry.resolve("acme/echo-v1").version == "1.0.1"
    assert any("1.0.1" in link.filename for link in registry.index_links("acme-echo"))
    with pytest.raises(Exception, match="'passed' or 'failed', not 'maybe'"):
        registry.set_validation("acme-echo", "1.0.1", "maybe", {})


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """``molt-env serve --validate`` on SQLite, with a token for publisher 'acme'."""
    live = start_server(tmp_path_factory.mktemp("gated") / "registry", "--validate", "--validate-timeout", "180")
    yield live
    live.stop()


def test_the_gate_passes_a_sound_upload_and_holds_a_broken_one_back(gated, tmp_path):
    sound = init(tmp_path / "sound", "gate/echo-v1", package="gate-echo")
    broken = init(tmp_path / "broken", "gate/over-v1", package="gate-over")
    module = next(broken.glob("*/env.py"))
    module.write_text(module.read_text().replace("reward=1.0 if exact", "reward=2.0 if exact"))  # out of range
    assert "reward=2.0" in module.read_text()
    registry = ["--registry", gated.url, "--token", gated.token]

    # the CLI waits for the verdict and prints the report
    published = run_cli("publish", str(broken), *registry, "--wait", "600")
    assert published.returncode == 1, published.stdout + published.stderr
    assert "waiting for" in published.stdout  # the upload was stored pending
    assert "failed validation: it is not installable" in published.stdout
    assert "outside the declared reward_range" in published.stdout
    published = run_cli("publish", str(sound), *registry, "--wait", "600")
    assert published.returncode == 0, published.stdout + published.stderr
    assert "0 failed: OK" in published.stdout

    passed = httpx.get(f"{gated.url}/api/packages/gate-echo/0.1.0/validation").json()
    assert passed["status"] == "passed" and passed["report"]["ok"] and "jail" in passed["report"]["isolation"]
    assert "gate-echo 0.1.0" in passed["report"]["target"] and str(gated.root) not in passed["report"]["target"]
    assert httpx.get(f"{gated.url}/api/resolve", params={"env_id": "gate/echo-v1"}).json()["version"] == "0.1.0"

    failed = httpx.get(f"{gated.url}/api/packages/gate-over/0.1.0/validation").json()
    assert failed["status"] == "failed" and not failed["report"]["ok"]
    bad = {c["name"] for c in failed["report"]["checks"] if not c["passed"]}
    assert "smoke eval: reference answer" in bad
    resolved = httpx.get(f"{gated.url}/api/resolve", params={"env_id": "gate/over-v1@0.1.0"})
    assert resolved.status_code == 404 and "failed validation" in resolved.json()["detail"]
    install = run_cli("install", "gate/over-v1@0.1.0", *registry)
    assert install.returncode == 2 and "failed validation" in install.stderr, install.stderr
    simple = httpx.get(f"{gated.url}/simple/gate-over/").text
    assert ".whl" not in simple and ".tar.gz" not in simple  # pip is never offered it

    page = httpx.get(f"{gated.url}/packages/gate-over").text
    assert "not installable: failed validation" in page
    card = httpx.get(f"{gated.url}/envs/gate/over-v1").text
    assert 'class="status failed"' in card and "smoke eval: reference answer" in card and "FAIL" in card
    card = httpx.get(f"{gated.url}/envs/gate/echo-v1").text
    assert 'class="status passed"' in card and "Isolation: sandboxes" in card
    # the first prompts of each split, generated by the package's own code in the jail, shown on the card
    samples = passed["report"]["samples"]["gate/echo-v1"]
    assert set(samples) == {"train", "test"} and all(1 <= len(rows) <= 3 for rows in samples.values())
    first = samples["test"][0][-1]["content"]
    assert first and html.escape(first, quote=False) in card and "Sample prompts" in card
    assert httpx.get(f"{gated.url}/api/packages/gate-over/9.9.9/validation").status_code == 404
    log = gated.root.with_name(gated.root.name + "-serve.log").read_text()
    assert "validated gate-over 0.1.0: failed" in log and "validated gate-echo 0.1.0: passed" in log


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
def test_one_gate_wins_a_pending_release_and_a_dead_gates_claim_expires(tmp_path, echo, make_registry):
    registry = make_registry(tmp_path / "registry")
    registry.publish(echo.releases["1.0.1"], pending_validation=True)
    assert registry.claim_validation("acme-echo", "1.0.1", "gate-a", lease_s=60, now=1000.0)
    assert not registry.claim_validation("acme-echo", "1.0.1", "gate-b", lease_s=60, now=1030.0)  # a's claim is live
    assert registry.claim_validation("acme-echo", "1.0.1", "gate-a", lease_s=60, now=1050.0)  # a renews it
    assert not registry.claim_validation("acme-echo", "1.0.1", "gate-b", lease_s=60, now=1100.0)
    assert registry.claim_validation("acme-echo", "1.0.1", "gate-b", lease_s=60, now=1111.0)  # a stopped renewing
    assert not registry.set_validation("acme-echo", "1.0.1", PASSED, {"ok": True}, claimant="gate-a")  # too late
    assert registry.validation("acme-echo", "1.0.1") == ("pending", None)
    assert registry.set_validation("acme-echo", "1.0.1", FAILED, {"ok": False}, claimant="gate-b")
    assert registry.validation("acme-echo", "1.0.1") == (FAILED, {"ok": False})
    assert not registry.claim_validation("acme-echo", "1.0.1", "gate-c", lease_s=60)  # decided: nothing to claim


def test_replicas_on_one_postgresql_validate_each_upload_once(tmp_path, postgres):
    """``molt-env serve --validate --workers 2`` and a second replica's gate on the same PostgreSQL database and file
    store: every upload is validated by exactly one gate (the server's worker processes run none)."""
    import subprocess
    import sys
    import time

    db = postgres.new_database()
    root = tmp_path / "registry"
    live = start_server(root, "--db", db, "--validate", "--workers", "2", "--validate-timeout", "180")
    other = subprocess.Popen(
        [sys.executable, "-m", "env_registry.validation.gate", "--root", str(root), "--db", db, "--timeout", "180"],
        stdin=subprocess.PIPE,
        stdout=(tmp_path / "other-gate.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        registry = ["--registry", live.url, "--token", live.token]
        names = []
        for i in range(3):
            src = init(tmp_path / f"src{i}", f"twice/echo{i}-v1", package=f"twice-echo{i}")
            published = run_cli("publish", str(src), *registry)
            assert published.returncode == 0, published.stdout + published.stderr
            names.append(f"twice-echo{i}")
        deadline = time.monotonic() + 600
        statuses: list = []
        while time.monotonic() < deadline:
            statuses = [
                httpx.get(f"{live.url}/api/packages/{name}/0.1.0/validation").json()["status"] for name in names
            ]
            if "pending" not in statuses:
                break
            time.sleep(1)
        assert statuses == [PASSED] * 3
        time.sleep(3)  # a gate that saw a release pending has had polls enough to validate it again
    finally:
        other.stdin.close()
        other.wait(30)
        live.stop()
    logs = root.with_name(root.name + "-serve.log").read_text() + (tmp_path / "other-gate.log").read_text()
    for name in names:
        assert logs.count(f"validated {name} 0.1.0:") == 1, logs
