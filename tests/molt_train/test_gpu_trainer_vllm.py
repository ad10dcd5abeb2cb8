"""``molt-train rl --rollout.engine vllm --train.colocate_all`` end to end on one GPU (run on the H200; skipped
without CUDA or vLLM): the CLI in its own process, a random tiny Qwen2 model with a tokenizer trained on the gsm8k
split, Ray, FSDP2 on NCCL, vLLM in the rollout actor, CUDA-IPC weight sync. Three steps in sync mode with the
weight check after each and the mismatch metrics bounded; then partial rollout (IS correction) across syncs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"
MISMATCH = ("mismatch/bitwise_frac", "mismatch/abs_diff_mean", "mismatch/k3_kl")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:2000]]
    tok = train_tokenizer([r["question"] + " " + r["answer"] for r in rows], vocab_size=1024)
    model = build_tiny_model(tok, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512,
                             max_positions=2048)
    return str(save_tiny(model, tok, tmp_path_factory.mktemp("tiny")))


def run_cli(model: str, out: Path, *extra: str) -> list[dict[str, float]]:
    cmd = [sys.executable, "-m", "molt_train.cli", "rl", "--env", "molt/gsm8k-v1", "--actor.model_name_or_path",
           model, "--rollout.engine", "vllm", "--vllm.gpu_memory_utilization", "0.35", "--train.colocate_all",
           "--rollout.n_samples_per_prompt", "8", "--algo.advantage.estimator", "grpo", "--rollout.batch_size", "4",
           "--rollout.max_new_tokens", "64", "--data.max_len", "1024", "--train.num_steps", "3",
           "--eval.max_samples", "8", "--vllm.enforce_eager", "--actor.adam.lr", "1e-4", "--ray.num_cpus", "8",
           "--ckpt.output_dir", str(out), "--no-logger.progress", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env, cwd=REPO, start_new_session=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_three_colocated_steps_check_the_sync_and_log_bounded_mismatch(model_dir, tmp_path):
    records = run_cli(model_dir, tmp_path, "--train.force_sync_mode", "--train.check_weight_update_equal")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["weight_sync/checked_params"] > 0  # a stale or unreached parameter would have stopped the run
        assert r["weight_sync/bytes"] > 0 and r["engine/generated_tokens"] > 0
        assert set(MISMATCH) <= set(r), sorted(r)
        assert 0.0 <= r["mismatch/bitwise_frac"] <= 1.0
        assert r["mismatch/k3_kl"] < 1e-2, r  # same weights (bf16 engine vs fp32 trainer): small
    assert (tmp_path / "hf" / "model.safetensors").exists()


def test_partial_rollout_syncs_under_requests_in_flight(model_dir, tmp_path):
    records = run_cli(model_dir, tmp_path, "--train.partial_rollout_enable", "--rollout.max_new_tokens", "256",
                      "--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "trunc")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all("weight_sync/paused_rollouts" in r and "is_filter_ratio" in r and set(MISMATCH) <= set(r)
               for r in records)
