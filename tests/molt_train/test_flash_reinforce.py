"""FlashREINFORCE (``--train.force_on_policy --algo.advantage.estimator flash_reinforce``): its refused combinations,
and a few steps of the tiny model on one rollout per prompt whose advantages, optimizer steps and loss are checked
against the definition (not a learning claim)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from molt_train import rl_cli, rollout_dump
from molt_train.config import parse

REQUIRED = ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "o"]
FLASH = ["--train.force_on_policy", "--algo.advantage.estimator", "flash_reinforce"]
GATE = ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating", "binary_kl"]
GATE += ["--algo.advantage.is_correction_threshold", "5e-3", "--actor.loss_agg_mode", "seq-mean-token-mean"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (FLASH + ["--rollout.n_samples_per_prompt", "4"], "flash_reinforce is single-rollout"),
        (["--algo.advantage.estimator", "flash_reinforce"], "pass --train.force_on_policy"),
        (FLASH + ["--train.max_epochs", "2"], "use --train.max_epochs 1"),
        (FLASH + ["--rollout.batch_size", "8", "--train.batch_size", "4"], "--train.batch_size 4 would split it"),
        (["--train.force_on_policy", "--no-train.force_sync_mode"], "contradict"),
    ],
)
def test_refused_combinations_name_the_flags(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("rl", REQUIRED + flags)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [
        FLASH + GATE,  # the seed's recipe
        FLASH + ["--rollout.batch_size", "8", "--train.batch_size", "8"],  # the whole batch in one step
        ["--train.force_on_policy", "--algo.advantage.estimator", "grpo", "--rollout.n_samples_per_prompt", "4"],
    ],
)
def test_accepted(flags):
    cfg = parse("rl", REQUIRED + flags)
    assert cfg.train.force_on_policy


@pytest.fixture(scope="module")
def student(tiny_tokenizer, tmp_path_factory) -> Path:
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("student"))


AGENT = str(Path(__file__).parent / "agents" / "parity_reward.py")


def test_one_rollout_per_prompt_a_few_steps(ray_local, student, tiny_tokenizer, tmp_path):
    from molt_train.experience import make_experience

    dump = tmp_path / "dump"
    argv = ["--env", "molt/arith-v1", "--train.agent_path", AGENT, "--actor.model_name_or_path", str(student)]
    argv += ["--train.num_steps", "3", "--rollout.batch_size", "6", "--rollout.max_new_tokens", "4"]
    argv += ["--eval.max_samples", "0", "--actor.adam.lr", "1e-3", "--no-logger.progress", "--data.max_len", "64"]
    argv += FLASH + GATE + ["--train.rollout_dump_dir", str(dump), "--ckpt.output_dir", str(tmp_path / "run")]
    assert rl_cli.main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    pad = tiny_tokenizer.pad_token_id if tiny_tokenizer.pad_token_id is not None else tiny_tokenizer.eos_token_id
    for index, r in enumerate(records):
        batch = rollout_dump.read(dump, index)
        exp = make_experience(batch["trajectories"], 64, pad)
        assert len(exp) == 6 and len(set(exp.group_ids)) == 6  # one rollout per prompt
        assert r["train/optimizer_steps"] == 1.0  # one step on the fresh batch
        # A_i = R_i - mean_j R_j on every action token of row i (no std, no whitening)
        advantages = (exp.rewards - exp.rewards.mean())[:, None].expand_as(exp.action_mask)
        tokens = exp.action_mask.sum()
        expected = float(advantages[exp.action_mask].abs().sum() / tokens)
        assert r["advantage/abs_mean"] == pytest.approx(expected, abs=1e-5)
        # one step on fresh samples: pi_old = pi (PPO ratio 1), and every row is admitted by the gate when the
        # engine's log-probs are the trainer's, so the sample-mean loss is -(1/B) sum_i A_i * mean_t(pi/mu) ~ 0
        assert r["is_filter_ratio"] == 0.0
        assert abs(r["train/loss"]) < 1e-3, r["train/loss"]
    assert torch.tensor([r["rollout/reward_mean"] for r in records]).isfinite().all()
