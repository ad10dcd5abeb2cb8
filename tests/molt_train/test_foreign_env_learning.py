"""A foreign env learned from scratch on the CPU: a tiny model (random init, its tokenizer trained on the demonstrations)
on reasoning-gym's ``products`` (``rg:products``, one of the ``rg:NAME`` scheme's 106 datasets, not one of the curated
``rg/...-v1`` IDs), by the CPU demo's recipe through the public commands: ``molt-train sft`` on 64 reference answers,
then ``molt-train rl`` (GRPO, the env's own grader, no answers) from that start; held-out pass@1 (greedy, the env's
200-row test split) before and after. molt_envs/README.md ("Learning a foreign env") has the measured figures."""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest

pytestmark = pytest.mark.slow

# one-digit products, the question alone (no system prompt: a prompt of ~20 tokens a tiny model can afford)
ENV = "rg:products?system_prompt=null&min_digits=1&max_digits=1&min_terms=2&max_terms=2"
SEED = 42


@pytest.fixture(scope="module")
def ray_pinned():
    """A local Ray instance whose workers compute like the demo's (its pinned numerics and passive OpenMP waits)."""
    import ray

    from molt_train import demo

    with mock.patch.dict(os.environ, demo.REPRODUCIBLE_ENV | demo.CPU_ENV):
        demo.start_ray(num_cpus=2)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.mark.timeout(900)
def test_grpo_on_rg_products_beats_its_sft_start_on_held_out_rows(ray_pinned, tmp_path):
    from molt_train import rl_cli, sft_cli

    sft, rl = tmp_path / "sft", tmp_path / "rl"
    common = ["--env", ENV, "--train.seed", str(SEED), "--ray.num_cpus", "2", "--actor.num_threads", "2"]
    common += ["--no-logger.progress"]
    sft_args = ["--model.config", "tiny", "--model.hidden_size", "128", "--model.num_layers", "2"]
    sft_args += ["--train.batch_size", "64", "--actor.adam.lr", "3e-3", "--data.max_samples", "64"]
    sft_args += ["--train.num_steps", "75", "--ckpt.output_dir", str(sft), "--eval.max_samples", "0"]
    assert sft_cli.main([*common, *sft_args]) == 0
    rl_args = ["--actor.model_name_or_path", str(sft / "hf"), "--ckpt.output_dir", str(rl)]
    rl_args += ["--rollout.max_new_tokens", "8", "--eval.max_new_tokens", "8"]
    rl_args += ["--algo.advantage.estimator", "grpo", "--rollout.n_samples_per_prompt", "8"]
    rl_args += ["--rollout.batch_size", "48", "--rollout.temperature", "1.0", "--actor.adam.lr", "1e-3"]
    rl_args += ["--actor.lr_warmup_ratio", "0.1", "--actor.lr_scheduler", "cosine", "--train.batch_size", "192"]
    rl_args += ["--train.force_sync_mode", "--train.micro_batch_size", "384", "--rollout.max_batch_size", "384"]
    rl_args += ["--train.num_steps", "40", "--eval.steps", "40", "--eval.eval_at_start"]
    assert rl_cli.main([*common, *rl_args]) == 0

    metrics = [json.loads(line) for line in (rl / "metrics.jsonl").read_text().splitlines()]
    evals = [(m["step"], m["eval/pass@1"], m["eval/num_rows"]) for m in metrics if "eval/pass@1" in m]
    (_, before, rows), (_, after, _) = evals[0], evals[-1]
    print(f"{ENV}: held-out pass@1 {before:.3f} at the SFT start -> {after:.3f} after 40 GRPO steps")
    assert rows == 200 and len(evals) == 2
    assert after >= before + 0.05, (before, after)  # measured: molt_envs/README.md
