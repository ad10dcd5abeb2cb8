"""Vision on the H200 (skipped without CUDA, vLLM or torchvision): a random Qwen2.5-VL-shaped model built from a
config (``benchmarks/gpu/shapes.py vl-tiny``, no hub) with its real ``Qwen2_5_VLProcessor``.

- The vLLM engine rolls out `molt/shapes-v1` through the StepEnvRunner: every image placeholder vLLM expands lands
  exactly on the trajectory's ids (the engine raises otherwise), and vLLM's log-probs match the HF model's forward
  over the same ids and the runner's image tensors (M-RoPE positions from the image grids).
- ``molt-train rl --env molt/shapes-v1 --rollout.engine vllm --train.colocate_all --train.check_weight_update_equal``
  runs three GRPO steps end to end: FSDP2 over the decoder and the vision tower, CUDA-IPC weight sync checked
  parameter by parameter (the vision tower's too), trainer-vs-vLLM mismatch bounded, the checkpoint saved with its
  processor.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("vllm")
pytest.importorskip("torchvision")  # transformers' Qwen2-VL processor needs it

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
from shapes import make_vl_model  # noqa: E402

from molt_envs import SamplingParams, StepEnvRunner  # noqa: E402
from molt_envs.envs.shapes import ShapesEnv, generate_split  # noqa: E402
from molt_envs.vision import vision_codec  # noqa: E402
from molt_train.models.multimodal import load_model, load_processor, position_ids  # noqa: E402

MISMATCH = ("mismatch/bitwise_frac", "mismatch/abs_diff_mean", "mismatch/k3_kl")


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory) -> str:
    return make_vl_model(str(tmp_path_factory.mktemp("vl") / "vl-tiny"), "vl-tiny", "cuda")


def test_vllm_rollouts_carry_the_exact_image_tokens_and_match_the_hf_forward(vl_dir):
    from molt_train.config import VLLMConfig
    from molt_train.engines.vllm import VLLMEngine

    processor = load_processor(vl_dir)
    codec = vision_codec(processor)
    rows = [{**r, "image": r["image"].resize((112, 112))} for r in generate_split("train", 8)]  # 16 image tokens
    loop = asyncio.new_event_loop()

    async def rollouts():
        engine = VLLMEngine(
            vl_dir, VLLMConfig(gpu_memory_utilization=0.3, enforce_eager=True, max_model_len=512),
            tokenizer=processor.tokenizer,
        )  # fmt: skip
        runner = StepEnvRunner(ShapesEnv)
        try:
            return await asyncio.gather(
                *(
                    runner.execute([{"role": "user", "content": r["question"]}], r["answer"],
                                   SamplingParams(max_tokens=16, seed=i), 512, processor, engine, images=[r["image"]])
                    for i, r in enumerate(rows)
                )
            )  # fmt: skip
        finally:
            engine.shutdown()

    trajs = loop.run_until_complete(rollouts())
    pending = asyncio.all_tasks(loop)  # vLLM's output handler: let its cancellation run before the loop closes
    for task in pending:
        task.cancel()

    async def drain():  # gather inside the loop: outside it, gather would bind the futures to another loop
        await asyncio.gather(*pending, return_exceptions=True)

    loop.run_until_complete(drain())
    loop.close()
    model = load_model(vl_dir, dtype=torch.bfloat16).cuda().eval()
    diffs = []
    for traj in trajs:
        assert traj.ok, traj.failure
        assert traj.token_ids.count(codec.image_token_id) == sum(traj.mm_inputs.token_counts) == 16
        ids = torch.tensor([traj.token_ids], device="cuda")
        mask = torch.ones_like(ids)
        tensors = {k: v.cuda() for k, v in traj.mm_inputs.tensors.items()}
        with torch.no_grad():
            logits = (
                model(
                    input_ids=ids, attention_mask=mask, position_ids=position_ids(model, ids, mask, tensors), **tensors
                )
                .logits[0]
                .float()
            )
        logp = torch.log_softmax(logits, -1)
        ((start, end),) = traj.action_ranges
        forced = logp[start - 1 : end - 1].gather(-1, ids[0, start:end, None])[:, 0].cpu()
        diffs.append((forced - torch.tensor(traj.log_probs[start:end])).abs().mean().item())
    assert sum(diffs) / len(diffs) < 0.05, diffs  # bf16 vLLM vs bf16 HF on the same ids and pixels


def test_colocated_rl_on_shapes_checks_every_weight_sync(vl_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "molt_train.cli", "rl", "--env", "molt/shapes-v1", "--actor.model_name_or_path", vl_dir,
        "--rollout.engine", "vllm", "--train.colocate_all", "--vllm.gpu_memory_utilization", "0.35",
        "--vllm.enforce_eager", "--train.force_sync_mode", "--train.check_weight_update_equal",
        "--algo.advantage.estimator", "grpo", "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "4",
        "--rollout.max_new_tokens", "16", "--data.max_len", "512", "--train.num_steps", "3", "--eval.max_samples", "8",
        "--actor.adam.lr", "1e-5", "--ray.num_cpus", "8", "--ckpt.output_dir", str(out), "--no-logger.progress",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env, cwd=REPO, start_new_session=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        # a random-weight VLM may sample its own image placeholder: that trajectory is dropped, nothing else is
        assert r["rollout/dropped_total"] == r.get("rollout/dropped/placeholder_generated", 0.0), r
        assert r["weight_sync/checked_params"] > 0  # a stale or unreached parameter would have stopped the run
        assert set(MISMATCH) <= set(r), sorted(r)
        assert r["mismatch/k3_kl"] < 1e-2, r  # vLLM's own image processing vs the runner's tensors: same tokens
    assert hasattr(load_processor(out / "hf"), "image_processor") and "eval/accuracy" in records[-1]
