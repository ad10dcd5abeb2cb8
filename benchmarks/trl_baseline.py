"""TRL's GRPOTrainer on the same tiny model, task, batch and sampling settings as ``molt-train rl`` (the baseline side
of ``trainer_vs_trl.py``). Runs for a fixed wall-clock budget, then measures held-out greedy accuracy.

Alone, on a start checkpoint (``trainer_vs_trl.py`` builds one into ``runs/trainer_vs_trl/sft/hf``), TRL's side only,
against its start's held-out accuracy:

    .venv/bin/python benchmarks/trl_baseline.py --init runs/trainer_vs_trl/sft/hf [--seconds 20] [--seed 42]

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): a random tiny model built from scratch in a
temporary directory (no Ray, no SFT), a 1-second budget of 4 prompts x 4 samples, 16 test rows: TRL's API and the
judge in seconds, figures meaningless.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

# Sleeping OpenMP threads, set before torch loads its OpenMP runtime (trainer_vs_trl.py says why; an explicit
# OMP_WAIT_POLICY wins).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ENV = "molt/arith-v1"


def run_trl(
    init_dir: Path,
    train_rows: list[dict],
    test_rows: list[dict],
    *,
    prompts_per_step: int,
    samples_per_prompt: int,
    max_new_tokens: int,
    lr: float,
    wall_s: float,
    out_dir: Path,
    seed: int = 0,
    threads: int | None = None,
) -> dict[str, Any]:
    """Train for ``wall_s`` seconds of ``train()`` (stopping after the step that crosses it), save the final model
    to ``out_dir/final`` (inside the timed seconds, as molt's loop includes its final HF export), then judge."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, ProgressCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from molt_envs.envs.arith import parse_answer

    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)

    def reward(completions, answer, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(parse_answer(t) == int(a)) for t, a in zip(texts, answer, strict=True)]

    class WallClock(TrainerCallback):
        def __init__(self) -> None:
            self.start, self.steps = 0.0, 0

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.steps += 1
            if time.perf_counter() - self.start >= wall_s:
                control.should_training_stop = True

    clock = WallClock()
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": str(r["label"])} for r in train_rows])
    config = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=prompts_per_step * samples_per_prompt,
        num_generations=samples_per_prompt,
        max_completion_length=max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=lr,
        beta=0.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        max_steps=100000,
        seed=seed,
        disable_dropout=True,
        lr_scheduler_type="constant",
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[clock]
    )
    for quiet in (PrinterCallback, ProgressCallback):  # per-step log lines; the metrics stay in state.log_history
        trainer.remove_callback(quiet)
    setup = time.perf_counter() - t0
    trainer.train()
    trainer.save_model(str(out_dir / "final"))
    elapsed = time.perf_counter() - clock.start
    accuracy = greedy_accuracy(trainer.model, tokenizer, test_rows, max_new_tokens)
    samples = clock.steps * prompts_per_step * samples_per_prompt
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {
        "steps": clock.steps,
        "seconds": elapsed,
        "setup_s": setup,
        "steps_per_s": clock.steps / elapsed,
        "samples_per_s": samples / elapsed,
        "accuracy": accuracy,
        "reward_last5": sum(rewards[-5:]) / max(len(rewards[-5:]), 1),
    }


@torch.no_grad()
def greedy_accuracy(model: Any, tokenizer: Any, rows: list[dict], max_new_tokens: int) -> float:
    """Held-out accuracy with greedy decoding through the project's hf engine (the same judge for both sides)."""
    import asyncio

    from molt_envs import SamplingParams
    from molt_envs.envs.arith import parse_answer
    from molt_envs.runners import render_prompt
    from molt_train.engines.hf import HFEngine

    engine = HFEngine(model.eval(), tokenizer, max_batch_size=256)
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)

    async def answer(row: dict) -> bool:
        ids = tokenizer.encode(render_prompt(tokenizer, row["prompt"]), add_special_tokens=False)
        gen = await engine.generate(ids, params)
        return parse_answer(tokenizer.decode(gen.token_ids)) == int(row["label"])

    async def all_rows() -> list[bool]:
        return await asyncio.gather(*[answer(r) for r in rows])

    return sum(asyncio.run(all_rows())) / len(rows)


def tiny_start(rows: list[dict], out: Path, seed: int) -> Path:
    """A random tiny Qwen2 with a tokenizer trained on ``rows`` (what ``molt-train sft --model.config tiny`` starts
    from, untrained): the smoke's start checkpoint."""
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    texts = ["\n".join(m["content"] for m in r["prompt"]) + " " + str(r["label"]) for r in rows]
    tokenizer = train_tokenizer(texts, vocab_size=512, split_digits=True)
    return save_tiny(build_tiny_model(tokenizer, hidden_size=32, seed=seed), tokenizer, out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", type=Path, help="the start checkpoint (an HF directory); not with --smoke")
    parser.add_argument("--seconds", type=float, default=20.0, help="wall budget of train()")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--prompts_per_step", type=int, default=48)
    parser.add_argument("--samples_per_prompt", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=5)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval_rows", type=int, default=512)
    parser.add_argument("--out", type=Path, default=Path("runs/trl_baseline"))
    parser.add_argument("--smoke", action="store_true", help="a random tiny start, seconds: the code path, not figures")
    args = parser.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import env_registry
    from molt_train.runtime import quiet

    quiet()
    spec = env_registry.spec(ENV)
    if args.smoke:
        args.seconds, args.prompts_per_step, args.samples_per_prompt, args.eval_rows = 1.0, 4, 4, 16
    elif args.init is None:
        parser.error("--init DIR is required (or --smoke)")
    train_rows = env_registry.load_split(spec, "train", 256 if args.smoke else None)
    test_rows = env_registry.load_split(spec, "test", args.eval_rows)
    with tempfile.TemporaryDirectory(prefix="trl-baseline-smoke-") as tmp:
        out = Path(tmp) if args.smoke else args.out.resolve()
        init = tiny_start(train_rows, out / "init", args.seed) if args.smoke else args.init
        return compare(init, train_rows, test_rows, out, args)


def compare(init: Path, train_rows: list[dict], test_rows: list[dict], out: Path, args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32)
    start = greedy_accuracy(model, AutoTokenizer.from_pretrained(init), test_rows, args.max_new_tokens)
    print(f"start checkpoint {init}: held-out greedy accuracy {start:.1%} on {len(test_rows)} test rows", flush=True)
    m = run_trl(
        init,
        train_rows,
        test_rows,
        prompts_per_step=args.prompts_per_step,
        samples_per_prompt=args.samples_per_prompt,
        max_new_tokens=args.max_new_tokens,
        lr=args.lr,
        wall_s=args.seconds,
        out_dir=out / f"trl-{args.seed}",
        seed=args.seed,
        threads=args.threads,
    )
    print(
        f"TRL: {m['steps']} steps in {m['seconds']:.1f}s (+{m['setup_s']:.1f}s setup), {m['steps_per_s']:.3f} steps/s, "
        f"{m['samples_per_s']:.1f} samples/s, accuracy {m['accuracy']:.1%}, train reward (last 5 steps) "
        f"{m['reward_last5']:.2f}, 1-min load average {os.getloadavg()[0]:.2f}"
    )
    print(f"accuracy TRL - start: {100 * (m['accuracy'] - start):+.1f} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
