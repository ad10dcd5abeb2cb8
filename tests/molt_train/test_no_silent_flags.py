"""No silent flag (issue "Trainer, third floor" §1.3): every flag of every command, given on the command line in a run
where nothing reads it, exits 2 naming it and what would make it act (``molt_train/config/inert.py``), or is listed
here as read by every run of the command. The list of flags comes from the config dataclasses, so a new flag fails
this test until it is classified. Parse-level only: no run starts."""

from __future__ import annotations

import pytest
import torch

from molt_train.config import COMMANDS, parse
from molt_train.config.flags import Flag, flags
from molt_train.config.inert import WARNED, inert_warnings, rules_for

BASE = {
    "rl": ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "out"],
    "sft": ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "out"],
    "eval": ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m"],
}
# Read by every run of the command (or refused by their own rules where they cannot act, in test_config.py and
# test_rollout_engine_flags.py: --train.partial_rollout_enable without vllm, --actor.dual_clip outside ppo,
# --algo.advantage.is_correction_gating binary_kl with the correction off, --train.batch_invariant,
# --fsdp.packing_samples, --fsdp.attn_implementation te / flash_attention_2 here, --ref.num_nodes > 1, ...).
TRAINING_READ = {
    "env", "ray.address", "actor.model_name_or_path", "actor.num_workers", "actor.backend", "actor.freeze_moe_router",
    "actor.adam.lr", "actor.adam.betas", "actor.adam.eps", "actor.adam.weight_decay", "actor.lr_warmup_ratio",
    "actor.lr_scheduler", "actor.max_norm", "actor.logprob_chunk_size", "actor.gradient_checkpoint",
    "actor.param_dtype", "actor.num_threads", "fsdp.tp_size", "fsdp.cp_size", "fsdp.ep_size", "fsdp.offload",
    "fsdp.attn_implementation", "fsdp.packing_samples", "model.lora_dim", "model.lora_target_modules",
    "data.prompt_dataset", "data.max_samples", "data.max_len", "train.agent_path", "train.seed", "train.num_steps",
    "train.batch_size", "train.micro_batch_size", "train.max_tokens_per_gpu", "ckpt.output_dir", "ckpt.save_steps",
    "ckpt.load_enable", "eval.max_samples", "logger.progress", "logger.wandb_project",
}  # fmt: skip
ALWAYS_READ = {
    "rl": TRAINING_READ | {
        "actor.num_gpus_per_node", "actor.loss_mode", "actor.eps_clip_low_high", "actor.dual_clip",
        "actor.loss_agg_mode", "rollout.engine", "rollout.batch_size", "rollout.n_samples_per_prompt",
        "rollout.max_new_tokens", "rollout.temperature", "rollout.top_p", "rollout.top_k", "rollout.timeout_s",
        "rollout.num_workers", "algo.advantage.estimator", "algo.advantage.is_correction_level",
        "algo.advantage.is_correction_gating", "algo.advantage.score_centering_top_k", "algo.kl.init_coef",
        "algo.dynamic_filtering_enable", "reward.clip_range", "reward.overlong_buffer_len",
        "reward.stop_properly_penalty_coef", "train.max_epochs", "train.async_queue_size", "train.force_sync_mode",
        "train.partial_rollout_enable", "train.colocate_all", "train.check_weight_update_equal",
        "train.rollout_dump_dir", "train.rollout_replay_dir", "train.routing_replay", "train.record_routing",
        "train.force_on_policy", "train.batch_invariant", "eval.eval_only", "eval.dataset", "judge.policy",
        "judge.model_name_or_path",
    },
    "sft": TRAINING_READ | {"model.config"},
    "eval": {
        "env", "actor.model_name_or_path", "data.max_len", "rollout.max_new_tokens", "rollout.timeout_s",
        "rollout.max_batch_size", "train.agent_path", "eval.max_samples", "eval.max_new_tokens", "eval.temperature",
        "eval.n_samples_per_prompt", "eval.dataset", "eval.top_p",
    },
}  # fmt: skip


