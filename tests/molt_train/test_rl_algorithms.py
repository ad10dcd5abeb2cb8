"""The seed's policy losses, IS gates, score centering, on-policy distillation, PPO with a critic and LoRA, each for a
few steps through ``molt-train rl`` / ``sft`` (the real commands in-process, one real local Ray, gloo FSDP2 ranks,
the hf engine, tiny models), and the refused combinations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from molt_train import rl_cli
from molt_train.config import parse
from molt_train.config.flags import ConfigError

BASE = ["--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "4"]
BASE += ["--eval.max_samples", "0", "--actor.adam.lr", "1e-3", "--no-logger.progress", "--data.max_len", "64"]


@pytest.fixture(scope="module")
def student(tiny_tokenizer, tmp_path_factory) -> Path:
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("student"))


def run_rl(out: Path, argv: list[str]) -> list[dict]:
    assert rl_cli.main(argv + ["--ckpt.output_dir", str(out)]) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


AGENT = str(Path(__file__).parent / "agents" / "parity_reward.py")
CASES = {  # several features per run: a run costs ~10 s of actor start-up
    "gspo+binary_kl": (
        ["--actor.loss_mode", "gspo", "--algo.advantage.estimator", "grpo"]
        + ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating", "binary_kl"]
        + ["--algo.advantage.is_correction_threshold", "5e-3"],
        ("clip_ratio", "is_seq_kl_mean"),
    ),
    "cispo": (
        ["--actor.loss_mode", "cispo", "--actor.eps_clip_low_high", "0.2", "1.2", "--train.max_epochs", "2"],
        ("clip_ratio",),
    ),
    "score_centering+tis": (
        ["--algo.advantage.score_centering_top_k", "8", "--algo.advantage.is_correction_level", "token"]
        + ["--algo.advantage.is_correction_mode", "trunc", "--algo.advantage.is_correction_threshold", "2.0"],
        ("score_centering/term_mean", "is_filter_ratio"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_rl_steps(ray_local, student, tmp_path, case):
    flags, metrics = CASES[case]
    argv = ["--env", "molt/arith-v1", "--train.agent_path", AGENT, "--actor.model_name_or_path", str(student)]
    records = run_rl(tmp_path, argv + ["--train.num_steps", "2"] + BASE + flags)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["train/tokens"] > 0 and r["rollout/dropped_total"] == 0
        assert set(metrics) <= set(r) and r["train/loss"] == r["train/loss"]  # logged, and not NaN
        # a batch whose parity rewards differ within a group moves the policy (one of equal rewards has no signal)
        assert r["train/grad_norm"] > 0 or r["advantage/abs_mean"] == 0
    assert any(r["train/grad_norm"] > 0 for r in records)
    if case.startswith("score_centering"):  # the sampler's top-k reached the loss: an average log-prob, < 0
        assert all(r["score_centering/term_mean"] < 0 for r in records)


@pytest.fixture(scope="module")
def teacher(tiny_tokenizer, tmp_path_factory) -> Path:
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=1)  # near-uniform next tokens
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def peaked_student(tiny_tokenizer, tmp_path_factory) -> Path:
    """Another init, with sharp next-token distributions (scaled tied embeddings): far from the teacher."""
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("peaked"))


def test_on_policy_distillation_pulls_the_student_toward_the_teacher(ray_local, peaked_student, teacher, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"Tell me about {w}."}) + "\n" for w in "abcdefgh"))
    argv = ["--data.prompt_dataset", str(prompts), "--actor.model_name_or_path", str(peaked_student)]
    argv += ["--ref.model_name_or_path", str(teacher), "--algo.advantage.estimator", "on_policy_distill"]
    argv += ["--train.num_steps", "8", "--rollout.batch_size", "8", "--rollout.max_new_tokens", "6"]
    argv += ["--actor.adam.lr", "2e-2", "--eval.max_samples", "0", "--no-logger.progress", "--data.max_len", "64"]
    records = run_rl(tmp_path / "run", argv)
    kl = [r["kl"] for r in records]  # k1 estimate of KL(student || teacher) on the student's own samples
    assert len(kl) == 8 and kl[0] > 1.0  # the sharp student starts far from the flat teacher
    assert sum(kl[-2:]) / 2 < 0.6 * sum(kl[:2]) / 2, kl  # and moves toward it
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["algo"]["kl"] == {"init_coef": 1.0, "estimator": "k1", "use_loss": False, "ref": "model"}


def test_distillation_refuses_a_teacher_with_another_tokenizer(ray_local, student, tmp_path):
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    other_tok = train_tokenizer([f"{i} apples and {i * 3} pears" for i in range(200)], vocab_size=300)
    other = save_tiny(build_tiny_model(other_tok, hidden_size=32, num_layers=1), other_tok, tmp_path / "other")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input": "hi"}) + "\n")
    argv = ["--data.prompt_dataset", str(prompts), "--actor.model_name_or_path", str(student)]
    argv += ["--ref.model_name_or_path", str(other), "--algo.advantage.estimator", "on_policy_distill"]
    with pytest.raises(ConfigError, match="--ref.model_name_or_path .* tokenizer differs"):
        rl_cli.main(argv + ["--ckpt.output_dir", str(tmp_path / "out")])


REQUIRED = ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "o"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--actor.loss_mode", "gspo", "--actor.dual_clip", "3"], "--actor.loss_mode gspo has no dual clip"),
        (["--actor.loss_mode", "cispo"], "absolute ceiling .* got 0.2"),
        (
            ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating", "binary_kl"],
            "one --algo.advantage.is_correction_threshold value",
        ),
        (
            ["--algo.advantage.is_correction_gating", "binary_kl"],  # (with a threshold: that flag has no effect)
            "got level 'off'",
        ),
        (
            ["--algo.advantage.score_centering_top_k", "8", "--algo.advantage.is_correction_level", "geo"],
            "cannot be stacked on the sequence gate",
        ),
        (["--algo.advantage.score_centering_top_k", "8", "--rollout.top_k", "20"], "--rollout.top_k 20"),
        (
            ["--algo.advantage.score_centering_top_k", "8", "--actor.loss_mode", "gspo"],
            "--actor.loss_mode gspo has no centered form",
        ),
        (["--algo.advantage.estimator", "on_policy_distill"], "pass --ref.model_name_or_path TEACHER"),
        (
            ["--algo.advantage.estimator", "on_policy_distill", "--ref.model_name_or_path", "t", "--algo.kl.use_loss"],
            "drop --algo.kl.estimator k1 / --algo.kl.use_loss",
        ),
    ],
)
def test_refused_combinations_name_the_flags(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("rl", REQUIRED + flags)
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_ppo_with_a_critic_trains_checkpoints_and_resumes_it(ray_local, student, tmp_path):
    argv = ["--env", "molt/arith-v1", "--train.agent_path", AGENT, "--actor.model_name_or_path", str(student)]
    argv += BASE + ["--algo.advantage.estimator", "gae", "--critic.adam.lr", "1e-2", "--algo.advantage.lam", "0.9"]
    records = run_rl(tmp_path, argv + ["--train.num_steps", "2", "--ckpt.save_steps", "1"])
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["critic/value_mean"] == 0.0  # a zero-initialised value head
    assert records[1]["critic/value_mean"] != 0.0 and all(r["critic/grad_norm"] > 0 for r in records)
    assert all("critic/loss" in r and "critic/clip_frac" in r for r in records)
    saved = torch.load(tmp_path / "checkpoints" / "step_1" / "_critic" / "critic.pt", weights_only=False)
    assert {"model", "optimizer", "scheduler"} <= set(saved) and "value_head.weight" in saved["model"]
    assert saved["model"]["value_head.weight"].abs().sum() > 0  # one step trained it
    resumed = run_rl(tmp_path, argv + ["--train.num_steps", "3", "--ckpt.load_enable"])
    assert [r["step"] for r in resumed][-2:] == [2, 3]  # from step_1, critic state included
    assert resumed[-2]["critic/value_mean"] != 0.0  # the resumed head, not a fresh zero one


# -- LoRA through PEFT (--model.lora_*) --

LORA = ["--model.lora_dim", "4", "--model.lora_alpha", "8", "--actor.adam.lr", "2e-2"]


def same_logits(a, b, ids) -> bool:
    with torch.no_grad():
        return torch.allclose(a(input_ids=ids).logits, b(input_ids=ids).logits, atol=1e-5)


def test_sft_with_lora_trains_only_the_adapters_and_exports_adapter_and_merged(ray_local, student, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from molt_train import sft_cli

    argv = ["--env", "molt/arith-v1", "--actor.model_name_or_path", str(student), "--ckpt.output_dir", str(tmp_path)]
    argv += ["--train.num_steps", "3", "--train.batch_size", "8", "--eval.max_samples", "0", "--no-logger.progress"]
    argv += LORA + ["--model.lora_target_modules", "*.q_proj", "*.v_proj", "*.down_proj"]
    assert sft_cli.main(argv) == 0
    losses = [json.loads(line)["train/loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0]
    adapter = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8
    before = AutoModelForCausalLM.from_pretrained(student)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    original = before.state_dict()
    changed = {k for k, v in merged.state_dict().items() if not torch.equal(v, original[k])}
    # the merge moved exactly the targeted projections; embeddings, norms, k/o/gate/up stayed the base's
    assert changed == {
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    }, changed
    ids = torch.tensor([[5, 17, 40, 3, 99]])
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(student), tmp_path / "adapter")
    assert same_logits(peft, merged, ids)  # adapter on the base == the merged checkpoint
    assert not same_logits(before, merged, ids)


def test_rl_with_lora_syncs_only_the_adapters_and_checks_them(ray_local, student, tmp_path):
    from transformers import AutoModelForCausalLM

    from molt_train import rl_cli

    argv = ["--env", "molt/arith-v1", "--actor.model_name_or_path", str(student), "--ckpt.output_dir", str(tmp_path)]
    argv += ["--train.agent_path", AGENT]  # parity rewards: arith gives an untrained model 0 everywhere, no update
    argv += ["--train.num_steps", "2", "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2"]
    argv += ["--rollout.max_new_tokens", "4", "--eval.max_samples", "0", "--no-logger.progress"]
    argv += ["--train.check_weight_update_equal", "--ckpt.save_steps", "1", "--data.max_len", "64"] + LORA
    assert rl_cli.main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    full = AutoModelForCausalLM.from_pretrained(student)
    full_bytes = sum(p.numel() * 4 for p in full.parameters())
    linear = [m for m in full.modules() if isinstance(m, torch.nn.Linear) and m is not full.lm_head]
    adapter_bytes = sum(4 * 4 * (m.in_features + m.out_features) for m in linear)  # rank 4: A (4 x in) + B (out x 4)
    for r in records:
        assert r["weight_sync/bytes"] == adapter_bytes < full_bytes / 5  # the adapters only reach the engine
        assert r["weight_sync/checked_params"] == 2 * len(linear)  # every lora_A / lora_B equals the trainer's
    assert (tmp_path / "checkpoints" / "step_1" / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight, full.model.layers[0].self_attn.q_proj.weight)
    torch.testing.assert_close(merged.model.embed_tokens.weight, full.model.embed_tokens.weight, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model.lora_dim", "4", "--actor.backend", "automodel"], "--actor.backend automodel is not supported"),
        (["--model.lora_target_modules", "*.q_proj"], "needs --model.lora_dim > 0"),
        (
            ["--model.lora_dim", "4", "--rollout.engine", "vllm", "--train.check_weight_update_equal"],
            "drop --train.check_weight_update_equal",
        ),
    ],
)
def test_lora_refusals_name_the_flags(argv, message, capsys):
    from molt_train.config import parse

    with pytest.raises(SystemExit):
        parse("rl", ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "o", *argv])
    assert message in capsys.readouterr().err


def test_lora_targets_that_match_nothing_name_the_flag(tiny_model):
    import copy

    from molt_train import lora
    from molt_train.config import ModelConfig

    with pytest.raises(ValueError, match="--model.lora_target_modules q_proj matched no linear layer"):
        lora.inject(copy.deepcopy(tiny_model), ModelConfig(lora_dim=4, lora_target_modules=("q_proj",)))
