"""``molt-train rl`` runs that skip a part or add one, end to end on a real local Ray and a tiny from-scratch
policy: ``--eval.eval_only`` (no trainer ranks), ``--train.rollout_dump_dir`` then ``--train.rollout_replay_dir`` (no
generation, bit-identical losses), ``--ckpt.save_hf``, ``--no-train.colocate_fsdp_models``, ``--logger.wandb_project``
(a real offline W&B run); and the flags' refusals."""

from __future__ import annotations

import json

import pytest

from molt_train import rl_cli
from molt_train.config import parse

BASE = ["--env", "molt/arith-v1", "--ckpt.output_dir", "out", "--actor.model_name_or_path", "m"]


@pytest.fixture(scope="module")
def tiny_policy(tiny_tokenizer, tmp_path_factory):
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("tiny-policy"))


def rl_argv(model, out, *extra: str) -> list[str]:
    return [
        "--env",
        "molt/arith-v1",
        "--actor.model_name_or_path",
        str(model),
        "--ckpt.output_dir",
        str(out),
        "--rollout.batch_size",
        "4",
        "--rollout.n_samples_per_prompt",
        "2",
        "--algo.advantage.estimator",
        "grpo",
        "--rollout.max_new_tokens",
        "4",
        "--actor.adam.lr",
        "1e-3",
        "--no-logger.progress",
        *extra,
    ]


def records(out) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_eval_only_scores_once_and_builds_no_trainer(ray_local, tiny_policy, tmp_path, monkeypatch, capsys):
    from molt_train import rl_trainer

    def no_trainer(*args, **kwargs):
        raise AssertionError("--eval.eval_only built trainer workers")

    monkeypatch.setattr(rl_trainer.WorkerGroup, "__init__", no_trainer)
    argv = rl_argv(tiny_policy, tmp_path, "--eval.eval_only", "--eval.max_samples", "6")
    argv += ["--eval.n_samples_per_prompt", "3", "--eval.temperature", "1.0", "--eval.top_p", "0.9"]
    assert rl_cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["eval/num_rows"] == 6 and printed["eval/failed"] == 0 and 0 <= printed["eval/accuracy"] <= 1
    assert any(k.startswith("eval/pass@") for k in printed)  # n samples per row: pass@k for k <= n
    saved = json.loads((tmp_path / "eval_results.json").read_text())
    assert saved["split"] == "test" and saved["sampling"]["top_p"] == 0.9
    assert json.loads((tmp_path / "molt_env_lock.json").read_text()) == saved["env_lock"]  # the env scored
    assert [e["weight"] for e in saved["env_lock"]["envs"]] == [1.0] and saved["env_lock"]["envs"][0]["spec_hash"]
    (record,) = records(tmp_path)
    assert record["step"] == 0 and not any(k.startswith("train/") for k in record)
    assert not (tmp_path / "hf").exists() and not (tmp_path / "checkpoints").exists()


def test_eval_only_on_an_eval_dataset_file(ray_local, tiny_policy, tmp_path, capsys):
    rows = tmp_path / "held_out.jsonl"
    rows.write_text("".join(json.dumps({"q": f"{i}+1=", "a": str(i + 1)}) + "\n" for i in range(5)))
    argv = rl_argv(tiny_policy, tmp_path / "run", "--eval.eval_only", "--eval.dataset", str(rows))
    argv += ["--data.input_key", "q", "--data.label_key", "a"]
    assert rl_cli.main(argv) == 0
    saved = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert saved["dataset"] == str(rows) and saved["eval/num_rows"] == 5


