"""Dotted flags become nested frozen dataclasses; refused combinations exit with an error naming the flags."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import pickle
import sys
import types
from pathlib import Path

import pytest

from molt_train.config import COMMANDS, ActorConfig, RLConfig, SFTConfig, flags, parse

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
            "--algo.advantage.is_correction_level",
            "token",
            "--algo.advantage.is_correction_threshold",
            "0.99",
            "1.01",
        ],
    )
    assert cfg.actor.adam.lr == 3e-4
    assert cfg.algo.advantage.estimator == "grpo"
    assert cfg.actor.eps_clip_low_high == (0.2, 0.28)
    assert cfg.algo.advantage.is_correction_threshold == (0.99, 1.01)
    assert cfg.train.async_queue_size == 1 and cfg.train.force_sync_mode is None and cfg.train.on_policy
    assert isinstance(cfg, RLConfig) and isinstance(cfg.actor, ActorConfig)


@pytest.mark.parametrize(
    ("flags", "on_policy"),
    [
        ([], True),  # the default: rollout waits for the weight sync (issue 20's A/B, molt_train/README "Staleness")
        (["--no-train.force_sync_mode"], False),  # queue 1, overlapped: one step stale
        (["--train.async_queue_size", "2", "--algo.advantage.is_correction_level", "geo"], False),
        (["--train.force_sync_mode"], True),
    ],
)
def test_rl_is_on_policy_unless_asked_to_overlap(flags, on_policy):
    assert parse("rl", BASE + flags).train.on_policy is on_policy


def test_configs_are_frozen_picklable_and_rebuilt_by_replace():
    cfg = parse("rl", BASE + ["--actor.num_gpus_per_node", "2"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.actor.num_workers = 3
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # what Ray sends the actors
    assert cfg.actor.num_workers == 2  # the dependent default, filled once
    assert dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=7)).train.seed == 7
    grpo = dataclasses.replace(cfg.algo.advantage, estimator="grpo")
    with pytest.raises(flags.ConfigError, match="--rollout.n_samples_per_prompt > 1"):  # built in code: checked too
        dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, advantage=grpo))


def test_a_command_takes_only_the_flags_it_reads(capsys):
    sft = parse("sft", ["--env", "molt/arith-v1", "--model.config", "tiny", "--ckpt.output_dir", "o"])
    assert isinstance(sft, SFTConfig) and (sft.train.num_steps, sft.train.batch_size) == (200, 64)  # sft's defaults
    with pytest.raises(SystemExit):
        parse(
            "sft", ["--env", "molt/arith-v1", "--model.config", "tiny", "--ckpt.output_dir", "o", "--vllm.dtype", "x"]
        )
    assert "unrecognized arguments: --vllm.dtype" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("eval", ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ray.address", "x"])
    assert "unrecognized arguments: --ray.address" in capsys.readouterr().err


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
    (["--actor.num_workers", "0"], "--actor.num_workers must be >= 1, got 0"),
    (["--algo.advantage.gamma", "0"], "--algo.advantage.gamma must be in (0, 1]"),
    # the IS-correction guards (they were validate_is_config's)
    (
        ["--algo.advantage.is_correction_level", "geo", "--algo.advantage.is_correction_mode", "clip"],
        "'geo' is a sequence rejection filter and needs --algo.advantage.is_correction_mode 'mask', got 'clip'",
    ),
    (
        ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_mode", "trunc"],
        "'seq' is a sequence rejection filter and needs --algo.advantage.is_correction_mode 'mask', got 'trunc'",
    ),
    (["--train.async_queue_size", "2"], "--train.async_queue_size=2"),
    (["--algo.advantage.is_correction_level", "token", "--rollout.top_p", "0.95"], "--rollout.top_p 1.0, got 0.95"),
    (["--algo.advantage.is_correction_level", "tok"], "--algo.advantage.is_correction_level 'tok' is unknown"),
    (["--algo.advantage.is_correction_mode", "drop"], "--algo.advantage.is_correction_mode 'drop' is unknown"),
    (
        ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_threshold", "2", "1"],
        "HIGH or LOW HIGH with 0 <= LOW < HIGH, got 2.0 1.0",
    ),
    (["--actor.num_workers", "3", "--fsdp.tp_size", "2"], "--fsdp.tp_size 2 must divide --actor.num_workers 3"),
    (["--fsdp.offload", "params"], "--fsdp.offload 'params' is unknown"),
    (["--actor.num_workers", "3", "--fsdp.cp_size", "2"], "--fsdp.cp_size 2 must divide --actor.num_workers 3"),
    (
        ["--actor.num_workers", "4", "--fsdp.cp_size", "2", "--fsdp.tp_size", "2"],
        "context parallelism composes with FSDP2 only here",
    ),
    (["--actor.num_workers", "2", "--fsdp.cp_size", "2", "--actor.backend", "automodel"], "is not split by sequence"),
    (["--actor.num_workers", "3", "--fsdp.ep_size", "2"], "--fsdp.ep_size 2 must divide --actor.num_workers 3"),
    (
        ["--actor.num_workers", "4", "--fsdp.ep_size", "2", "--fsdp.tp_size", "2"],
        "expert and tensor parallelism together are not built",
    ),
    (
        ["--actor.num_workers", "2", "--fsdp.ep_size", "2", "--actor.backend", "automodel"],
        "--fsdp.ep_size 2 splits transformers' MoE experts (--actor.backend hf)",
    ),
    (
        ["--actor.num_workers", "2", "--fsdp.ep_size", "2", "--model.lora_dim", "8"],
        "PEFT adapters on split experts are not built",
    ),
    (
        ["--actor.num_workers", "2", "--fsdp.tp_size", "2", "--model.lora_dim", "8"],
        "--model.lora_dim 8 wraps in PEFT adapter layers the split does not cover",
    ),
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


@pytest.mark.parametrize(
    "extra",
    [
        ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "trunc"],
        ["--rollout.top_p", "0.9"],  # no IS correction: nucleus sampling is fine
        ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_threshold", "5"],
    ],
)
def test_accepted_is_correction_settings(extra):
    parse("rl", BASE + extra)


def test_geo_correction_accepts_partial_rollout_and_a_deeper_queue(monkeypatch):
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setitem(sys.modules, "vllm", module)  # looks installed to the probe; nothing of it runs
    flags_ = ["--rollout.engine", "vllm", "--train.partial_rollout_enable", "--train.async_queue_size", "2"]
    cfg = parse("rl", BASE + flags_ + ["--algo.advantage.is_correction_level", "geo"])
    assert cfg.train.partial_rollout_enable and cfg.train.async_queue_size == 2


COMMAND_LINES = [["--help"], *([name, "--help"] for name in ("demo", "rl", "sft", "eval", "report", "serve"))]


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=" ".join)
def test_every_command_prints_its_help_and_exits_0(argv, capsys):
    from molt_train.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's --help
        code = exc.code
    out = capsys.readouterr().out
    assert code == 0 and "usage: molt-train" in out
    if argv[0] in COMMANDS:
        shown = {f.name for f in flags.flags(COMMANDS[argv[0]], argv[0])}
        assert all(f"--{name} " in out or f"--{name}," in out or f"--{name}\n" in out for name in shown)


def test_help_shows_only_the_flags_the_command_reads(capsys):
    from molt_train.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = capsys.readouterr().out
    assert "--eval.split" in out and "--actor.model_name_or_path" in out
    for unread in ("--vllm.", "--ray.", "--actor.adam.lr", "--ckpt.", "--eval.steps", "--train.seed"):
        assert unread not in out, unread
    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    out = capsys.readouterr().out
    assert "--model.hidden_size" in out and "--data.output_key" in out
    for unread in ("--vllm.", "--algo.", "--actor.loss_mode", "--rollout.engine", "--train.async_queue_size"):
        assert unread not in out, unread


def test_the_readme_lists_every_flag_of_every_command():
    readme = (Path(__file__).resolve().parents[2] / "molt_train" / "README.md").read_text()
    from molt_train.config.seed import SEED_FLAGS

    assert flags.markdown(COMMANDS, SEED_FLAGS) in readme, "regenerate the tables: python -m molt_train.config"
