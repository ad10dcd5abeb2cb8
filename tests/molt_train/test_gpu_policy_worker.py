"""The trainer's ``PolicyWorker`` on a GPU (run on the H200; skipped without CUDA): bf16 mixed precision over fp32
master weights and ``--actor.compile`` give the same log-probs and the same update as the fp32 eager worker, within
bf16 rounding. One rank, NCCL; each worker in its own process, as under Ray."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GSM8K = Path(__file__).resolve().parents[2] / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"


def run_worker(model_dir: str, param_dtype: str, compile_: bool, port: int, queue) -> None:
    from molt_envs import Trajectory
    from molt_train.config import ActorConfig, AdamConfig, AlgoConfig
    from molt_train.experience import make_experience, micro_batch, plan_micro_batches
    from molt_train.policy_worker import PolicyWorker

    # eps 1: the first Adam step is ~lr * gradient (not its sign), so bf16 noise in tiny gradients stays tiny
    actor = ActorConfig(
        adam=AdamConfig(lr=1.0, eps=1.0),
        max_norm=0,
        logprob_chunk_size=64,
        param_dtype=param_dtype,
        compile=compile_,
    )
    worker = PolicyWorker(0, 1, "127.0.0.1", port, actor, model_dir, seed=0)
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(16):  # rows of different lengths: padded micro-batches of different widths
        t = Trajectory(group_id=f"g{i // 4}", rollout_id=f"r{i}", reward=float(i % 2))
        t.append_observation(
            torch.randint(5, 1000, (int(torch.randint(8, 40, (1,), generator=g)),), generator=g).tolist()
        )
        n = int(torch.randint(4, 60, (1,), generator=g))
        t.append_action(torch.randint(5, 1000, (n,), generator=g).tolist(), [-7.0] * n)
        trajs.append(t)
    exp = make_experience(trajs, max_len=128, pad_id=0)
    exp.advantages = torch.randn(exp.action_mask.shape, generator=g) * exp.action_mask
    micros = [micro_batch(exp, rows, 0) for rows in plan_micro_batches(exp.lengths.tolist(), 1, 4, 4096)[0]]
    logps = worker.logprobs(micros, 1.0)
    result = worker.train_step(micros, {"num_tokens": int(exp.action_mask.sum())}, AlgoConfig(), temperature=1.0)
    after = worker.logprobs(micros, 1.0)
    masked = [lp[mb["action_mask"]] for lp, mb in zip(logps, micros, strict=True)]
    moved = [(a - b)[mb["action_mask"]] for a, b, mb in zip(after, logps, micros, strict=True)]
    # plain lists: a tensor would travel as a file descriptor that dies with this process
    queue.put(
        {
            "logp": torch.cat(masked).tolist(),
            "moved": torch.cat(moved).tolist(),
            "grad_norm": result["grad_norm"],
            "param_dtype": str(worker.optimizer.param_groups[0]["params"][0].dtype),
        }
    )
    worker.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:1000]]
    tok = train_tokenizer([r["question"] for r in rows], vocab_size=1024)
    model = build_tiny_model(tok, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512)
    return str(save_tiny(model, tok, tmp_path_factory.mktemp("tiny")))


def worker_result(model_dir: str, param_dtype: str, compile_: bool, port: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=run_worker, args=(model_dir, param_dtype, compile_, port, queue))
    proc.start()
    out = queue.get(timeout=300)
    proc.join(60)
    assert proc.exitcode == 0
    return {**out, "logp": torch.tensor(out["logp"]), "moved": torch.tensor(out["moved"])}


def test_bf16_and_compiled_workers_match_the_fp32_worker(model_dir):
    fp32 = worker_result(model_dir, "float32", False, 29641)
    bf16 = worker_result(model_dir, "bfloat16", False, 29642)
    compiled = worker_result(model_dir, "bfloat16", True, 29643)
    assert fp32["param_dtype"] == bf16["param_dtype"] == "torch.float32"  # the optimizer's master weights stay fp32
    assert fp32["moved"].abs().max() > 1e-3  # the step changed the policy
    for other in (bf16, compiled):
        assert (other["logp"] - fp32["logp"]).abs().mean() < 0.02  # bf16 rounding of ~7-nat log-probs
        assert other["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.05)
        # the update moved the log-probs the same way
        assert torch.nn.functional.cosine_similarity(other["moved"], fp32["moved"], dim=0) > 0.95
    assert (compiled["logp"] - bf16["logp"]).abs().mean() < 0.01
