"""``molt-train rl`` vs TRL's ``GRPOTrainer`` on this machine: same start checkpoint, task, batch and sampling.

    .venv/bin/python benchmarks/trainer_vs_trl.py [--steps 40] [--seeds 42 43 44 45 46] [--threads 2]

Both sides start from one SFT checkpoint of the ``molt demo`` recipe (a tiny Qwen2 trained from scratch on
``molt/arith-v1``; built once into ``--out``/sft and reused), take P prompts x G samples per optimizer step,
temperature 1.0, the same max new tokens and learning rate (constant), AdamW (0.9, 0.999), grad clip 1.0, group
advantages (reward - group mean) / group std, token-mean loss, no KL, one optimizer step per rollout batch
(strictly on-policy), the env's exact-match reward, and one decode batch for a step's rollouts (molt's
``--rollout.max_batch_size`` = P x G: TRL generates the whole batch at once).

The wall-clock budget: molt runs ``--steps`` optimizer steps; the seconds its training loop took (rollout, train,
weight sync, the final HF export; Ray start-up and worker spawn excluded, shown apart) are TRL's budget for
``train()``, stopped by a callback after the step that crosses it; TRL's seconds likewise include its final
``save_model`` (its model load and trainer construction excluded). Each side's steps/s and samples/s are its own
completed steps over its own loop time. Accuracy: held-out greedy exact match on the
``test`` split, judged by the same function (``trl_baseline.greedy_accuracy``) on each side's final weights.
CPU threads: ``--threads`` in total at any moment on both sides: TRL runs in one process with that many torch
threads; molt (``--train.force_sync_mode``) alternates its rollout worker and its trainer worker, each with that many
(with ``--async_queue N`` they overlap, N batches ahead, with half the threads each: molt's async mode, off-policy).
OpenMP threads sleep while they wait on both sides (``OMP_WAIT_POLICY=PASSIVE``, set before torch loads, inherited by
molt's Ray workers; ``molt-train demo`` sets the same): spinning ones cost nothing on idle cores, but when another
process shares them a spinning side runs several times slower (2026-12-04, TRL at load ~2: 0.15 steps/s spinning,
0.67 sleeping), so the comparison measured the machine's other load more than the trainers. An explicit
``OMP_WAIT_POLICY`` in the environment wins.
Each seed (``--seeds``) runs molt, then TRL with that molt run's seconds as its budget, both with that seed (a
single run's accuracy swings widely with the seed at this size); the table shows each seed and the means, and the
ratio of the mean samples/s.

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): the same path at tiny sizes in a temporary
directory (a 4-step SFT start, one seed, 2 molt steps of 4 prompts x 4 samples, TRL on that budget, 16 test rows):
both sides, the judge and the ratio lines in under a minute; figures meaningless.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # trl_baseline, when run as a script

ENV = "molt/arith-v1"
SFT_STEPS = 400  # the start checkpoint's SFT steps (~26% held-out on molt/arith-v1)


def build_init(out: Path, threads: int, sft_steps: int = SFT_STEPS) -> Path:
    """The shared starting checkpoint: a tiny Qwen2 from scratch with ``molt-train demo``'s SFT model and optimizer
    flags (``Recipe.sft_flags``: 128 wide, 2 layers, batch 64, lr 3e-3), ``sft_steps`` steps on ``molt/arith-v1``'s
    whole train split."""
    from molt_train import sft_cli
    from molt_train.demo import Recipe

    hf = out / "sft" / "hf"
    if not (hf / "config.json").exists():
        sft_cli.main(
            [
                "--env",
                ENV,
                "--train.seed",
                "42",
                "--ray.num_cpus",
                str(threads),
                "--no-logger.progress",
                "--eval.max_samples",
                "0",
                "--ckpt.output_dir",
                str(out / "sft"),
                "--train.num_steps",
                str(sft_steps),
            ]
            + list(Recipe().sft_flags)
        )
        _stop_ray()
    return hf


def run_molt(init: Path, args: argparse.Namespace, seed: int, out: Path, test_rows: list[dict]) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl_baseline import greedy_accuracy

    from molt_train.config import parse
    from molt_train.rl_trainer import RLTrainer

    shutil.rmtree(out, ignore_errors=True)  # metrics.jsonl appends: a rerun must not count the last run's steps
    t0 = time.perf_counter()
    batch = args.prompts_per_step * args.samples_per_prompt
    # sync: rollout and training take turns, each with every thread; async: they overlap, splitting the threads
    mode = ["--train.async_queue_size", str(args.async_queue)] if args.async_queue else ["--train.force_sync_mode"]
    threads = max(1, args.threads // 2) if args.async_queue else args.threads
    cfg = parse(
        "rl",
        [
            "--env",
            ENV,
            "--actor.model_name_or_path",
            str(init),
            "--ckpt.output_dir",
            str(out),
            "--ray.num_cpus",
            str(args.threads),
            "--actor.num_threads",
            str(threads),
            "--train.seed",
            str(seed),
            "--algo.advantage.estimator",
            "grpo",
            "--rollout.batch_size",
            str(args.prompts_per_step),
            "--rollout.n_samples_per_prompt",
            str(args.samples_per_prompt),
            "--rollout.temperature",
            "1.0",
            "--rollout.max_new_tokens",
            str(args.max_new_tokens),
            "--train.num_steps",
            str(args.steps),
            "--actor.adam.lr",
            str(args.lr),
            "--actor.adam.betas",
            "0.9",
            "0.999",
            *mode,
            # one decode batch and one forward/backward for the whole batch, as TRL does (the defaults decode in
            # batches of 256 rows and split training into 64-row micro-batches)
            "--rollout.max_batch_size",
            str(batch),
            "--train.micro_batch_size",
            str(batch),
            "--train.max_tokens_per_gpu",
            str(batch * 64),
            "--eval.max_samples",
            "0",
            "--no-logger.progress",
        ],
    )
    trainer = RLTrainer(cfg)
    setup = time.perf_counter() - t0
    try:
        t1 = time.perf_counter()
        trainer.run()
        seconds = time.perf_counter() - t1
    finally:
        trainer.shutdown()
        _stop_ray()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float32)
    accuracy = greedy_accuracy(model, AutoTokenizer.from_pretrained(out / "hf"), test_rows, args.max_new_tokens)
    samples = len(records) * args.prompts_per_step * args.samples_per_prompt
    return {
        "steps": len(records),
        "seconds": seconds,
        "setup_s": setup,
        "steps_per_s": len(records) / seconds,
        "samples_per_s": samples / seconds,
        "accuracy": accuracy,
        "reward_last5": statistics.mean(r["rollout/reward_mean"] for r in records[-5:]),
    }


def _stop_ray() -> None:
    """Idle Ray processes must not share the cores with the next side."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="molt optimizer steps (sets the wall budget)")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[42, 43, 44, 45, 46],
        help="one molt run and one TRL run per seed (molt first; its seconds are TRL's budget)",
    )
    parser.add_argument("--prompts_per_step", type=int, default=48)
    parser.add_argument("--samples_per_prompt", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=5)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads computing at any moment, each side")
    parser.add_argument(
        "--async_queue",
        type=int,
        default=0,
        help="molt: 0 = strictly on-policy (--train.force_sync_mode, like TRL); N = rollout overlaps "
        "training, N batches ahead (off-policy by up to N steps)",
    )
    parser.add_argument("--eval_rows", type=int, default=512, help="held-out test rows judged")
    parser.add_argument("--out", default="runs/trainer_vs_trl")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes in a temporary directory, seconds: the code path, not figures"
    )
    args = parser.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (above), for both sides
    if not args.smoke:
        return compare(args, SFT_STEPS)
    args.steps, args.seeds, args.prompts_per_step, args.samples_per_prompt, args.eval_rows = 2, args.seeds[:1], 4, 4, 16
    with tempfile.TemporaryDirectory(prefix="trainer-vs-trl-smoke-") as tmp:
        args.out = tmp  # never the real run's directory: its cached start checkpoint is reused by later runs
        return compare(args, sft_steps=4)


