"""``molt-train rl --env molt/harness-claude-code-v1``: the real Claude Code CLI, in a jail per episode, drives a tiny
long-context policy for two RL steps on CPU (the real command, the real Ray, the hf engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import sandboxes
from molt_envs.harness import DEFAULT_INSTALL_DIR

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(bool(sandboxes.probe().local_missing), reason="the harness jail needs local isolation"),
]
MOLT_TRAIN = Path(sys.executable).with_name("molt-train")


@pytest.fixture(scope="module")
def long_context_model(tiny_tokenizer, tmp_path_factory):
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, max_positions=8192, seed=0)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("tiny-long"))


def test_two_rl_steps_on_claude_code(long_context_model, tmp_path):
    assert (DEFAULT_INSTALL_DIR / "node_modules" / "@anthropic-ai" / "claude-code").is_dir(), "run make harnesses"
    argv = [str(MOLT_TRAIN), "rl", "--env", "molt/harness-claude-code-v1"]
    argv += ["--actor.model_name_or_path", str(long_context_model), "--ckpt.output_dir", str(tmp_path)]
    argv += ["--train.num_steps", "2", "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2"]
    argv += ["--algo.advantage.estimator", "grpo", "--rollout.max_new_tokens", "12", "--data.max_len", "4096"]
    argv += ["--actor.adam.lr", "1e-3", "--eval.max_samples", "0", "--ray.num_cpus", "2", "--no-logger.progress"]
    argv += ["--rollout.timeout_s", "240", "--train.max_tokens_per_gpu", "16384"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["rollout/num_rollouts"] == 4
        assert record["rollout/kept_rollouts"] >= 1 and record["rollout/segments"] >= record["rollout/kept_rollouts"]
        assert record["train/tokens"] > 0  # the captured segments' action tokens were trained on
        dropped = {k for k, v in record.items() if k.startswith("rollout/dropped/") and v}
        assert dropped <= {"rollout/dropped/failure_harness_crash", "rollout/dropped/failure_harness_timeout"}
    # the trainer recomputed the log-probs of exactly the captured ids: a re-tokenized or misaligned capture
    # would differ by whole nats, not by float rounding
    assert records[0]["mismatch/abs_diff_mean"] < 1e-3
