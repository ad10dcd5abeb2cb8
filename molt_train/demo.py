"""``molt-train demo`` (what ``make demo`` runs): what RL is for, on a CPU in a few minutes.

The situation RL exists for: **few demonstrations, many verifiable prompts**. A model trained from scratch sees 64
worked examples of ``molt/sort-v1`` (sort 3-6 digits); RL then sees the env's 20,000 training prompts with no
answers, only the env's grader (partial credit per position). Three held-out figures come out, all exact match on
the test split (no test task is in the train split), greedy:

1. **SFT start**: SFT on the demonstrations, stopped early (it writes the format, and sorts some lists);
2. **SFT baseline**: the same SFT run trained on, to convergence and beyond (at least the optimizer steps and the
   training time of SFT start + RL together); its best checkpoint counts;
3. **RL**: GRPO from the SFT start checkpoint.

Nothing is downloaded: the tokenizer is trained on the env's prompts in a second and the model starts random. Every
step goes through the real stack: registry -> runner -> hf engine -> Ray -> FSDP2 worker -> weight sync. Figures do
not depend on the machine or its load: thread counts and the CPU instruction set are pinned (see
``molt_train/README.md``) and rollout is strictly on-policy; times do.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Float results on a CPU depend on the thread count and the instruction set the kernels use; pinned, two Intel
# machines compute the same (MKL's conditional numerical reproducibility, whose AVX2 branch MKL honours on Intel CPUs
# only: an AMD one computes other digits; torch's and oneDNN's vector ISA at AVX2, which every x86 server of the last
# decade has). MKL's vendor-neutral COMPATIBLE branch costs ~40% of the demo's time. Set before torch is first
# imported, inherited by the Ray workers.
REPRODUCIBLE_ENV = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# Speed, not figures: OpenMP threads that spin while they wait make every step ~8x slower when other processes
# share the cores (measured on 2 loaded cores: 4.9 s vs 0.6 s a step); sleeping instead costs nothing measurable.
CPU_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# The eval key the demo reports: pass@1, the share of test rows whose one (greedy) sample reached the top of the
# reward range. molt/sort-v1's reward is 1.0 exactly when the answer equals the target, so this is exact-match
# accuracy, a failed sample counted as a miss. (`accuracy` is the mean reward: partial credit for this env.)
# The GPU recipe reports `accuracy` instead: its env's partial-credit score, where exact matches stay rare.
METRICS = {"pass@1": "exact match, pass@1", "accuracy": "mean score, the env's partial credit"}


@dataclass(frozen=True)
class Recipe:
    """The demo's sizes and flags (measured choices; docs/demo.md has the study behind them)."""

    env: str = "molt/sort-v1"
    demos: int = 64  # the first N rows of the train split, with their reference answers
    sft_start: int = 50  # SFT steps before RL takes over
    sft_steps: int = 500  # the baseline: the same SFT run, trained on (more seconds than SFT start + RL)
    eval_every: int = 50  # SFT checkpoints evaluated every N steps
    rl_steps: int = 60
    rl_eval_every: int = 20
    threads: int = 2  # torch threads in every process that computes
    max_new_tokens: int = 7  # 6 digits and the end token
    metric: str = "pass@1"  # the eval key the demo reports (METRICS)
    sft_flags: tuple[str, ...] = (
        "--model.config", "tiny", "--model.hidden_size", "128", "--model.num_layers", "2",
        "--train.batch_size", "64", "--actor.adam.lr", "3e-3",
    )  # fmt: skip
    rl_flags: tuple[str, ...] = (
        "--algo.advantage.estimator", "grpo", "--rollout.n_samples_per_prompt", "8", "--rollout.batch_size", "48",
        "--rollout.temperature", "1.0", "--actor.adam.lr", "1e-3", "--actor.lr_warmup_ratio", "0.1",
        "--actor.lr_scheduler", "cosine", "--train.batch_size", "192", "--train.force_sync_mode",
        "--train.micro_batch_size", "384", "--train.max_tokens_per_gpu", "16384", "--rollout.max_batch_size", "384",
    )  # fmt: skip
    ray_cpus: int = 2  # CPUs of the local Ray instance
    max_len: int | None = None  # --data.max_len of every command (prompt + answer), None: the trainer's default
    eval_rows: int | None = None  # held-out rows each evaluation scores (the first N), None: the whole test split


