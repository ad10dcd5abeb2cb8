"""``molt-train rl --rollout.engine vllm --train.colocate_all`` end to end on one GPU (run on the H200; skipped
without CUDA or vLLM): the CLI in its own process, a random tiny Qwen2 model with a tokenizer trained on the gsm8k
split, Ray, FSDP2 on NCCL, vLLM in the rollout actor, CUDA-IPC weight sync. Three steps in sync mode with the
weight check after each and the mismatch metrics bounded; then partial rollout (IS correction) across syncs. With
two GPUs: the disaggregated placement (vLLM on a GPU of its own, NCCL broadcast sync), checked and async. On a tiny
Qwen3-MoE: routing replay (``--train.routing_replay``) and the frozen router (``--actor.freeze_moe_router``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"
MISMATCH = ("mismatch/bitwise_frac", "mismatch/abs_diff_mean", "mismatch/k3_kl")
COLOCATED = ("--train.colocate_all", "--vllm.gpu_memory_utilization", "0.35")
DISAGGREGATED = ("--vllm.num_engines", "1", "--actor.num_gpus_per_node", "1", "--vllm.gpu_memory_utilization", "0.5")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the disaggregated placement needs two GPUs")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:2000]]
    tok = train_tokenizer([r["question"] + " " + r["answer"] for r in rows], vocab_size=1024)
    model = build_tiny_model(
        tok, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512, max_positions=2048
    )
    return str(save_tiny(model, tok, tmp_path_factory.mktemp("tiny")))


def run_cli(
    model: str, out: Path, *extra: str, placement: tuple[str, ...] = COLOCATED, env: str = "molt/gsm8k-v1"
) -> list[dict[str, float]]:
    cmd = [
        sys.executable,
        "-m",
        "molt_train.cli",
        "rl",
        "--env",
        env,
        "--actor.model_name_or_path",
        model,
        "--rollout.engine",
        "vllm",
        *placement,
        "--rollout.n_samples_per_prompt",
        "8",
        "--algo.advantage.estimator",
        "grpo",
        "--rollout.batch_size",
        "4",
        "--rollout.max_new_tokens",
        "64",
        "--data.max_len",
        "1024",
        "--train.num_steps",
        "3",
        "--eval.max_samples",
        "8",
        "--vllm.enforce_eager",
        "--actor.adam.lr",
        "1e-4",
        "--ray.num_cpus",
        "8",
        "--ckpt.output_dir",
        str(out),
        "--no-logger.progress",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env, cwd=REPO, start_new_session=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "placement",
    [pytest.param(COLOCATED, id="colocated"), pytest.param(DISAGGREGATED, id="disaggregated", marks=two_gpus)],
)
def test_three_steps_check_the_sync_and_log_bounded_mismatch(model_dir, tmp_path, placement):
    records = run_cli(
        model_dir, tmp_path, "--train.force_sync_mode", "--train.check_weight_update_equal", placement=placement
    )
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["weight_sync/checked_params"] > 0  # a stale or unreached parameter would have stopped the run
        assert r["weight_sync/bytes"] > 0 and r["engine/generated_tokens"] > 0
        assert set(MISMATCH) <= set(r), sorted(r)
        assert 0.0 <= r["mismatch/bitwise_frac"] <= 1.0
        assert r["mismatch/k3_kl"] < 1e-2, r  # same weights (bf16 engine vs the trainer's bf16 compute): small
    assert (tmp_path / "hf" / "model.safetensors").exists()


def test_partial_rollout_syncs_under_requests_in_flight(model_dir, tmp_path):
    records = run_cli(
        model_dir,
        tmp_path,
        "--train.partial_rollout_enable",
        "--rollout.max_new_tokens",
        "256",
        "--algo.advantage.is_correction_level",
        "token",
        "--algo.advantage.is_correction_mode",
        "trunc",
    )
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(
        "weight_sync/paused_rollouts" in r and "is_filter_ratio" in r and set(MISMATCH) <= set(r) for r in records
    )


@two_gpus
def test_disaggregated_async_queue_overlaps_rollout_and_training(model_dir, tmp_path):
    records = run_cli(
        model_dir,
        tmp_path,
        "--train.async_queue_size",
        "2",
        "--algo.advantage.is_correction_level",
        "token",
        "--algo.advantage.is_correction_mode",
        "trunc",
        placement=DISAGGREGATED,
    )
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["weight_sync/bytes"] > 0 and set(MISMATCH) <= set(r) for r in records)
    # a batch generated while the trainer trained the one before: rollout k+1 starts before training k ends
    assert any(
        later["timing/rollout_start"] < earlier["timing/train_end"]
        for earlier, later in zip(records, records[1:], strict=False)
    )


@two_gpus
def test_two_way_fsdp2_with_colocated_vllm_matches_one_gpu(model_dir, tmp_path):
    """--actor.num_gpus_per_node 2: rank 0 shares its GPU with vLLM (CUDA IPC sync), rank 1 has the other. Same
    seed, same engine: the same rollouts, so the update must match the one-rank run's. Truncated answers are
    penalised so that groups differ in reward and the update is not zero. fp32 compute: this compares sharding,
    and bf16 rounding differs with how the rows are split into micro-batches."""
    flags = (
        "--train.force_sync_mode",
        "--train.check_weight_update_equal",
        "--train.num_steps",
        "2",
        "--reward.stop_properly_penalty_coef",
        "-1.0",
        "--actor.param_dtype",
        "float32",
    )
    one = run_cli(model_dir, tmp_path / "one", *flags)
    two = run_cli(model_dir, tmp_path / "two", *flags, placement=COLOCATED + ("--actor.num_gpus_per_node", "2"))
    for a, b in zip(one, two, strict=True):
        assert a["rollout/reward_mean"] == b["rollout/reward_mean"]  # the same rollouts
        assert a["train/grad_norm"] > 0
        for key in ("train/loss", "train/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), key


ENGINE_SPREADS = [
    pytest.param(("--vllm.tensor_parallel_size", "2"), 2, id="colocated-tp2"),
    pytest.param(("--vllm.data_parallel_size", "2"), 2, id="colocated-dp2"),
]


@pytest.mark.parametrize(("spread", "gpus"), ENGINE_SPREADS)
def test_a_colocated_engine_over_two_gpus_gets_every_shard_synced(model_dir, tmp_path, spread, gpus):
    """--vllm.tensor_parallel_size 2 / --vllm.data_parallel_size 2 with --train.colocate_all on two GPUs: vLLM's two
    workers (TP shards, or DP replicas) run on the two trainer ranks' GPUs, each loads the buckets the rank on its
    GPU shares (CUDA IPC), and the weight check, which asks every worker of every replica, finds nothing stale."""
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"an engine over {gpus} GPUs colocated with {gpus} trainer ranks needs {gpus} GPUs")
    placement = COLOCATED + ("--actor.num_gpus_per_node", str(gpus), *spread)
    records = run_cli(
        model_dir, tmp_path, "--train.force_sync_mode", "--train.check_weight_update_equal", placement=placement
    )
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["weight_sync/checked_params"] > 0 and r["engine/generated_tokens"] > 0
        assert r["mismatch/k3_kl"] < 1e-2, r  # every shard carries the trainer's weights


def test_a_disaggregated_tp2_engine_receives_the_broadcast_on_both_shards(model_dir, tmp_path):
    """--vllm.tensor_parallel_size 2 on GPUs of its own (3 GPUs: one trainer rank + two engine workers): trainer
    rank 0 broadcasts each bucket to a 3-rank NCCL group, both TP workers load their slice, the check passes."""
    if torch.cuda.device_count() < 3:
        pytest.skip("a disaggregated TP=2 engine needs 3 GPUs (1 trainer + 2 engine)")
    placement = DISAGGREGATED + ("--vllm.tensor_parallel_size", "2")
    records = run_cli(
        model_dir, tmp_path, "--train.force_sync_mode", "--train.check_weight_update_equal", placement=placement
    )
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["weight_sync/checked_params"] > 0 and r["mismatch/k3_kl"] < 1e-2 for r in records)


def test_lora_run_serves_the_trained_adapter_after_every_step(model_dir, tmp_path):
    """``--model.lora_dim``: the engine starts with ``enable_lora`` and after every step serves the trainer's PEFT
    adapter directory (a fresh ``LoRARequest``). On-policy with a large learning rate, so an engine still serving
    the base or an old adapter would show as a train/rollout mismatch far above bf16 rounding."""
    lora = ["--model.lora_dim", "8", "--model.lora_alpha", "16", "--actor.adam.lr", "5e-2", "--train.force_sync_mode"]
    records = run_cli(model_dir, tmp_path, *lora)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 8
    assert all(r["weight_sync/bytes"] > 0 for r in records)  # the adapter directory the engine loaded
    for r in records[1:]:  # sampled with the previous step's adapter: the trainer's policy, up to bf16
        assert r["mismatch/k3_kl"] < 1e-2, r
    assert sorted(p.name for p in (tmp_path / "lora_sync").iterdir()) == ["v2", "v3"]  # older ones removed


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    """A tiny random Qwen3-MoE (4 layers, 16 experts, top-4) with a tokenizer trained on the gsm8k split."""
    from molt_train.models.tiny import build_tiny_moe, save_tiny, train_tokenizer

    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:2000]]
    tok = train_tokenizer([r["question"] + " " + r["answer"] for r in rows], vocab_size=1024)
    moe = build_tiny_moe(tok, hidden_size=256, num_layers=4, num_experts=16, top_k=4, max_positions=2048)
    return str(save_tiny(moe, tok, tmp_path_factory.mktemp("moe")))


def test_routing_replay_takes_vllms_experts_into_the_training_forward(moe_dir, tmp_path):
    """vLLM records its experts (``enable_return_routed_experts``) and the trainer counts how often its bf16 routers
    choose otherwise, without (``--train.record_routing``) and with replay (``--train.routing_replay``). Step 1
    samples the same batch on the same weights in both runs, so the mismatch counted before the replay is alike, and
    replaying vLLM's experts brings the trainer's log-probs closer to vLLM's."""
    runs = {
        flag: run_cli(moe_dir, tmp_path / flag, "--train.force_sync_mode", f"--train.{flag}")
        for flag in ("record_routing", "routing_replay")
    }
    first = {flag: records[0] for flag, records in runs.items()}
    for flag, records in runs.items():
        print(flag, [(r["train/routing_mismatch_frac"], r["mismatch/abs_diff_mean"]) for r in records])
        assert [r["step"] for r in records] == [1, 2, 3]
        assert all(0 <= r["train/routing_mismatch_frac"] < 0.5 for r in records), (flag, records)
    assert first["routing_replay"]["train/routing_mismatch_frac"] == pytest.approx(
        first["record_routing"]["train/routing_mismatch_frac"], abs=0.02
    )
    assert first["routing_replay"]["mismatch/abs_diff_mean"] < first["record_routing"]["mismatch/abs_diff_mean"]