def compare(args: argparse.Namespace, sft_steps: int) -> int:
    import torch
    from trl_baseline import greedy_accuracy, run_trl

    import env_registry
    from molt_train.runtime import quiet

    quiet()
    torch.set_num_threads(args.threads)
    out = Path(args.out).resolve()
    start = time.perf_counter()
    init = build_init(out, args.threads, sft_steps)
    spec = env_registry.spec(ENV)
    train_rows = env_registry.load_split(spec, "train", None)
    test_rows = env_registry.load_split(spec, "test", args.eval_rows)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    init_acc = greedy_accuracy(
        AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32),
        AutoTokenizer.from_pretrained(init),
        test_rows,
        args.max_new_tokens,
    )
    print(f"start checkpoint {init}: held-out greedy accuracy {init_acc:.1%} on {len(test_rows)} test rows", flush=True)

    rows: list[tuple[str, dict[str, float]]] = []
    for seed in args.seeds:
        molt = run_molt(init, args, seed, out / f"molt-{seed}", test_rows)
        rows.append(("molt", molt))
        print(_line(f"seed {seed} molt", molt), flush=True)
        trl = run_trl(
            init,
            train_rows,
            test_rows,
            prompts_per_step=args.prompts_per_step,
            samples_per_prompt=args.samples_per_prompt,
            max_new_tokens=args.max_new_tokens,
            lr=args.lr,
            wall_s=molt["seconds"],
            out_dir=out / f"trl-{seed}",
            seed=seed,
            threads=args.threads,
        )
        rows.append(("trl", trl))
        print(_line(f"seed {seed} TRL ", trl), flush=True)

    mean = {
        side: {k: statistics.mean(m[k] for s, m in rows if s == side) for k in rows[0][1]} for side in ("molt", "trl")
    }
    print(
        f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, torch threads {args.threads}"
    )
    print(
        f"{ENV}: {args.prompts_per_step} prompts x {args.samples_per_prompt} samples/step, max_new_tokens "
        f"{args.max_new_tokens}, lr {args.lr}, temperature 1.0, no KL; molt {args.steps} steps/seed, "
        f"seeds {' '.join(map(str, args.seeds))}, molt {f'async queue {args.async_queue}' if args.async_queue else 'on-policy'}; start accuracy {init_acc:.1%}"
    )
    print(f"{'mean':<8}{'steps':>7}{'loop s':>8}{'setup s':>9}{'steps/s':>9}{'samples/s':>11}{'accuracy':>10}")
    for side in ("molt", "trl"):
        m = mean[side]
        print(
            f"{side:<8}{m['steps']:>7.1f}{m['seconds']:>8.1f}{m['setup_s']:>9.1f}{m['steps_per_s']:>9.3f}"
            f"{m['samples_per_s']:>11.1f}{m['accuracy']:>10.1%}"
        )
    ratios = [a["samples_per_s"] / b["samples_per_s"] for (_, a), (_, b) in zip(rows[::2], rows[1::2], strict=True)]
    ratio = mean["molt"]["samples_per_s"] / mean["trl"]["samples_per_s"]
    gaps = [100 * (a["accuracy"] - b["accuracy"]) for (_, a), (_, b) in zip(rows[::2], rows[1::2], strict=True)]
    print(
        f"ratio of mean samples/s molt/TRL: {ratio:.2f}x (per seed: {', '.join(f'{x:.2f}' for x in ratios)}); "
        f"mean accuracy molt - TRL: {100 * (mean['molt']['accuracy'] - mean['trl']['accuracy']):+.1f} points "
        f"(per seed: {', '.join(f'{x:+.1f}' for x in gaps)})"
    )
    target = ratio >= 2.0 and mean["molt"]["accuracy"] >= mean["trl"]["accuracy"]
    print(
        f"target (>= 2x samples/s at equal or better mean accuracy): {'met' if target else 'NOT met'}; "
        f"total wall {time.perf_counter() - start:.0f}s"
    )
    return 0


def _line(name: str, m: dict[str, float]) -> str:
    return (
        f"{name}: {m['steps']:.0f} steps in {m['seconds']:.1f}s (+{m['setup_s']:.1f}s setup), "
        f"{m['steps_per_s']:.3f} steps/s, {m['samples_per_s']:.1f} samples/s, accuracy {m['accuracy']:.1%}, "
        f"train reward (last 5 steps) {m['reward_last5']:.2f}, 1-min load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