# ``molt-train demo --gpu``: the same lesson through the GPU stack on one H200 (vLLM rollout colocated with an FSDP2
# bf16 rank, CUDA-IPC weight sync, Ray), a 25M-parameter model from scratch with a character-level tokenizer and a
# harder task, ``molt/sort-long-v1`` (6-12 digits, where exact match needs every one of up to 12 positions right).
# Five reasoning-gym recipes taught nothing measurable in 10 minutes (docs/demo.md, "On a GPU", has them and this
# one's figures). SFT steps are cheap next to RL steps here, so the baseline gets 1,800 of them.
GPU_RECIPE = Recipe(
    env="molt/sort-long-v1",
    demos=256,
    sft_start=100,
    sft_steps=1800,  # the baseline: more training seconds than SFT start + RL (181 vs 103 s on an H200)
    eval_every=200,
    rl_steps=60,
    rl_eval_every=10,
    threads=8,
    max_new_tokens=13,  # 12 digits and the end token
    metric="accuracy",  # the mean score (partial credit): exact match on up to 12 digits stays rare in 10 minutes
    sft_flags=(
        "--model.config", "tiny", "--model.hidden_size", "512", "--model.num_layers", "8", "--model.num_heads", "8",
        "--model.vocab_size", "256", "--train.batch_size", "64", "--actor.adam.lr", "1e-3",
    ),
    rl_flags=(
        "--rollout.engine", "vllm", "--train.colocate_all", "--vllm.gpu_memory_utilization", "0.2", "--vllm.enforce_eager",
        "--algo.advantage.estimator", "grpo", "--rollout.n_samples_per_prompt", "8",
        "--rollout.batch_size", "64", "--rollout.temperature", "1.0", "--actor.adam.lr", "5e-4",
        "--actor.lr_warmup_ratio", "0.1", "--actor.lr_scheduler", "cosine", "--train.batch_size", "256",
        "--train.force_sync_mode", "--train.micro_batch_size", "512", "--train.max_tokens_per_gpu", "65536",
    ),
    ray_cpus=16,
    max_len=128,
)  # fmt: skip


# The vision measurement of molt_train/README.md ("Learning on molt/shapes-v1"): a `tiny-vl` from scratch (its 64 px
# picture cut into 16 patches, one per grid cell of the env's canvas) SFT'd to convergence on 256 demonstrations,
# then GRPO on the env's 4,000 prompts from that last checkpoint. `run(SHAPES_RECIPE, Path("runs/shapes"), 42)`
# repeats it (the README has the figures and the time).
SHAPES_RECIPE = Recipe(
    env="molt/shapes-v1",
    demos=256,
    sft_start=900,
    sft_steps=900,
    eval_every=150,
    rl_steps=60,
    rl_eval_every=20,
    threads=1,
    max_new_tokens=6,
    sft_flags=(
        "--model.config", "tiny-vl", "--model.hidden_size", "64", "--model.vocab_size", "320",
        "--model.image_size", "64", "--model.patch_size", "16", "--train.batch_size", "32", "--actor.adam.lr", "3e-4",
    ),
    rl_flags=(
        "--algo.advantage.estimator", "grpo", "--rollout.n_samples_per_prompt", "8", "--rollout.batch_size", "64",
        "--rollout.temperature", "1.0", "--actor.adam.lr", "1e-4", "--actor.lr_warmup_ratio", "0.1",
        "--actor.lr_scheduler", "cosine", "--train.batch_size", "512", "--train.force_sync_mode",
        "--train.micro_batch_size", "512", "--train.max_tokens_per_gpu", "16384", "--rollout.max_batch_size", "512",
    ),
    ray_cpus=2,
    max_len=128,
    eval_rows=200,
)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="molt-train demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default="runs/demo")
    parser.add_argument("--seed", type=int, default=42, help="seed of the model's init, data order and sampling")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the GPU recipe: vLLM rollout + FSDP2 bf16 on one GPU, a 25M-parameter model, molt/sort-long-v1",
    )
    args = parser.parse_args(argv)
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            parser.error("--gpu needs a CUDA GPU (and vLLM: pip install -e '.[gpu]'); without one run the CPU demo")
    recipe = GPU_RECIPE if args.gpu else Recipe()
    result = run(recipe, Path(args.output_dir), args.seed, args.progress)
    print_summary(result)
    return 0


