"""The seed's policy losses, IS gates, score centering and on-policy distillation, each for a few steps through
``molt-train rl`` (the real command in-process, a real local Ray, gloo FSDP2 ranks, the hf engine, tiny models)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from molt_train import rl_cli
from molt_train.config import parse
from molt_train.flags import ConfigError

BASE = ["--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "4"]
BASE += ["--eval.max_samples", "0", "--actor.adam.lr", "1e-3", "--no-logger.progress", "--data.max_len", "64"]


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


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
        assert r["train/grad_norm"] > 0  # the parity rewards differ: the loss moved the policy
    if case.startswith("score_centering"):  # the sampler's top-k reached the loss: an average log-prob, < 0
        assert all(r["score_centering/term_mean"] < 0 for r in records)


@pytest.fixture(scope="module")
def teacher(tiny_tokenizer, tmp_path_factory) -> Path:
    """A differently initialised tiny model with sharp next-token distributions (scaled embeddings)."""
    import torch

    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=1)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(40.0)  # tied with the head: peaked logits
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("teacher"))


def test_on_policy_distillation_pulls_the_student_toward_the_teacher(ray_local, student, teacher, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"Tell me about {w}."}) + "\n" for w in "abcdefgh"))
    argv = ["--data.prompt_dataset", str(prompts), "--actor.model_name_or_path", str(student)]
    argv += ["--ref.model_name_or_path", str(teacher), "--algo.advantage.estimator", "on_policy_distill"]
    argv += ["--train.num_steps", "8", "--rollout.batch_size", "8", "--rollout.max_new_tokens", "6"]
    argv += ["--actor.adam.lr", "2e-2", "--eval.max_samples", "0", "--no-logger.progress", "--data.max_len", "64"]
    records = run_rl(tmp_path / "run", argv)
    kl = [r["kl"] for r in records]
    assert len(kl) == 8 and kl[0] > 1.0  # the student starts far from the sharp teacher
    assert sum(kl[-2:]) / 2 < 0.5 * sum(kl[:2]) / 2, kl  # the reverse KL on its own samples falls
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
            ["--algo.advantage.is_correction_gating", "binary_kl", "--algo.advantage.is_correction_threshold", "0.01"],
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
