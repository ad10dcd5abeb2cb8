"""`molt-env list | info | check` as a user runs them (real subprocesses of the installed console script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MOLT_ENV = str(Path(sys.executable).with_name("molt-env"))

BROKEN = """
import env_registry
from molt_envs import Env, Result

class Broken(Env):
    async def step(self, state):
        if "####" in state["action_text"]:
            raise ValueError("grader exploded")
        return Result(reward=7.0, info={"note": "not a number"})

env_registry.register("broken/env-v1", "broken_env_mod:Broken", reward_range=(0.0, 1.0),
                      datasets={"train": {"generator": "broken_env_mod:rows", "reference_key": "reference"}})

def rows(split):
    return [{"prompt": "2+2?", "label": "4", "reference": "#### 4"}]
"""


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd) if cwd else "")
    return subprocess.run([MOLT_ENV, *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_list_groups_by_namespace():
    out = run("list")
    assert out.returncode == 0 and "===== molt =====" in out.stdout and "molt/gsm8k-v1" in out.stdout


def test_info_shows_spec_datasets_with_row_counts():
    out = run("info", "molt/gsm8k-v1")
    info = json.loads(out.stdout)
    assert info["datasets"]["train"]["rows"] == 7473 and info["datasets"]["test"]["rows"] == 1319
    assert info["spec"]["entry_point"] == "molt_envs.envs.gsm8k:GSM8KEnv" and len(info["hash"]) == 16


def test_check_passes_on_gsm8k():
    out = run("check", "molt/gsm8k-v1")
    assert out.returncode == 0, out.stdout
    assert "0 failed" in out.stdout


def test_check_fails_readably_on_a_broken_env(tmp_path):
    (tmp_path / "broken_env_mod.py").write_text(BROKEN)
    out = run("check", "broken_env_mod:broken/env-v1", cwd=tmp_path)
    assert out.returncode == 1
    assert "FAIL  row 0: reference action: step raised ValueError: grader exploded" in out.stdout
    assert "reward 7.0 outside the declared reward_range [0.0, 1.0]" in out.stdout
    assert "info values must be scalars" in out.stdout


def test_unknown_id_is_explained():
    out = run("info", "molt/gsm9k-v1")
    assert out.returncode == 2 and "Did you mean 'gsm8k'" in out.stderr
