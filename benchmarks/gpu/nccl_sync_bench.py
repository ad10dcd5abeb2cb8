"""Weight sync over NCCL between two GPUs: trainer rank 0 on GPU 0 broadcasts packed buckets to vLLM on GPU 1.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python3 benchmarks/gpu/nccl_sync_bench.py --model DIR

This process runs the vLLM engine on GPU 1; it starts the trainer as a child process on GPU 0 (``--role trainer``),
which holds the bf16 weights, plans the buckets (``NcclWeightSender.plan``) and broadcasts them when told
(``send``: one NCCL call per bucket). The engine side takes each bucket with one RPC into its worker
(``VLLMEngine.receive_broadcast``) and times ``wait_s`` (getting the engine to a safe point: pausing when requests
are in flight) against ``copy_s`` (broadcast + ``load_weights``). Reps run idle and with 256 requests in flight
(partial rollout: those requests pause, continue on the new weights, and must finish). After the reps
``check_weight_update_equal`` (over NCCL) names any vLLM parameter that differs from the trainer's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_prompts, record  # noqa: E402


def trainer(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from molt_train.engines.vllm import NcclWeightSender, broadcast_plan

    torch.cuda.set_device(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda()
    named = [(n, p.detach()) for n, p in model.named_parameters()]
    with open(args.plan_file, "wb") as fh:
        pickle.dump(broadcast_plan(named, args.bucket_mb << 20), fh)
    print("READY", flush=True)
    sender = NcclWeightSender("127.0.0.1", args.port, world_size=2, bucket_bytes=args.bucket_mb << 20)
    print("JOINED", flush=True)
    for line in sys.stdin:
        if line.strip() not in ("SEND", "CHECK"):
            break
        if line.strip() == "SEND":  # a training step changes the weights between syncs
            with torch.no_grad():
                for _, p in named[:4]:
                    p.add_(1e-2)
        torch.cuda.synchronize()
        start = time.perf_counter()
        sent = sender.send(named)
        print(f"SENT {time.perf_counter() - start:.6f} {sent}", flush=True)


async def engine_side(args: argparse.Namespace) -> None:
    from transformers import AutoConfig

    from molt_envs import SamplingParams
    from molt_train.config import VLLMConfig
    from molt_train.engines.vllm import VLLMEngine

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plan_file = tempfile.mktemp(suffix=".plan")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=args.trainer_gpu)
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role",
            "trainer",
            "--model",
            args.model,
            "--port",
            str(port),
            "--plan-file",
            plan_file,
            "--bucket-mb",
            str(args.bucket_mb),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )

    def expect(word: str) -> str:
        while True:  # skip what the trainer's libraries log to stdout
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(f"the trainer exited before saying {word}")
            if line.startswith(word):
                return line

    engine = VLLMEngine(
        args.model,
        VLLMConfig(
            gpu_memory_utilization=0.5,
            enforce_eager=True,
            max_model_len=1024,
            max_num_seqs=256,
            bucket_mb=args.bucket_mb,
        ),
    )
    await asyncio.to_thread(expect, "READY")
    plan = pickle.loads(Path(plan_file).read_bytes())
    await asyncio.gather(engine.init_weight_group("127.0.0.1", port, 2), asyncio.to_thread(expect, "JOINED"))
    vocab = AutoConfig.from_pretrained(args.model).vocab_size

    async def sync() -> dict:
        child.stdin.write("SEND\n")
        child.stdin.flush()
        start = time.perf_counter()
        moved, line = await asyncio.gather(engine.receive_broadcast(plan), asyncio.to_thread(expect, "SENT"))
        total = time.perf_counter() - start
        return {
            "total_s": total,
            "trainer_send_s": float(line.split()[1]),
            "bytes": moved,
            "buckets": len(plan),
            **engine.last_sync,
        }

    idle = [await sync() for _ in range(args.reps)]
    busy = []
    for rep in range(2):  # partial rollout: sync while 256 requests decode
        prompts = random_prompts(256, 64, vocab, seed=rep)
        tasks = [
            asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=200, stop_token_ids=[], seed=i)))
            for i, p in enumerate(prompts)
        ]
        await asyncio.sleep(1.0)
        busy.append(await sync())
        gens = await asyncio.gather(*tasks)
        busy[-1]["straddled"] = sum(g.extra["weight_versions"][0] != g.extra["weight_versions"][1] for g in gens)
        busy[-1]["finished_tokens"] = sum(len(g.token_ids) for g in gens)
    child.stdin.write("CHECK\n")
    child.stdin.flush()
    stale, _ = await asyncio.gather(engine.check_weight_update_equal(plan=plan), asyncio.to_thread(expect, "SENT"))
    child.stdin.write("STOP\n")
    child.stdin.flush()
    child.wait(timeout=60)
    result = {
        "model": args.model,
        "idle": idle,
        "in_flight": busy,
        "stale_after_sync": stale,
        "nccl_env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
    }
    record(f"nccl_sync_{args.tag}", result)
    for r in idle + busy:
        print(
            f"{args.tag}: total {r['total_s']:.4f}s  wait {r['wait_s']:.4f}  copy {r['copy_s']:.4f}  "
            f"trainer send {r['trainer_send_s']:.4f}  {r['bytes'] / 2**30:.2f} GiB in {r['buckets']} buckets"
            f"  paused={r['paused']:.0f} straddled={r.get('straddled', '-')}",
            flush=True,
        )
    print(f"{args.tag}: stale after sync: {stale}", flush=True)
    engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["engine", "trainer"], default="engine")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tag", default="0.6b")
    parser.add_argument("--port", type=int)
    parser.add_argument("--plan-file")
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--trainer-gpu", default="0")
    args = parser.parse_args()
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
        if os.environ.get(key) not in ("0", "1"):
            raise SystemExit(
                f"set NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLink multicast off), "
                f"got {key}={os.environ.get(key)!r}"
            )
    if args.role == "trainer":
        trainer(args)
    else:
        asyncio.run(engine_side(args))


if __name__ == "__main__":
    main()
