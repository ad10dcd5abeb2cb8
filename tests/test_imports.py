"""The light packages stay light: importing them never pulls in torch or ray."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["env_registry", "molt_envs", "sandboxes"])
def test_import_does_not_load_torch_or_ray(package):
    code = (
        f"import sys, {package}, env_registry; list(env_registry.registry); "
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