def test_freeze_moe_router_keeps_the_routers_and_vllm_routes_like_the_trainer(moe_dir, tmp_path):
    """``--actor.freeze_moe_router`` on a real MoE through vLLM: after three checked, synced steps with a large
    learning rate the saved routers are the start's while the experts moved, and vLLM's recorded experts agree with
    the trainer's routers (the engine serves the synced experts and the same frozen routers). ``molt/sort-v1``'s
    partial credit gives a random model's samples differing rewards, so GRPO has a gradient (gsm8k's are all 0)."""
    from safetensors.torch import load_file

    records = run_cli(
        moe_dir,
        tmp_path,
        "--rollout.max_new_tokens",
        "8",
        "--train.force_sync_mode",
        "--train.record_routing",
        "--train.check_weight_update_equal",
        "--actor.freeze_moe_router",
        "--actor.adam.lr",
        "1e-2",
        env="molt/sort-v1",
    )
    print("freeze", [(r["train/routing_mismatch_frac"], r["mismatch/k3_kl"]) for r in records])
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["weight_sync/checked_params"] > 0 for r in records)
    assert all(0 <= r["train/routing_mismatch_frac"] < 0.5 for r in records), records
    before = load_file(Path(moe_dir) / "model.safetensors")
    after = load_file(tmp_path / "hf" / "model.safetensors")
    routers = [k for k in before if k.endswith("mlp.gate.weight")]
    assert len(routers) == 4
    for key in routers:
        torch.testing.assert_close(after[key], before[key].to(after[key].dtype), rtol=0, atol=0, msg=key)
    experts = [k for k in before if ".experts." in k]
    assert experts and any(not torch.equal(after[k], before[k].to(after[k].dtype)) for k in experts)
