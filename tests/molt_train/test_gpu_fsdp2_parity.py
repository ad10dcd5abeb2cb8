"""Two-way FSDP2 on two GPUs gives the same update as one GPU: the trainer's ``PolicyWorker`` ranks (NCCL), one
optimizer step over the same token-budgeted micro-batches, full state dicts compared. Ray is not needed here: the
ranks are plain processes, one GPU each. Needs two GPUs (skipped on fewer):

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python3 -m pytest -m gpu tests/molt_train/test_gpu_fsdp2_parity.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (FSDP2 over two ranks)"),
]
GSM8K = Path(__file__).resolve().parents[2] / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"


def experience(vocab: int):
    from molt_envs import Trajectory
    from molt_train.experience import make_experience

    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(12):
        t = Trajectory(group_id=f"g{i // 4}", rollout_id=f"r{i}", reward=float(i % 2))
        t.append_observation(
            torch.randint(5, vocab, (int(torch.randint(8, 40, (1,), generator=g)),), generator=g).tolist()
        )
        n = int(torch.randint(4, 24, (1,), generator=g))
        t.append_action(torch.randint(5, vocab, (n,), generator=g).tolist(), [-1.0] * n)
        trajs.append(t)
    exp = make_experience(trajs, max_len=128, pad_id=0)
    exp.advantages = torch.randn(exp.action_mask.shape, generator=g) * exp.action_mask
    return exp


def rank_main(rank: int, world: int, model_dir: str, port: int, out: str) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # one GPU per rank, as Ray would assign it
    from molt_train.config import ActorConfig, AdamConfig, AlgoConfig
    from molt_train.experience import micro_batch, plan_micro_batches
    from molt_train.policy_worker import PolicyWorker

    # a comparison of sharding: bf16 rounding would differ with the split
    actor = ActorConfig(adam=AdamConfig(lr=1.0, eps=1.0), max_norm=0, logprob_chunk_size=64, param_dtype="float32")
    worker = PolicyWorker(rank, world, "127.0.0.1", port, actor, model_dir, seed=0)
    exp = experience(worker.config.vocab_size)
    plan = plan_micro_batches(exp.lengths.tolist(), world, 64, 400)
    per_rank = [[micro_batch(exp, rows, 0) for rows in micros] for micros in plan]
    before = {k: v.clone() for k, v in (worker.full_state_dict() or {}).items()}  # collective; rank 0 gets it
    result = worker.train_step(per_rank[rank], {"num_tokens": int(exp.action_mask.sum())}, AlgoConfig())
    loss = torch.tensor([float(result["loss"])], device=worker.device)
    torch.distributed.all_reduce(loss)  # each rank reports its share of the step's loss
    state = worker.full_state_dict()
    if rank == 0:
        moved = max(float((state[k] - before[k]).abs().max()) for k in state)
        torch.save(
            {
                "state": state,
                "loss": float(loss),
                "moved": moved,
                "micro_batches": len(plan[0]),
                "device": str(worker.device),
            },
            out,
        )
    worker.shutdown()


def test_two_ranks_give_the_one_rank_update(tmp_path: Path) -> None:
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:1000]]
    tok = train_tokenizer([r["question"] for r in rows], vocab_size=512)
    model_dir = str(save_tiny(build_tiny_model(tok, hidden_size=128, num_layers=4), tok, tmp_path / "model"))
    results = {}
    for world, port in ((1, 29611), (2, 29612)):
        out = str(tmp_path / f"w{world}.pt")
        mp.spawn(rank_main, args=(world, model_dir, port, out), nprocs=world, join=True)
        results[world] = torch.load(out)
    one, two = results[1], results[2]
    diffs = {k: float((one["state"][k].float() - two["state"][k].float()).abs().max()) for k in one["state"]}
    worst = max(diffs, key=diffs.get)
    print(
        f"device {one['device']}: loss 1 rank {one['loss']:.6f} vs 2 ranks {two['loss']:.6f}; micro-batches per "
        f"rank {one['micro_batches']} vs {two['micro_batches']}; the step moved weights by up to {one['moved']:.2e}; "
        f"max |param diff| 1 vs 2 ranks {diffs[worst]:.2e} ({worst}) over {len(diffs)} tensors"
    )
    assert one["moved"] > 1e-3, "the step did not move the weights: nothing was compared"
    assert abs(one["loss"] - two["loss"]) < 1e-4, (one["loss"], two["loss"])
    assert diffs[worst] < 1e-4, (worst, diffs[worst])