def run(recipe: Recipe, out: Path, seed: int, progress: bool = True) -> dict[str, Any]:
    """SFT (the baseline, with the start checkpoint inside it), evaluation of its checkpoints, RL from the start.

    Returns:
        The figures: held-out curves, the three accuracies, step counts and training times, the report's path.
    """
    os.environ.update(REPRODUCIBLE_ENV | CPU_ENV)
    import torch

    from molt_train import rl_cli, sft_cli
    from molt_train.metrics import read_metrics

    torch.set_num_threads(recipe.threads)  # evaluation runs in this process
    start = time.perf_counter()
    start_ray(recipe.ray_cpus)
    tokens = str(recipe.max_new_tokens)
    length = [] if recipe.max_len is None else ["--data.max_len", str(recipe.max_len)]
    eval_flags = ["--env", recipe.env, "--rollout.max_new_tokens", tokens, "--eval.max_new_tokens", tokens, *length]
    eval_flags += [] if recipe.eval_rows is None else ["--eval.max_samples", str(recipe.eval_rows)]
    run_flags = [
        "--train.seed", str(seed), "--ray.num_cpus", str(recipe.ray_cpus), "--actor.num_threads", str(recipe.threads),
    ] + ([] if progress else ["--no-logger.progress"])  # fmt: skip
    common = eval_flags + run_flags
    sft_dir, rl_dir = out / "sft", out / "rl"
    print(
        f"[demo] 1/3 SFT from scratch on {recipe.demos} demonstrations of {recipe.env}, {recipe.sft_steps} steps "
        f"(RL starts from step {recipe.sft_start}) -> {sft_dir}",
        flush=True,
    )
    sft_cli.main(  # no final eval (the checkpoints are evaluated below), so none of the eval's flags
        ["--env", recipe.env, *length, *run_flags]
        + list(recipe.sft_flags)
        + ["--data.max_samples", str(recipe.demos), "--train.num_steps", str(recipe.sft_steps)]
        + ["--ckpt.output_dir", str(sft_dir), "--ckpt.save_steps", str(save_every(recipe)), "--ckpt.max_num", "1000"]
        + ["--eval.max_samples", "0"]
    )
    sft_step_s = [r["timing/step"] for r in read_metrics(sft_dir)]
    print(f"[demo] 2/3 held-out accuracy of the SFT checkpoints (every {recipe.eval_every} steps)", flush=True)
    sft_curve, sft_scores = [], []
    for step in eval_steps(recipe):
        scores = evaluate(eval_flags, checkpoint_model(sft_dir, step, recipe.sft_steps))
        sft_curve.append((step, scores[recipe.metric], sum(sft_step_s[:step])))
        print(f"[demo]   SFT step {step}: {scores[recipe.metric]:.1%}", flush=True)
        sft_scores.append((step, {key: scores[key] for key in METRICS}))
    start_model = checkpoint_model(sft_dir, recipe.sft_start, recipe.sft_steps)
    for checkpoint in (sft_dir / "checkpoints").glob("step_*"):  # evaluated; only the start's model is used again
        if checkpoint != start_model.parent:
            shutil.rmtree(checkpoint)
    print(
        f"[demo] 3/3 RL (GRPO, {recipe.rl_steps} steps, the env's reward) from SFT step {recipe.sft_start} -> {rl_dir}",
        flush=True,
    )
    rl_cli.main(
        common
        + list(recipe.rl_flags)
        + ["--train.num_steps", str(recipe.rl_steps), "--eval.steps", str(recipe.rl_eval_every)]
        + ["--actor.model_name_or_path", str(start_model), "--ckpt.output_dir", str(rl_dir)]
    )
    records = read_metrics(rl_dir)
    rl_time, rl_scores = 0.0, []
    rl_curve = [(0, dict((s, a) for s, a, _ in sft_curve)[recipe.sft_start], 0.0)]
    for r in records:
        rl_time += r.get("timing/step", 0.0)
        if f"eval/{recipe.metric}" in r:
            rl_curve.append((int(r["step"]), r[f"eval/{recipe.metric}"], rl_time))
            rl_scores.append((int(r["step"]), {key: r[f"eval/{key}"] for key in METRICS}))
    start_acc, start_time = next((a, t) for s, a, t in sft_curve if s == recipe.sft_start)
    best_step, best_acc, _ = max(sft_curve, key=lambda p: (p[1], -p[0]))
    result = {
        "env": recipe.env,
        "seed": seed,
        "metric": recipe.metric,
        "demos": recipe.demos,
        "train_prompts": split_rows(recipe.env, "train"),
        "test_rows": min(split_rows(recipe.env, "test"), recipe.eval_rows or math.inf),
        "sft_start": {"step": recipe.sft_start, "accuracy": start_acc, "train_s": start_time},
        "baseline": {
            "steps": recipe.sft_steps,
            "accuracy": best_acc,
            "best_step": best_step,
            "final_accuracy": sft_curve[-1][1],
            "train_s": sum(sft_step_s),
        },
        "rl": {"steps": recipe.rl_steps, "accuracy": rl_curve[-1][1], "train_s": rl_time},
        "sft_curve": sft_curve,
        "rl_curve": rl_curve,
        "scores": {"sft": sft_scores, "rl": rl_scores},  # every METRICS key at every evaluation
        "rewards": [(int(r["step"]), r["rollout/reward_mean"]) for r in records if "rollout/reward_mean" in r],
        "wall_s": time.perf_counter() - start,
    }
    result["report"] = str(write_report(result, out / "report.png"))
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def start_ray(num_cpus: int, attempts: int = 3) -> None:
    """The local Ray instance SFT and RL share (unless one runs already).

    Ray gives its raylet a fixed 30 s to register when it starts a local instance; on a machine whose cores are
    shared with other busy processes it can miss that, so the start is tried ``attempts`` times.

    Raises:
        RuntimeError: when every attempt failed, with Ray's last error.
    """
    import ray

    from molt_train.runtime import QUIET, quiet

    quiet()
    for attempt in range(1, attempts + 1):
        if ray.is_initialized():
            return
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env={"env_vars": QUIET})
        except Exception as exc:  # Ray raises a bare Exception for the raylet's timeout
            ray.shutdown()
            if attempt == attempts:
                raise RuntimeError(f"could not start a local Ray instance in {attempts} attempts: {exc}") from exc
            print(f"[demo] Ray did not start ({exc}); trying again", flush=True)


