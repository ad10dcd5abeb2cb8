"""``--logger.wandb_project``: two ``molt-train rl`` steps logged to a real offline W&B run in the run directory,
next to metrics.jsonl and TensorBoard; ``wandb sync --view`` (what uploads it later) reads the same metrics back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from molt_train import rl_cli

WANDB = Path(sys.executable).with_name("wandb")


@pytest.fixture
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


def test_two_rl_steps_log_to_an_offline_wandb_run(ray_local, tiny_tokenizer, tmp_path, monkeypatch):
    from molt_train.models.tiny import build_tiny_model, save_tiny

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    model = save_tiny(build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1), tiny_tokenizer, tmp_path / "m")
    out = tmp_path / "run"
    argv = ["--env", "molt/arith-v1", "--actor.model_name_or_path", str(model), "--ckpt.output_dir", str(out)]
    argv += ["--train.num_steps", "2", "--rollout.batch_size", "4", "--rollout.max_new_tokens", "4"]
    argv += ["--eval.max_samples", "0", "--no-logger.progress", "--logger.wandb_project", "molt-test"]
    argv += ["--logger.wandb_run_name", "arith-two-steps"]
    assert rl_cli.main(argv) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and list((out / "tensorboard").iterdir())
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    run_id = (out / "wandb" / "run_id").read_text()
    assert run_dir.name.endswith(run_id) and list(run_dir.glob(f"run-{run_id}.wandb"))
    view = subprocess.run(
        [str(WANDB), "sync", "--view", "--verbose", str(run_dir)], capture_output=True, text=True, timeout=120
    )
    assert view.returncode == 0, view.stderr[-2000:]
    assert "train/loss" in view.stdout and "molt-test" in view.stdout and "arith-two-steps" in view.stdout
