"""Dotted flags become nested namespaces; refused combinations exit with an error naming the flags."""

from __future__ import annotations

import pytest

from molt_train.config import hierarchize, parse

BASE = ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "out"]


def test_dotted_flags_nest_and_keep_types():
    cfg = parse(
        "rl",
        BASE
        + [
            "--actor.adam.lr",
            "3e-4",
            "--algo.advantage.estimator",
            "grpo",
            "--rollout.n_samples_per_prompt",
            "4",
            "--actor.eps_clip_low_high",
            "0.2",
            "0.28",
            "--algo.advantage.is_correction_threshold",
            "0.99",
            "1.01",
        ],
    )
    assert cfg.actor.adam.lr == 3e-4
    assert cfg.algo.advantage.estimator == "grpo"
    assert cfg.actor.eps_clip_low_high == (0.2, 0.28)
    assert cfg.algo.advantage.is_correction_threshold == (0.99, 1.01)
    assert cfg.train.async_queue_size == 1 and cfg.train.force_sync_mode is False
    assert hierarchize({"a.b.c": 1, "a.d": 2}).a.b.c == 1


REFUSED = [
    (["--algo.advantage.estimator", "grpo"], "--rollout.n_samples_per_prompt > 1"),
    (["--algo.advantage.estimator", "nope"], "--algo.advantage.estimator 'nope' is unknown"),
    (
        ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_mode", "clip"],
        "--algo.advantage.is_correction_mode 'mask'",
    ),
    (["--train.async_queue_size", "2"], "--algo.advantage.is_correction_level"),
    (["--algo.advantage.is_correction_level", "token", "--rollout.top_p", "0.9"], "top_p 1.0"),
    (["--reward.overlong_buffer_len", "16", "--reward.stop_properly_penalty_coef", "0.5"], "mutually exclusive"),
    (
        ["--train.force_sync_mode", "--train.async_queue_size", "2", "--algo.advantage.is_correction_level", "geo"],
        "--train.force_sync_mode",
    ),
    (["--actor.num_gpus_per_node", "-1"], "--actor.num_gpus_per_node -1"),
    (["--algo.dynamic_filtering_enable"], "--algo.dynamic_filtering_enable needs --rollout.n_samples_per_prompt"),
    (["--actor.dual_clip", "1.0"], "--actor.dual_clip must be > 1"),
    (["--rollout.max_new_tokens", "2048"], "--data.max_len"),
    (["--algo.kl.init_coef", "0.1", "--rollout.top_p", "0.9"], "--algo.kl.ref rollout"),
    (["--actor.loss_agg_mode", "seq-sum"], "--actor.loss_agg_mode 'seq-sum' is unknown"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSED)
def test_refused_combinations_name_the_flags(extra, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("rl", BASE + extra)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_data_and_model_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse("rl", ["--actor.model_name_or_path", "m", "--ckpt.output_dir", "out"])
    assert "pass --env" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("sft", ["--env", "molt/arith-v1", "--ckpt.output_dir", "out"])
    assert "--model.config tiny" in capsys.readouterr().err


def test_async_queue_with_is_correction_is_accepted():
    cfg = parse("rl", BASE + ["--train.async_queue_size", "2", "--algo.advantage.is_correction_level", "geo"])
    assert cfg.train.async_queue_size == 2
