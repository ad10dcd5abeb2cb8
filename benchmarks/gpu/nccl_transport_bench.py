"""The transport half of disaggregated weight sync: trainer rank 0 on GPU 0 broadcasts packed bf16 buckets to a
receiver on GPU 1 over NCCL, one ``broadcast`` per bucket (``molt_train.engines.weight_buckets``), for the Qwen3-0.6B
and 1.7B shapes. Timed per sync as lock-wait (both sides reaching the sync point) vs pack + transfer; the receiver
unpacks and every tensor is checked against the sender's checksum. vLLM's ``load_weights`` on the receiving side is
not part of this figure (``nccl_sync_bench.py`` measures the full path with a vLLM engine).

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python3 benchmarks/gpu/nccl_transport_bench.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def named_weights(shape: str) -> list[tuple[str, torch.Tensor]]:
    """Random bf16 tensors with the parameter names and shapes of a Qwen3 checkpoint (tied embeddings)."""
    from shapes import SHAPES
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**SHAPES[shape], tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [
        (n, torch.randn(p.shape, generator=gen, device="cuda", dtype=torch.bfloat16))
        for n, p in model.named_parameters()
    ]


def worker(rank: int, shapes: list[str], reps: int, port: int, out: str) -> None:
    from molt_train.engines.weight_buckets import pack, plan_buckets, unpack

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    results = []
    for shape in shapes:
        named = named_weights(shape) if rank == 0 else None
        plan = dist_object(plan_meta(plan_buckets(named)) if rank == 0 else None)
        sums = dist_object([float(t.float().sum()) for _, t in named] if rank == 0 else None)
        for rep in range(reps + 1):  # rep 0 warms NCCL up and is not reported
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.barrier()
            t1 = time.perf_counter()
            received = []
            if rank == 0:
                for bucket in pack(named):
                    dist.broadcast(bucket.buffer, src=0)
            else:
                for metas, size in plan:
                    buffer = torch.empty(size, dtype=torch.uint8, device="cuda")
                    dist.broadcast(buffer, src=0)
                    received.extend(unpack(buffer, metas))
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if rank == 1:
                bad = [
                    n
                    for (n, t), s in zip(received, sums, strict=True)
                    if abs(float(t.float().sum()) - s) > 1e-3 * max(1, abs(s))
                ]
                nbytes = sum(t.numel() * t.element_size() for _, t in received)
                if rep:
                    results.append(
                        {
                            "shape": shape,
                            "rep": rep,
                            "lock_wait_s": t1 - t0,
                            "transfer_s": t2 - t1,
                            "bytes": nbytes,
                            "buckets": len(plan),
                            "GB_per_s": nbytes / (t2 - t1) / 1e9,
                            "mismatched_tensors": bad,
                        }
                    )
        del named
        torch.cuda.empty_cache()
    if rank == 1:
        Path(out).write_text(json.dumps(results, indent=1))
        for r in results:
            print(
                f"{r['shape']} rep {r['rep']}: {r['bytes'] / 1e9:.2f} GB in {r['buckets']} buckets, lock-wait "
                f"{r['lock_wait_s'] * 1e3:.1f} ms, pack+transfer {r['transfer_s'] * 1e3:.1f} ms "
                f"({r['GB_per_s']:.0f} GB/s), mismatched {len(r['mismatched_tensors'])}",
                flush=True,
            )
    dist.destroy_process_group()


def plan_meta(planned) -> list:
    return [([meta for meta, _ in bucket], bucket[-1][0].offset + bucket[-1][0].nbytes) for bucket in planned]


def dist_object(value):
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    out = os.path.join(os.environ.get("OUT", "/tmp"), "nccl_transport.json")
    mp.spawn(worker, args=(["0.6b", "1.7b"], 5, 29517, out), nprocs=2, join=True)
