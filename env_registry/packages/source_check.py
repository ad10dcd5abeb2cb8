"""``molt-env check ./my_env``: validate a source tree's manifests, then run the conformance checks on it.

The envs are imported from the source tree in a child interpreter (the tree first on ``sys.path``; each manifest's
spec checked as the source states it), so checking never installs anything and never touches a registry.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from env_registry.errors import Error
from env_registry.packages.build import read_source

CHECK_TIMEOUT_S = 300


def check_source(root: str | Path) -> tuple[bool, str]:
    """``(passed, report text)``; a manifest error is a failed check, not an exception."""
    try:
        source = read_source(root)
    except Error as exc:
        return False, f"manifest check failed for {root}:\n  {exc}"
    header = f"manifest OK: {source.name} {source.version} provides {', '.join(m.id for m in source.manifests)}"
    cmd = [sys.executable, "-m", "env_registry.packages.source_check", str(source.root)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"{header}\nconformance checks of {source.root} took longer than {CHECK_TIMEOUT_S} s"
    output = (proc.stdout + ("\n" + proc.stderr.strip() if proc.returncode not in (0, 1) else "")).strip()
    return proc.returncode == 0, f"{header}\n{output}"


def _check_in_this_process(root: Path) -> int:
    """Child side: import from ``root``, check each manifest's spec as the source states it; print each report and
    exit 1 on any failure."""
    from env_registry.conformance import check
    from env_registry.manifest import EnvSpec

    for path in (root / "src", root):
        if path.is_dir():
            sys.path.insert(0, str(path))
    passed = True
    source = read_source(root)
    for manifest in source.manifests:
        report = check(EnvSpec(**manifest.model_dump(), package=source.name, package_version=source.version))
        print(report.render())
        passed &= report.passed
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(_check_in_this_process(Path(sys.argv[1])))
