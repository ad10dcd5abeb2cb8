"""The jail's own code is `sandboxes/injail/`, all of it and only it: stdlib-only modules that import each other by
plain name, copied unchanged into every jail (local, Ray's local pools and the Docker image)."""

from __future__ import annotations

import ast
import hashlib
import os
import sys

import sandboxes
from sandboxes import jail

IN_JAIL = sorted(name for name in os.listdir(jail.IN_JAIL_DIR) if name.endswith(".py") and name != "__init__.py")
HOLDS = """
import hashlib, os
for name in sorted(os.listdir("/opt/sandboxes")):
    with open("/opt/sandboxes/" + name, "rb") as handle:
        print(name, hashlib.sha256(handle.read()).hexdigest())
"""


def _imports(path: str) -> list[tuple[str, int]]:
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


def test_in_jail_modules_import_only_the_stdlib_and_each_other_by_name():
    siblings = {name.removesuffix(".py") for name in IN_JAIL}
    outside = {
        name: [
            module
            for module, level in _imports(os.path.join(jail.IN_JAIL_DIR, name))
            if level or not (module.partition(".")[0] in sys.stdlib_module_names or module in siblings)
        ]
        for name in IN_JAIL
    }
    assert outside == dict.fromkeys(IN_JAIL, [])
    assert "zygote.py" in IN_JAIL and tuple(IN_JAIL) == jail.IN_JAIL_MODULES


async def test_a_jail_holds_exactly_the_in_jail_modules(provider):
    options = {"actors": 2, "workers_per_actor": 1} if provider == "ray" else {"workers": 2}
    async with sandboxes.open(provider, **options) as sb:
        r = await sb.run_python(HOLDS)
    expected = []
    for name in IN_JAIL:
        with open(os.path.join(jail.IN_JAIL_DIR, name), "rb") as handle:
            expected.append(f"{name} {hashlib.sha256(handle.read()).hexdigest()}")
    assert (r.status, r.stdout.splitlines()) == ("ok", expected), r.stderr