def kill_descendants() -> None:
    """SIGKILL every process this one started, children first found through ``/proc`` (Linux)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - mine
        mine |= frontier
    for pid in mine:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def eval_steps(recipe: Recipe) -> list[int]:
    """The SFT steps evaluated: every ``eval_every``, the start and the last."""
    every = range(recipe.eval_every, recipe.sft_steps + 1, recipe.eval_every)
    return sorted({*every, recipe.sft_start, recipe.sft_steps})


def save_every(recipe: Recipe) -> int:
    """A checkpoint interval that lands on every evaluated step."""
    return math.gcd(*eval_steps(recipe))


def checkpoint_model(sft_dir: Path, step: int, last: int) -> Path:
    return sft_dir / "hf" if step == last else sft_dir / "checkpoints" / f"step_{step}" / "hf"


def evaluate(flags: list[str], model: Path) -> dict[str, float]:
    """``molt-train eval``'s figures for ``model`` on the held-out split (greedy): pass@1, accuracy, ..."""
    from molt_train import eval_cli

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        eval_cli.main(flags + ["--actor.model_name_or_path", str(model)])
    return json.loads(printed.getvalue().strip().splitlines()[-1])


def split_rows(env_id: str, split: str) -> int:
    import env_registry

    return env_registry.count_rows(env_registry.spec(env_id), split)


