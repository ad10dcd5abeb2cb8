"""Vision vs text on one GPU: the same Qwen2.5-VL-shaped model, the same `molt/shapes-v1` rows, colocated GRPO steps
through ``molt-train rl`` (vLLM rollout, FSDP2 training, CUDA-IPC weight sync checked every step), once with each
row's image and once text-only.

    python3 benchmarks/gpu/vision_rl_bench.py --model /tmp/models/vl3b [--shape vl-3b] [--image-size 448]
        [--steps 4] [--prompts 32] [--samples 8] [--new-tokens 256] [--modes vision text] [--eager]

The rows go to ``--data.prompt_dataset`` as JSONL (the image a base64 PNG, resized to ``--image-size`` square:
448 px = 256 image tokens per prompt for Qwen2.5-VL) and the vision run adds ``--data.image_key image``; the text run
reads the same questions without it, so the two differ only by the images. Random weights: every response runs to
``--new-tokens``; rewards are the env's grader (near 0), so this measures speed, not learning.
Per mode (steps after the first, which compiles): rollout tok/s (generated tokens / rollout time), step time, the
weight sync, the trainer's log-prob mismatch with vLLM, and the prompt length. ``RESULT`` lines go to
``$OUT/results.jsonl``. The model is made first when ``--model`` does not hold one yet (``shapes.py``'s ``--shape``,
a random bf16 Qwen2.5-VL of the 3B shape by default, ~1 min). Training uses gradient checkpointing (fp32 master
weights and Adam state of 3.8B parameters share the GPU with vLLM).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import make_vl_model, record  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def write_rows(path: Path, n: int, size: int) -> Path:
    from molt_envs.envs.shapes import generate_split

    with path.open("w") as f:
        for row in generate_split("train", n):
            buffer = io.BytesIO()
            row["image"].resize((size, size)).save(buffer, format="PNG")
            data = base64.b64encode(buffer.getvalue()).decode()
            f.write(json.dumps({"question": row["question"], "answer": row["answer"], "image": data}) + "\n")
    return path


def run(args: argparse.Namespace, mode: str, rows: Path, out: Path) -> list[dict]:
    cmd = [
        sys.executable, "-m", "molt_train.cli", "rl", "--env", "molt/shapes-v1", "--data.prompt_dataset", str(rows),
        "--data.input_key", "question", "--data.label_key", "answer", "--actor.model_name_or_path", args.model,
        "--rollout.engine", "vllm", "--train.colocate_all", "--vllm.gpu_memory_utilization", "0.25", "--vllm.enable_sleep",
        "--train.force_sync_mode", "--train.check_weight_update_equal", "--algo.advantage.estimator", "grpo",
        "--rollout.batch_size", str(args.prompts), "--rollout.n_samples_per_prompt", str(args.samples),
        "--rollout.max_new_tokens", str(args.new_tokens), "--rollout.top_k", "-1", "--data.max_len", "2048",
        "--train.num_steps", str(args.steps), "--eval.max_samples", "0", "--actor.adam.lr", "1e-6",
        "--train.micro_batch_size", "32", "--train.max_tokens_per_gpu", "16384", "--actor.gradient_checkpoint",
        "--ray.num_cpus", "8",
        "--ckpt.output_dir", str(out), "--no-logger.progress",
    ]  # fmt: skip
    if mode == "vision":
        cmd += ["--data.image_key", "image"]
    if args.eager:
        cmd += ["--vllm.enforce_eager"]
    shutil.rmtree(out, ignore_errors=True)  # a fresh run: no earlier metrics or checkpoints
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.time()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=args.timeout)
    except subprocess.TimeoutExpired as late:  # its output says where the time went
        raise SystemExit(
            f"{mode} run passed its {args.timeout}s timeout:\n{str(late.stdout or '')[-3000:]}\n"
            f"{str(late.stderr or '')[-6000:]}"
        ) from None
    if done.returncode != 0:
        raise SystemExit(
            f"{mode} run failed ({time.time() - start:.0f}s):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        )
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary(records: list[dict]) -> dict[str, float]:
    """The figures of the steps after the first (which compiles vLLM's graphs and warms the trainer); of the first
    step alone when it is the only one."""
    timed = records[1:] or records
    counts = [0.0] + [r["engine/generated_tokens"] for r in records]  # the engine's running total
    generated = [b - a for a, b in zip(counts, counts[1:], strict=False)][len(records) - len(timed) :]
    tok_s = [g / r["timing/rollout_s"] for g, r in zip(generated, timed, strict=True)]
    median = statistics.median
    return {
        "rollout_tok_s": median(tok_s),
        "rollout_s": median(r["timing/rollout_s"] for r in timed),
        "step_s": median(r["timing/step"] for r in timed),
        "sync_s": median(r["timing/weight_sync_wait_engine_s"] + r["timing/weight_sync_move_s"] for r in timed),
        "checked_params": records[-1]["weight_sync/checked_params"],
        "k3_kl": max(r["mismatch/k3_kl"] for r in records),
        "dropped": sum(r["rollout/dropped_total"] for r in records),
        "response_length": median(r["rollout/response_length"] for r in timed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory (made there when absent)")
    parser.add_argument("--shape", default="vl-3b", choices=["vl-3b", "vl-tiny"], help="the model made if absent")
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--modes", nargs="+", default=["vision", "text"], choices=["vision", "text"])
    parser.add_argument("--work", default="/tmp/vision_bench")
    parser.add_argument("--timeout", type=int, default=540)
    parser.add_argument(
        "--eager",
        action="store_true",
        help="vLLM without CUDA graphs or torch.compile (a faster start, slower decoding)",
    )
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    make_vl_model(args.model, args.shape)  # kept if already there
    rows = write_rows(work / "rows.jsonl", args.prompts * args.steps, args.image_size)
    results = {}
    for mode in args.modes:
        results[mode] = summary(run(args, mode, rows, work / mode))
        record(f"vision_rl/{mode}", {"image_size": args.image_size, **vars(args), **results[mode]})
        print(mode, json.dumps(results[mode]), flush=True)
    if len(results) == 2:
        v, t = results["vision"], results["text"]
        print(
            f"vision / text: rollout tok/s {v['rollout_tok_s'] / t['rollout_tok_s']:.2f}x, step time "
            f"{v['step_s'] / t['step_s']:.2f}x (image {args.image_size}px, {args.prompts}x{args.samples} samples, "
            f"{args.new_tokens} new tokens)",
            flush=True,
        )


if __name__ == "__main__":
    main()
