"""Train on any registered env ID with TRL's ``GRPOTrainer`` (``pip install 'molt-ecosystem[trl]'``).

    python examples/trl_grpo.py --env molt/sort-v1 --max-steps 5
    python examples/trl_grpo.py --env gym/frozen-lake-v1 --max-steps 2 --max-completion-length 16
    python examples/trl_grpo.py --env molt/sort-v1 --model ./my-checkpoint --output-dir ./out

Without ``--model`` it builds a tiny model from scratch (a byte-level BPE with one token per digit, trained on the
env's rows, and a Qwen2-architecture LM of ~100K parameters, saved under ``OUTPUT_DIR/init``), so it runs on a CPU.
Single-turn envs are graded by the env's own ``step`` as a TRL reward function; multi-turn and tool envs are played
by molt's runner as TRL's ``rollout_func`` (env_registry/ecosystems/trl.py). Prints the env's reward every step.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def tiny_model(env_id: str, out: Path):
    """A tokenizer trained on the env's rows and a fresh tiny LM, saved to ``out``."""
    from env_registry import load_split, spec
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    rows = load_split(spec(env_id), "train", 2000)
    texts = [" ".join(str(m.get("content", "")) for m in r["prompt"]) + " " + str(r["label"]) for r in rows]
    tokenizer = train_tokenizer(texts, vocab_size=512, split_digits=True)
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, max_positions=2048, seed=0)
    save_tiny(model, tokenizer, out)
    return model, tokenizer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="a registered env ID (molt-env list)")
    parser.add_argument("--model", help="a transformers checkpoint directory (default: a tiny model from scratch)")
    parser.add_argument("--max-steps", type=int, default=5)
    parser.add_argument("--output-dir", default="trl-grpo-out")
    parser.add_argument("--rows", type=int, default=512, help="train rows to load (0: all)")
    parser.add_argument("--num-generations", type=int, default=4, help="completions per prompt (a GRPO group)")
    parser.add_argument("--batch-size", type=int, default=8, help="completions per step")
    parser.add_argument("--max-completion-length", type=int, default=16, help="tokens per completion (per turn)")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    args = parser.parse_args(argv)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from env_registry.ecosystems.trl import grpo_kwargs

    out = Path(args.output_dir)
    if args.model:
        model, tokenizer = AutoModelForCausalLM.from_pretrained(args.model), AutoTokenizer.from_pretrained(args.model)
    else:
        model, tokenizer = tiny_model(args.env, out / "init")
    inputs = grpo_kwargs(args.env, tokenizer, limit=args.rows or None)
    name = inputs["reward_funcs"][0].__name__  # TRL's metrics: rewards/<env ID>/mean

    class PrintReward(TrainerCallback):
        def on_log(self, _args, state, _control, logs=None, **_kwargs):
            if logs and f"rewards/{name}/mean" in logs:  # None: every episode of the step failed (env/failures)
                extra = {k: round(v, 4) for k, v in logs.items() if k.startswith("env/") and v is not None}
                print(f"step {state.global_step}: {name} reward {logs[f'rewards/{name}/mean']} {extra}", flush=True)

    config = GRPOConfig(
        output_dir=str(out),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        learning_rate=args.learning_rate,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_vllm=False,
        use_cpu=not torch.cuda.is_available(),  # TRL defaults to bf16, which a CPU lacks
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, args=config, processing_class=tokenizer, callbacks=[PrintReward()], **inputs)
    trainer.remove_callback(PrinterCallback)  # PrintReward says what matters here
    trainer.train()


if __name__ == "__main__":
    main()
