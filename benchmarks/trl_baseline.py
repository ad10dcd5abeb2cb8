"""TRL's GRPOTrainer on the same tiny model, task, batch and sampling settings as ``molt-train rl`` (the baseline side
of ``trainer_vs_trl.py``). Runs for a fixed wall-clock budget, then measures held-out greedy accuracy."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch


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
