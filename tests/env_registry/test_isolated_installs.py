"""Isolated installs: two env packages pinning conflicting releases of ``six`` (from PyPI), each installed into a
venv of its own with real pip, served from there by env servers that ``make()`` starts; failures across the wire;
one ``molt-train rl`` run through the server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging_support import MOLT_ENV, hatch_build

import env_registry
from env_registry.errors import EnvServerUnavailable, IsolatedInstallError
from env_registry.installs.isolated import IsolatedInstall, records, runtime_requirement
from env_registry.store.local import LocalRegistry
from molt_envs import SamplingParams
from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine

OLD, NEW = "test/six-old-v1", "test/six-new-v1"

ENV_MODULE = '''
"""Arithmetic graded in a venv of its own; its info says which release of six it imports."""

import os
import time

import six

from molt_envs.contract import Env, Result
from molt_envs.envs.arith import ArithEnv


def generate_split(split, size=8):
    for i in range(size):
        yield {"question": f"{i}+{i % 3}=", "answer": str(i + i % 3)}


class SixEnv(Env):
    async def step(self, state):
        action = state["action_text"]
        marker = os.environ.get("SIX_ENV_DIE_ONCE")  # the server dies at the first step it sees, once
        if marker and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
        if action.startswith("DIE"):
            os._exit(3)
        if action.startswith("HANG"):
            time.sleep(60)  # blocks the server's env loop: a hung server (its pings still answered)
        graded = await ArithEnv().step(state)
        return Result(reward=graded.reward, info={**graded.info, "six_minor": float(six.__version__.split(".")[1])})
'''


def write_package(root: Path, dist: str, module: str, env_id: str, requirement: str) -> Path:
    src = root / dist
    (src / module).mkdir(parents=True)
    (src / module / "__init__.py").write_text(textwrap.dedent(ENV_MODULE))
    (src / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["hatchling>=1.25"]
        build-backend = "hatchling.build"

        [project]
        name = "{dist}"
        version = "1.0.0"
        requires-python = ">=3.11"
        dependencies = ["molt-ecosystem", "{requirement}"]

        [project.entry-points."molt.envs"]
        "{env_id}" = "{module}:SixEnv"

        [tool.hatch.build.targets.wheel]
        packages = ["{module}"]

        [tool.hatch.build.targets.wheel.extra-metadata]
        "pyproject.toml" = "molt/pyproject.toml"

        [[tool.molt.env]]
        id = "{env_id}"
        entry_point = "{module}:SixEnv"
        max_turns = 1
        [tool.molt.env.datasets.train]
        generator = "{module}:generate_split"
        input_key = "question"
        label_key = "answer"
        reference_key = "answer"
        [tool.molt.env.datasets.test]
        generator = "{module}:generate_split"
        input_key = "question"
        label_key = "answer"
        """)
    )
    return src


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A registry holding both packages (and one whose pin cannot be met), each env installed isolated into
    ``$MOLT_CACHE`` (set for this process and its children while the tests run)."""
    root = tmp_path_factory.mktemp("isolated")
    registry_dir, cache_dir = root / "registry", root / "cache"
    previous = os.environ.get("MOLT_CACHE")
    os.environ["MOLT_CACHE"] = str(cache_dir)
    packages = [
        ("six-old-env", "six_old_env", OLD, "six==1.16.0"),
        ("six-new-env", "six_new_env", NEW, "six==1.17.0"),
        ("six-none-env", "six_none_env", "test/six-none-v1", "six==0.0.1"),  # no such release
    ]
    registry = LocalRegistry(registry_dir)
    for dist, module, env_id, requirement in packages:
        src = write_package(root / "src", dist, module, env_id, requirement)
        registry.publish(hatch_build(src, root / "dist" / dist))
    runtime_requirement()  # builds this checkout's runtime wheel once, before the installs share it
    cmd = [MOLT_ENV, "install", "--isolated", "--registry", str(registry_dir)]
    running = {
        env_id: subprocess.Popen([*cmd, env_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _, _, env_id, _ in packages  # in parallel: pip waits on the index and the disk much of the time
    }
    installs = {}
    for env_id, process in running.items():
        stdout, stderr = process.communicate(timeout=600)
        installs[env_id] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    env_registry.registry._discovered = False  # re-read: the installs happened in other processes
    yield cache_dir, installs
    from env_registry.serving.managed_servers import stop_managed_servers

    stop_managed_servers()
    if previous is None:
        os.environ.pop("MOLT_CACHE")
    else:
        os.environ["MOLT_CACHE"] = previous


def episode(env_id: str, action: str, label: str = "3"):
    runner = env_registry.runner_for(env_id)
    tokenizer = ByteChatTokenizer()
    params = SamplingParams(max_tokens=16)
    return asyncio.run(runner.execute("1+2=", label, params, 256, tokenizer, ReplayEngine(tokenizer, action)))


def test_each_isolated_env_sees_its_own_pinned_release(cache):
    _, installs = cache
    for env_id in (OLD, NEW):
        assert installs[env_id].returncode == 0, installs[env_id].stderr
        assert "into a venv of its own" in installs[env_id].stdout
    old, new = episode(OLD, "3"), episode(NEW, "3")
    assert (old.failure, new.failure) == (None, None)
    assert (old.reward, new.reward) == (1.0, 1.0)
    assert (old.info["six_minor"], new.info["six_minor"]) == (16.0, 17.0)  # both in this one process
    assert old.env_id == OLD and old.spec_hash == env_registry.spec(OLD).hash
    recorded = {r.env_ids[0]: r for r in records()}
    assert recorded[OLD].status == "installed" and recorded[OLD].hashes[OLD] == old.spec_hash
    # the venv has the runtime and the package's pin, not the trainer: no torch, no ray
    probe = "import importlib.util as u, six; print(six.__version__, [m for m in ('torch', 'ray') if u.find_spec(m)])"
    out = subprocess.run([recorded[OLD].python, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1.16.0", "[]"]


def test_the_trainer_draws_prompts_from_the_server(cache):
    rows = env_registry.load_split(env_registry.spec(NEW), "train", 3)
    assert [r["label"] for r in rows] == ["0", "2", "4"]
    assert rows[1]["prompt"] == [{"role": "user", "content": "1+1="}]


def test_a_server_that_dies_mid_episode_is_counted_and_restarted(cache):
    endpoint = env_registry.spec(OLD).endpoint()
    pid = endpoint.server.process.pid
    died = episode(OLD, "DIE")
    assert died.failure.startswith("remote_lost: ServerLost:"), died.failure
    assert endpoint.settled(60) and endpoint.server.process.pid != pid  # restarted (behind the failed episode)
    assert episode(OLD, "3").reward == 1.0  # and the next episode runs


def test_a_hung_server_times_out_and_is_restarted(cache):
    endpoint = env_registry.spec(NEW).endpoint()
    pid, restarts = endpoint.server.process.pid, endpoint.server.restarts
    endpoint.timeout_s = 2.0
    try:
        hung = episode(NEW, "HANG")
    finally:
        endpoint.timeout_s = 300.0
    assert hung.failure.startswith("remote_timeout: ServerTimeout:"), hung.failure
    assert endpoint.settled(60)  # its /health waits for the env loop: unanswered, so it is killed and restarted
    assert endpoint.server.restarts == restarts + 1 and endpoint.server.process.pid != pid
    assert episode(NEW, "3").info["six_minor"] == 17.0


def test_an_install_whose_pin_cannot_be_met_fails_clearly_at_install_and_make(cache):
    _, installs = cache
    failed = installs["test/six-none-v1"]
    assert failed.returncode == 2
    assert "isolated install of six-none-env 1.0.0 failed" in failed.stderr and "six==0.0.1" in failed.stderr
    with pytest.raises(IsolatedInstallError, match="six-none-env 1.0.0.*failed"):
        env_registry.make("test/six-none-v1")


def test_a_broken_venv_is_a_clear_error_at_make(cache, tmp_path, monkeypatch):
    cache_dir, _ = cache
    record = IsolatedInstall.model_validate_json(
        (cache_dir / "isolated" / "six-old-env-1.0.0" / "install.json").read_text()
    )
    broken = tmp_path / "isolated" / "six-old-env-1.0.0"
    broken.mkdir(parents=True)
    (broken / "install.json").write_text(
        record.model_copy(update={"python": str(tmp_path / "gone/bin/python")}).model_dump_json()
    )
    monkeypatch.setenv("MOLT_CACHE", str(tmp_path))
    monkeypatch.setattr(env_registry.registry, "_specs", {})
    monkeypatch.setattr(env_registry.registry, "_discovered", False)
    with pytest.raises(EnvServerUnavailable, match="six-old-env 1.0.0"):
        env_registry.make(OLD)


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_model, tiny_tokenizer, tmp_path_factory):
    from molt_train.models.tiny import save_tiny

    return save_tiny(tiny_model, tiny_tokenizer, tmp_path_factory.mktemp("tiny") / "hf")


def train(checkpoint: Path, out: Path, *env_flags: str, **env: str) -> subprocess.CompletedProcess:
    """``molt-train rl`` as a user runs it, two short steps on a tiny model."""
    cmd = [str(Path(sys.executable).with_name("molt-train")), "rl", *env_flags, "--actor.model_name_or_path"]
    cmd += [str(checkpoint), "--ckpt.output_dir", str(out), "--train.num_steps", "2", "--rollout.batch_size", "4"]
    cmd += ["--rollout.n_samples_per_prompt", "2", "--algo.advantage.estimator", "grpo", "--rollout.max_new_tokens"]
    cmd += ["3", "--eval.max_samples", "4", "--ray.num_cpus", "2", "--no-logger.progress"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **env})


def test_molt_train_rl_trains_through_the_isolated_server_and_survives_its_death(cache, tiny_checkpoint, tmp_path):
    run = train(tiny_checkpoint, tmp_path / "run", "--env", OLD, SIX_ENV_DIE_ONCE=str(tmp_path / "died"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert (tmp_path / "died").exists()  # the server of the rollout worker died at its first step
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert sum(r.get("rollout/dropped/failure_remote_lost", 0) for r in records) >= 1  # counted ...
    assert records[-1]["rollout/kept_rollouts"] > 0  # ... and the restarted server went on serving
    assert "eval/accuracy" in records[-1]


def test_one_mixed_run_draws_from_both_conflicting_envs(cache, tiny_checkpoint, tmp_path):
    from molt_train.config import parse

    flags = ["--env", f"{OLD}:0.5", "--env", f"{NEW}:0.5", "--actor.model_name_or_path", str(tiny_checkpoint)]
    cfg = parse("rl", [*flags, "--ckpt.output_dir", str(tmp_path / "mixed")])
    assert cfg.env == (f"{OLD}:0.5", f"{NEW}:0.5")
    run = train(tiny_checkpoint, tmp_path / "mixed", "--env", f"{OLD}:0.5", "--env", f"{NEW}:0.5")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "mixed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    keys = set().union(*records)
    assert any(OLD in k for k in keys) and any(NEW in k for k in keys), sorted(keys)  # per-env metrics of both
    for r in records:  # 4 prompts x 2 samples a step, half from each env (each from its own venv's server)
        assert r[f"rollout/{OLD}/num_rollouts"] == r[f"rollout/{NEW}/num_rollouts"] == 4
    assert f"eval/{OLD}/accuracy" in records[-1] and f"eval/{NEW}/accuracy" in records[-1]