def other_value(flag: Flag) -> list[str]:
    """The flag on the command line with a valid value other than its default."""
    name, default = flag.name, flag.default
    if flag.kind is bool:
        return [f"--no-{name}" if default else f"--{name}"]
    if flag.choices:
        return [f"--{name}", next(c for c in sorted(flag.choices) if c != default)]
    if flag.nargs is not None:
        values = [str(v / 2 if isinstance(v, float) else v + 1) for v in default] if default else ["x"]
        return [f"--{name}", *values]
    if flag.kind is str:
        return [f"--{name}", "x"]
    if default is None:
        return [f"--{name}", str(max(flag.minimum or 0, 1) + 1)]
    return [f"--{name}", str(default / 2 if flag.kind is float and default else default + 1)]


CASES = [(command, flag) for command, cls in COMMANDS.items() for flag in flags(cls, command)]


@pytest.mark.parametrize(("command", "flag"), CASES, ids=[f"{c}:{f.name}" for c, f in CASES])
def test_a_flag_that_cannot_act_is_refused_naming_what_would_make_it_act(command, flag, capsys):
    refusing = [rule for rule in rules_for(flag.name, command) if not rule.warn]
    if not refusing:
        assert flag.name in ALWAYS_READ[command], (
            f"--{flag.name} ({command}): add a rule in molt_train/config/inert.py for the runs where it has no "
            "effect, or list it in ALWAYS_READ"
        )
        return
    rule = refusing[0]
    if rule.when.__name__ == "_no_cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the flag acts")
    with pytest.raises(SystemExit) as exc:
        parse(command, BASE[command] + list(rule.example) + other_value(flag))
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"--{flag.name} " in err and "has no effect" in err and rule.fix in err, err


def test_the_always_read_lists_name_only_real_flags():
    for command, cls in COMMANDS.items():
        names = {f.name for f in flags(cls, command)}
        assert ALWAYS_READ[command] <= names, ALWAYS_READ[command] - names


def test_the_warned_exceptions_are_few_and_recorded():
    """--eval.eval_only appended to a training command line warns (once) about the training flags, and the run
    records the warnings (config.json / eval_results.json: ``flag_warnings``)."""
    assert len(WARNED) == 1
    argv = BASE["rl"] + ["--eval.eval_only", "--rollout.batch_size", "4", "--actor.adam.lr", "1e-3"]
    warnings = inert_warnings(parse("rl", argv), "rl")
    assert any(w.startswith("--rollout.batch_size 4 has no effect: --eval.eval_only") for w in warnings)
    assert any(w.startswith("--actor.adam.lr 0.001 has no effect") for w in warnings)
    assert inert_warnings(parse("rl", BASE["rl"] + ["--eval.eval_only"]), "rl") == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # the seed's RL quick start's engine flags on the default hf engine
        (["--vllm.num_engines", "2"], "--vllm.num_engines 2 has no effect"),
        (["--vllm.tensor_parallel_size", "2"], "add --rollout.engine vllm"),
        (["--algo.advantage.estimator", "grpo", "--algo.advantage.no_whiten"], "--algo.advantage.no_whiten True"),
        (["--critic.value_clip", "0.1"], "only --algo.advantage.estimator gae builds"),
        (["--reward.overlong_penalty_factor", "0.5"], "add --reward.overlong_buffer_len N"),
        (["--judge.timeout_s", "5"], "add --judge.policy or --judge.model_name_or_path"),
    ],
)
def test_the_known_offenders_are_refused(extra, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("rl", BASE["rl"] + extra)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_sft_shape_flags_with_a_checkpoint_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("sft", BASE["sft"] + ["--model.hidden_size", "128"])
    assert exc.value.code == 2
    assert "--model.hidden_size 128 has no effect" in capsys.readouterr().err
