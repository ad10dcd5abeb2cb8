"""Issue 8: the disaggregated async run against the colocated sync run on the same two GPUs, through the CLI.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python3 benchmarks/gpu/placement_bench.py --model DIR

Both runs are ``molt-train rl --env molt/gsm8k-v1 --rollout.engine vllm`` for ``--steps`` steps on the same model
and batch; only the placement differs:

- colocated sync: ``--train.colocate_all --train.force_sync_mode``: trainer and vLLM share GPU 0 (CUDA IPC sync);
  the second GPU stays idle (the one-GPU path has one trainer rank).
- disaggregated async: ``--vllm.num_engines 1 --actor.num_gpus_per_node 1 --train.async_queue_size 2`` (with token
  IS correction, which async needs): the trainer on one GPU, vLLM on the other, NCCL broadcast sync; rollout of
  step k+1 overlaps training of step k.

From each run's ``metrics.jsonl``: wall-clock of the steps (first rollout start to last step's end), and each side's
idle fraction over that window: rollout busy = its batches' generation intervals; trainer busy = training
(experience, log-probs, optimizer) plus the weight sync. A random model's prompts render to unknown words, so the
rewards are 0: this measures speed, not learning.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import record  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RUNS = {
    "colocated_sync": ["--train.colocate_all", "--train.force_sync_mode", "--vllm.gpu_memory_utilization", "0.35"],
    "disaggregated_async": [
        "--vllm.num_engines",
        "1",
        "--actor.num_gpus_per_node",
        "1",
        "--train.async_queue_size",
        "2",
        "--algo.advantage.is_correction_level",
        "token",
        "--algo.advantage.is_correction_mode",
        "trunc",
        "--vllm.gpu_memory_utilization",
        "0.8",
    ],
}


def busy_fractions(records: list[dict[str, float]]) -> dict[str, float]:
    start = min(r["timing/rollout_start"] for r in records)
    end = max(
        r["timing/train_end"] + r["timing/weight_sync_wait_engine_s"] + r["timing/weight_sync_move_s"] for r in records
    )
    wall = end - start
    rollout = sum(r["timing/rollout_end"] - r["timing/rollout_start"] for r in records)
    trainer = sum(r["timing/train_end"] - r["timing/train_start"] + r["timing/weight_sync_move_s"] for r in records)
    return {
        "wall_s": wall,
        "rollout_idle": 1 - rollout / wall,
        "trainer_idle": 1 - trainer / wall,
        "step_s_median": sorted(r["timing/step"] for r in records)[len(records) // 2],
        "sync_move_s_median": sorted(r["timing/weight_sync_move_s"] for r in records)[len(records) // 2],
        "sync_wait_s_median": sorted(r["timing/weight_sync_wait_engine_s"] for r in records)[len(records) // 2],
    }


def run(name: str, args: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"placement_{name}_"))
    cmd = [
        sys.executable,
        "-m",
        "molt_train.cli",
        "rl",
        "--env",
        "molt/gsm8k-v1",
        "--actor.model_name_or_path",
        args.model,
        "--rollout.engine",
        "vllm",
        "--rollout.batch_size",
        str(args.prompts),
        "--rollout.n_samples_per_prompt",
        "8",
        "--algo.advantage.estimator",
        "grpo",
        "--rollout.max_new_tokens",
        str(args.new_tokens),
        "--data.max_len",
        "1024",
        "--train.num_steps",
        str(args.steps),
        "--eval.max_samples",
        "0",
        "--train.micro_batch_size",
        "32",
        "--train.max_tokens_per_gpu",
        "32768",
        "--actor.adam.lr",
        "1e-6",
        "--ray.num_cpus",
        "8",
        "--ckpt.output_dir",
        str(out),
        "--no-logger.progress",
        *RUNS[name],
    ]
    if args.eager:
        cmd.append("--vllm.enforce_eager")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, start_new_session=True)
    process_s = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-6000:], sep="\n", flush=True)
        raise SystemExit(f"{name}: molt-train rl exited {done.returncode}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    result = {
        "run": name,
        "steps": len(records),
        "process_s": process_s,
        **busy_fractions(records),
        "flags": RUNS[name],
    }
    print(
        f"{name}: {len(records)} steps in {result['wall_s']:.1f} s (process {process_s:.0f} s), median step "
        f"{result['step_s_median']:.2f} s, rollout idle {result['rollout_idle']:.1%}, trainer idle "
        f"{result['trainer_idle']:.1%}, sync move {result['sync_move_s_median']:.3f} s",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (faster start)")
    parser.add_argument("--only", choices=sorted(RUNS), default=None)
    args = parser.parse_args()
    results = [run(name, args) for name in RUNS if args.only in (None, name)]
    summary = {r["run"]: r for r in results}
    if len(summary) == 2:
        summary["speedup_disaggregated_async"] = (
            summary["colocated_sync"]["wall_s"] / summary["disaggregated_async"]["wall_s"]
        )
        print(
            f"disaggregated async is {summary['speedup_disaggregated_async']:.2f}x the colocated sync run", flush=True
        )
    record(
        "placement",
        {**summary, "steps": args.steps, "prompts": args.prompts, "new_tokens": args.new_tokens, "eager": args.eager},
    )


if __name__ == "__main__":
    main()
