"""``make test`` cannot pass without testing the sandbox: ``.ci/setup-machine.sh`` run by a user who is not root on
a machine without bubblewrap stops and says how to install it (unless ``MOLT_SKIP_ISOLATION=1``), and the suite's
conftest turns a skipped isolation test into a failed run, or with ``MOLT_SKIP_ISOLATION=1`` counts it in the
summary line. GPU tests may skip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534


@pytest.fixture
def no_bwrap_path() -> Iterator[str]:
    """A PATH with the shell tools the script uses and neither bubblewrap, docker nor apt-get (in a directory the
    unprivileged user can reach: pytest's tmp_path is private to root)."""
    with tempfile.TemporaryDirectory(prefix="molt-path-") as bin_dir:
        os.chmod(bin_dir, 0o755)
        for tool in ("bash", "cat", "id", "seq", "sleep"):
            os.symlink(shutil.which(tool), os.path.join(bin_dir, tool))
        yield bin_dir


def setup_as_nobody(path: str, **env: str) -> subprocess.CompletedProcess:
    script = ROOT / ".ci" / "setup-machine.sh"
    return subprocess.run(
        [
            shutil.which("setpriv") or "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "bash",
            str(script),
        ],
        env={"PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
def test_setup_stops_without_bubblewrap_and_root_and_says_how_to_install_it(no_bwrap_path):
    done = setup_as_nobody(no_bwrap_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "bubblewrap is missing" in done.stderr and "apt-get install bubblewrap" in done.stderr
    assert "MOLT_SKIP_ISOLATION=1 make test" in done.stderr

    allowed = setup_as_nobody(no_bwrap_path, MOLT_SKIP_ISOLATION="1")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "WARNING: no bubblewrap" in allowed.stderr and "SKIPPED" in allowed.stderr


SUITE = """
import pytest

def test_passes():
    pass

@pytest.mark.skipif(True, reason="needs the local sandbox (bubblewrap)")
def test_jail():
    pass

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_gpu():
    pass
"""


def run_suite(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA GPU\n")
    environ = {k: v for k, v in os.environ.items() if k != "MOLT_SKIP_ISOLATION"} | env
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_skipped_isolation_test_fails_the_run(tmp_path):
    done = run_suite(tmp_path)
    assert done.returncode == 1, done.stdout
    assert "1 isolation tests SKIPPED: the run FAILS" in done.stdout
    assert "1 passed, 2 skipped" in done.stdout  # the GPU skip is not counted as an isolation skip


def test_with_molt_skip_isolation_the_summary_line_counts_the_skips(tmp_path):
    done = run_suite(tmp_path, MOLT_SKIP_ISOLATION="1")
    assert done.returncode == 0, done.stdout
    summary = done.stdout.strip().splitlines()[-1]
    assert "1 isolation tests SKIPPED (MOLT_SKIP_ISOLATION=1)" in summary, summary