def write_report(result: dict[str, Any], path: Path) -> Path:
    """``report.png``: held-out accuracy of SFT start, SFT baseline and RL against training time, and RL's
    training reward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    s, rl = result["sft_curve"], result["rl_curve"]
    offset = result["sft_start"]["train_s"]
    left.plot([t for *_, t in s], [100 * a for _, a, _ in s], "o-", label=f"SFT on {result['demos']} demos (baseline)")
    left.plot([offset + t for *_, t in rl], [100 * a for _, a, _ in rl], "o-", label="RL from the SFT start")
    left.plot([offset], [100 * result["sft_start"]["accuracy"]], "k*", markersize=14, label="SFT start")
    left.set_xlabel("training time (s)")
    left.set_ylabel(f"held-out {METRICS[result.get('metric', 'pass@1')]} (%)")
    left.set_title(f"{result['env']}, seed {result['seed']}")
    left.grid(alpha=0.3)
    left.legend()
    right.plot([st for st, _ in result["rewards"]], [r for _, r in result["rewards"]])
    right.set_xlabel("RL step")
    right.set_title("RL training reward (partial credit)")
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_summary(result: dict[str, Any]) -> None:
    start, base, rl = result["sft_start"], result["baseline"], result["rl"]
    both = start["train_s"] + rl["train_s"]
    print(
        f"\n{result['env']}, seed {result['seed']}: SFT saw {result['demos']} demonstrations; RL saw "
        f"{result['train_prompts']:,} prompts and the grader, no answers.\n"
        f"held-out accuracy ({METRICS[result['metric']]} on {result['test_rows']} test rows, none in the train split; "
        "greedy):\n"
        f"  SFT start     {start['accuracy']:6.1%}   SFT step {start['step']} ({start['train_s']:.0f} s of training)\n"
        f"  SFT baseline  {base['accuracy']:6.1%}   best of {base['steps']} steps (step {base['best_step']}; final "
        f"{base['final_accuracy']:.1%}), {base['train_s']:.0f} s of training (SFT start + RL: "
        f"{start['step'] + rl['steps']} steps, {both:.0f} s)\n"
        f"  RL            {rl['accuracy']:6.1%}   {rl['steps']} GRPO steps from the SFT start ({rl['train_s']:.0f} s): "
        f"{100 * (rl['accuracy'] - base['accuracy']):+.1f} points over the baseline, "
        f"{100 * (rl['accuracy'] - start['accuracy']):+.1f} over its start\n"
        f"wall time {result['wall_s']:.0f} s; report: {result['report']}"
    )
    if result["metric"] != "pass@1":
        sft, rl_scores = dict(result["scores"]["sft"]), result["scores"]["rl"]
        print(
            f"exact match (pass@1): SFT start {sft[start['step']]['pass@1']:.1%}, SFT baseline (its best step) "
            f"{sft[base['best_step']]['pass@1']:.1%}, RL {rl_scores[-1][1]['pass@1'] if rl_scores else math.nan:.1%}"
        )