def test_eval_top_p_falls_back_to_the_rollout():
    from molt_train.rollout import eval_sampling

    assert eval_sampling(parse("rl", BASE + ["--rollout.top_p", "0.8"]))["top_p"] == 0.8
    assert eval_sampling(parse("rl", BASE + ["--rollout.top_p", "0.8", "--eval.top_p", "0.5"]))["top_p"] == 0.5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--eval.eval_only", "--eval.max_samples", "0"], "--eval.max_samples 0 has nothing to score"),
        (["--eval.eval_only", "--ckpt.load_enable"], "so --ckpt.load_enable does nothing"),
        (["--eval.top_p", "0"], "--eval.top_p must be in"),
        (["--eval.n_samples_per_prompt", "0"], "--eval.n_samples_per_prompt must be >= 1"),
    ],
)
def test_refused_run_modes_name_the_flags(extra, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("rl", BASE + extra)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_eval_only_needs_rows_but_no_training_data(capsys):
    argv = [
        "--train.agent_path",
        "a.py",
        "--ckpt.output_dir",
        "o",
        "--actor.model_name_or_path",
        "m",
        "--eval.eval_only",
    ]
    cfg = parse("rl", [*argv, "--eval.dataset", "rows.jsonl"])
    assert cfg.eval.eval_only and cfg.data.prompt_dataset is None
    with pytest.raises(SystemExit):
        parse("rl", argv)
    assert "--eval.eval_only needs rows" in capsys.readouterr().err


KL_MODEL = ["--algo.kl.init_coef", "0.01", "--algo.kl.ref", "model", "--algo.kl.use_loss", "--algo.kl.estimator", "k3"]


@pytest.fixture(scope="module")
def dumped_run(ray_local, tiny_policy, tmp_path_factory):
    """Three steps that dump their batches, keep HF copies of their checkpoints, put the reference ranks on ranks of
    their own and log to an offline W&B run; then the same three steps replayed from the dump."""
    tmp = tmp_path_factory.mktemp("dumped")
    dump, first, second = tmp / "dump", tmp / "first", tmp / "second"
    common = ["--train.num_steps", "3", "--eval.max_samples", "0", *KL_MODEL, "--no-train.colocate_fsdp_models"]
    argv = rl_argv(tiny_policy, first, *common, "--train.rollout_dump_dir", str(dump))
    argv += ["--ckpt.save_steps", "1", "--ckpt.max_num", "1", "--ckpt.save_hf"]
    argv += ["--logger.wandb_project", "molt-test", "--logger.wandb_run_name", "arith-dump"]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        assert rl_cli.main(argv) == 0
    assert rl_cli.main(rl_argv(tiny_policy, second, *common, "--train.rollout_replay_dir", str(dump))) == 0
    return dump, first, second


def test_a_replayed_dump_trains_to_bit_identical_losses(dumped_run):
    from molt_train import rollout_dump

    dump, first, second = dumped_run
    assert sorted(p.name for p in dump.iterdir()) == [f"batch_00000{i}.pkl" for i in range(3)]
    a, b = records(first), records(second)
    assert [r["step"] for r in b] == [1, 2, 3]
    for x, y in zip(a, b, strict=True):
        assert x["rollout/num_rollouts"] == y["rollout/num_rollouts"] and x["train/tokens"] == y["train/tokens"]
        for key in ("train/loss", "train/grad_norm", "kl_loss", "kl", "mismatch/abs_diff_mean"):
            assert x[key] == y[key], (x["step"], key)  # bit-identical, not approximately equal
        assert "timing/weight_sync_move_s" in x and "timing/weight_sync_move_s" not in y  # no engine to sync
    # the reference group ran (on ranks of its own) every step: its KL is in every record, 0 before the first update
    assert a[0]["kl"] == 0.0 and all("kl_loss" in r and "kl" in r for r in a)
    with pytest.raises(FileNotFoundError, match="has no batch 3 .* it holds 3 batches"):
        rollout_dump.read(dump, 3)


def test_save_hf_keeps_every_saved_steps_model(dumped_run):
    from transformers import AutoModelForCausalLM

    _, first, _ = dumped_run
    assert [p.name for p in (first / "checkpoints").glob("step_*")] == ["step_2"]  # --ckpt.max_num 1 rotated
    assert sorted(p.name for p in (first / "hf_steps").iterdir()) == ["step_1", "step_2"]
    AutoModelForCausalLM.from_pretrained(first / "hf_steps" / "step_1")


def test_the_run_logged_to_an_offline_wandb_run_that_wandb_sync_reads(dumped_run):
    import subprocess
    import sys
    from pathlib import Path

    _, first, _ = dumped_run
    assert list((first / "tensorboard").iterdir())  # next to TensorBoard and metrics.jsonl
    (run_dir,) = (first / "wandb").glob("offline-run-*")
    run_id = (first / "wandb" / "run_id").read_text()
    (log,) = run_dir.glob(f"run-{run_id}.wandb")
    records_bytes = log.read_bytes()  # protobuf records: their string fields are stored as they are
    assert all(k in records_bytes for k in (b"train/loss", b"kl_loss", b"molt-test", b"arith-dump"))
    wandb = Path(sys.executable).with_name("wandb")
    dry = subprocess.run([str(wandb), "sync", "--dry-run", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "Would sync 1 run(s)" in dry.stdout + dry.stderr, dry.stderr[-2000:]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--train.rollout_replay_dir", "/nonexistent"], "is not a directory"),
        (["--train.rollout_replay_dir", ".", "--train.rollout_dump_dir", "d"], "drop one of them"),
        (["--train.rollout_replay_dir", ".", "--eval.steps", "2"], "so --eval.steps cannot act"),
        (["--train.colocate_all", "--no-train.colocate_fsdp_models"], "--no-train.colocate_fsdp_models forbids"),
    ],
)
def test_refused_replay_and_placement_flags_name_the_flags(extra, message, capsys):
    with pytest.raises(SystemExit):
        parse("rl", BASE + extra)
    assert message in capsys.readouterr().err


def test_reference_ranks_get_gpus_of_their_own_without_colocate_fsdp_models():
    from molt_train.placement import plan_placement

    def plan(*extra: str, gpus: float):
        return plan_placement(parse("rl", BASE + KL_MODEL + list(extra)), cluster_gpus=gpus, host_cpus=8)

    shared = plan(gpus=2)
    assert shared.reference_gpus == shared.trainer_gpus == 1.0
    own = plan("--no-train.colocate_fsdp_models", gpus=2)
    assert own.trainer_gpus == own.reference_gpus == 1.0  # one GPU each: 2 in all
    with pytest.raises(RuntimeError, match="2 GPUs for 1 policy \\+ 1 reference ranks"):
        plan("--no-train.colocate_fsdp_models", gpus=1)
    assert plan("--no-train.colocate_fsdp_models", gpus=0).reference_gpus == 0.0  # CPU: nothing to separate


def test_with_vllm_the_reference_ranks_get_bundles_of_their_own(monkeypatch):
    import importlib.machinery
    import sys
    import types

    from molt_train.placement import plan_placement

    module = types.ModuleType("vllm")  # the config's import probe sees a vllm module (no code of it runs)
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setitem(sys.modules, "vllm", module)
    flags = BASE + KL_MODEL + ["--rollout.engine", "vllm", "--actor.num_workers", "2"]
    shared = plan_placement(parse("rl", flags), cluster_gpus=3, host_cpus=8)
    assert shared.reference_bundles == shared.trainer_bundles == (0, 1) and shared.engine_bundle == 2
    own = plan_placement(parse("rl", flags + ["--no-train.colocate_fsdp_models"]), cluster_gpus=5, host_cpus=8)
    assert len(own.bundles) == 5 and own.trainer_bundles == (0, 1) and own.reference_bundles == (2, 3)
    assert own.engine_bundle == 4
