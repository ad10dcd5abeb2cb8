"""Every README block marked runnable runs as shown: a fenced ``bash`` or ``python`` block right after a
``<!-- runnable -->`` line. The blocks of one file run in order in one scratch directory (a copy of ``examples/``
beside them, ``HOME`` there too, so ``~/molt-registry`` is scratch), with this venv's scripts first on ``PATH``."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- runnable -->"
BLOCK = re.compile(r"^" + re.escape(MARKER) + r"[ \t]*\n```(bash|python)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
DOCS = sorted(
    p
    for p in [*ROOT.glob("*.md"), *ROOT.glob("*/README.md"), *ROOT.glob("docs/*.md")]
    if p.is_file() and MARKER in p.read_text(encoding="utf-8")
)


def blocks(doc: Path) -> list[tuple[str, str]]:
    """(language, code) of each runnable block; a marker not followed by a bash/python block is an error."""
    text = doc.read_text(encoding="utf-8")
    found = [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]
    if len(found) != text.count(MARKER):
        raise AssertionError(f"{doc}: a {MARKER} line must be followed directly by a ```bash or ```python block")
    return found


def test_the_readme_has_runnable_blocks():
    assert ROOT / "README.md" in DOCS
    assert blocks(ROOT / "README.md")


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_runnable_blocks_run_as_shown(doc, tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("dist", "__pycache__"))
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MOLT_REGISTRY": str(tmp_path / "registry"),
    }
    env.pop("MOLT_TOKEN", None)
    before = installed()
    try:
        for n, (language, code) in enumerate(blocks(doc), 1):
            command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
            done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, (
                f"{doc.relative_to(ROOT)} runnable block {n} ({language}) exited {done.returncode}:\n{code}\n"
                f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
            )
    finally:  # what a block installed (`molt-env install ...`) goes again: the next test or run sees this venv as it was
        added = sorted(installed() - before)
        if added:
            subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", *added], check=True)


def installed() -> set[str]:
    """The distributions this venv holds now."""
    importlib.invalidate_caches()
    return {d.metadata["Name"] for d in importlib.metadata.distributions()}
