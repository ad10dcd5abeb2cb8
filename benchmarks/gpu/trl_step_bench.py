"""The same GRPO step as grpo_step_bench.py, run through TRL's GRPOTrainer with vLLM in colocate mode.

    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/trl_step_bench.py --model DIR [--steps 3]
    .venv/bin/python benchmarks/gpu/trl_step_bench.py --cpu-smoke   # same code path on CPU: tiny model, HF generate

Plain ``python3``, one process, no torchrun: for a single process TRL's colocate mode sets RANK=0, LOCAL_RANK=0,
WORLD_SIZE=1, MASTER_ADDR and a free MASTER_PORT itself just before it builds ``vllm.LLM(...,
distributed_executor_backend="external_launcher")``, and vLLM then starts a one-rank process group (env://) in this
process (it also turns VLLM_ENABLE_V1_MULTIPROCESSING off). Needs vLLM importable (PYTHONPATH) and trl, datasets,
multiprocess and dill installed; with several GPUs visible TRL refuses to start (nn.DataParallel), so this script
defaults CUDA_VISIBLE_DEVICES to 0. Expect about 30 s of imports, 60-70 s of vLLM start (torch.compile + CUDA
graphs), then the steps.

Workload, as close to grpo_step_bench.py as TRL allows: the random-weight model written by ``shapes.py DIR 0.6b``
(fp32 master weights, bf16 autocast, SDPA, fused AdamW betas 0.9/0.95, lr 1e-5, grad clip 1.0), the same 32 random
prompts of 128 token ids (passed as plain text ``"w{id-3} ..."`` of the word-level vocabulary, which tokenizes back to
exactly those ids), 8 samples each (256 sequences), temperature 1, no top-p/top-k, up to 512 new tokens, vLLM
gpu_memory_utilization 0.35 with no sleep mode, reward = share of even token ids in the completion, beta 0 (no
reference model), one generation feeding exactly one optimizer step of 8 micro-batches of 32 sequences.
TRL's own choices that differ from ours: vLLM max_num_batched_tokens 4096 and max_num_seqs 256 (hard-wired in
``VLLMGeneration``; ours 16384 / 1024), vLLM's default prefix caching (on; ours off), the weight sync is
``load_weights`` one fp32 parameter at a time at the start of the step (ours: bf16 buckets by CUDA IPC at the end of
the step), the loss is TRL's "dapo" (token mean over the generation batch, like ours) with vLLM importance-sampling
correction (which is why it recomputes the old log-probs, as ours does), and its fused LM head (Triton on GPU) also
computes the entropy.

Timed per optimizer step (a TrainerCallback, on_step_begin -> on_step_end, torch.cuda.synchronize at both ends):
  step_s         everything TRL does for one step
  rollout_s      ``_generate_and_score_completions``: weight sync + generation + decode + reward + old log-probs
  weight_sync_s  ``VLLMGeneration.sync_weights`` (policy -> vLLM)
  generation_s   ``_generate_single_turn`` less the weight sync (vLLM generate of the 256 sequences)
  logprob_s      the old log-prob recompute inside the rollout
  training_s     step_s - rollout_s: 8 micro-batch forward/backward passes and the optimizer step
Training MFU uses grpo_step_bench.model_flops (same formula, same peak) on the exact sequence lengths.
One ``RESULT`` line ``trl_grpo_step_<tag>`` (also appended to $OUT/results.jsonl) holds the per-step lists.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path

T_START = time.perf_counter()  # the run's wall time counts from here (imports included): the time to a first step

# Before any Hugging Face / vLLM import: no hub, no telemetry ping, one visible GPU.
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "CUDA_VISIBLE_DEVICES": "0",
}.items():
    os.environ.setdefault(_key, _value)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step_bench import PEAK_FLOPS, model_flops  # noqa: E402
from shapes import make_model, random_prompts, record  # noqa: E402


def prompt_text(ids: list[int]) -> str:
    """The text the word-level tokenizer of shapes.py turns back into ``ids`` (id k >= 3 is the word ``w{k-3}``)."""
    return " ".join(f"w{i - 3}" for i in ids)


class Phases:
    """Wall-clock seconds spent in wrapped trainer methods since the last ``reset``, split by phase."""

    def __init__(self, synchronize) -> None:
        self.synchronize = synchronize
        self.seconds: dict[str, float] = defaultdict(float)
        self.in_rollout = False

    def reset(self) -> None:
        self.seconds = defaultdict(float)

    def wrap(self, obj, method: str, key: str) -> None:
        """Time ``obj.method`` (an instance attribute shadows the class's); ``logprob`` counts only in the rollout."""
        fn = getattr(obj, method)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if key == "logprob" and not self.in_rollout:
                return fn(*args, **kwargs)
            outer = self.in_rollout
            self.in_rollout = outer or key == "rollout"
            self.synchronize()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.synchronize()
                self.seconds[key] += time.perf_counter() - start
                self.in_rollout = outer

        setattr(obj, method, timed)


def run(args: argparse.Namespace, model_dir: str, out_dir: str) -> dict:
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoConfig, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = not args.cpu_smoke
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible (use --cpu-smoke for the CPU check)")

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize()

    cfg = AutoConfig.from_pretrained(model_dir)
    n = args.prompts * args.samples
    if n % args.micro_rows:
        raise ValueError(f"--prompts x --samples ({n}) must be a multiple of --micro-rows ({args.micro_rows})")
    accumulation = n // args.micro_rows
    prompts = random_prompts(args.prompts, args.prompt_len, cfg.vocab_size, seed=1)  # grpo_step_bench's prompts
    texts = [prompt_text(p) for p in prompts]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for ids, text in zip(prompts, texts, strict=True):
        got = tokenizer(text)["input_ids"]
        if got != ids:
            raise RuntimeError(f"prompt text does not tokenize back to its ids: {got[:8]}... != {ids[:8]}...")
    dataset = datasets.Dataset.from_dict({"prompt": texts})

    rollout_lengths: list[list[int]] = []  # completion lengths of each generation batch, in call order

    def even_share(completion_ids: list[list[int]], **kwargs) -> list[float]:
        """grpo_step_bench's synthetic reward: the share of even token ids in the completion."""
        rollout_lengths.append([len(ids) for ids in completion_ids])
        return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]

    settings = dict(
        per_device_train_batch_size=args.micro_rows,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        num_generations=args.samples,
        num_iterations=1,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        optim="adamw_torch_fused",
        max_grad_norm=1.0,
        bf16=True,
        gradient_checkpointing=False,
        max_steps=args.steps,
        shuffle_dataset=False,
        seed=0,
        model_init_kwargs={"dtype": "float32", "attn_implementation": "sdpa"},
        use_vllm=cuda,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.gpu_memory_utilization,
        vllm_max_model_length=args.prompt_len + args.new_tokens if args.cpu_smoke else 1024,
        vllm_tensor_parallel_size=1,
        vllm_enable_sleep_mode=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        use_cpu=not cuda,
    )
    config = GRPOConfig(output_dir=out_dir, **settings)
    if config.generation_batch_size != n:
        raise RuntimeError(f"TRL derived a generation batch of {config.generation_batch_size}, expected {n}")

    phases = Phases(synchronize)
    steps: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kwargs):
            synchronize()
            phases.reset()
            self.start = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            synchronize()
            step_s = time.perf_counter() - self.start
            sec = dict(phases.seconds)
            lengths = [args.prompt_len + c for c in rollout_lengths[-1]]
            gen_tokens = sum(rollout_lengths[-1])
            training_s = step_s - sec.get("rollout", 0.0)
            train_flops = model_flops(cfg, lengths, matmul_params, passes=3)
            row = {
                "step": len(steps),
                "sequences": len(lengths),
                "generated_tokens": gen_tokens,
                "total_tokens": sum(lengths),
                "step_s": step_s,
                "rollout_s": sec.get("rollout", 0.0),
                "weight_sync_s": sec.get("sync", 0.0),
                "generation_s": sec.get("generate", 0.0) - sec.get("sync", 0.0),
                "logprob_s": sec.get("logprob", 0.0),
                "training_s": training_s,
                "training_tflops": train_flops / training_s / 1e12,
                "training_mfu": train_flops / training_s / PEAK_FLOPS,
                "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
                "since_start_s": time.perf_counter() - T_START,
            }
            row["generation_tok_per_s"] = gen_tokens / row["generation_s"] if row["generation_s"] > 0 else 0.0
            steps.append(row)
            print(
                f"step {row['step']}: {step_s:.2f}s = rollout {row['rollout_s']:.2f} (sync "
                f"{row['weight_sync_s']:.3f}, gen {row['generation_s']:.2f}, logprob {row['logprob_s']:.2f}) + train "
                f"{training_s:.2f}; {gen_tokens} new tokens, {row['generation_tok_per_s']:.0f} tok/s; "
                f"MFU {row['training_mfu']:.1%}; peak {row['peak_mem_gib']:.1f} GiB; {row['since_start_s']:.1f}s since start",
                flush=True,
            )

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if steps and logs and "reward" in logs:
                steps[-1]["trl"] = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}

    t0 = time.perf_counter()
    trainer = GRPOTrainer(
        model=model_dir, reward_funcs=even_share, args=config, train_dataset=dataset, callbacks=[StepTimer()]
    )
    init_s = time.perf_counter() - t0
    policy = trainer.model
    matmul_params = sum(p.numel() for name, p in policy.named_parameters() if "embed_tokens" not in name)
    if cfg.tie_word_embeddings:
        matmul_params += policy.get_input_embeddings().weight.numel()  # the tied lm_head is a matmul
    print(
        f"GRPOTrainer ready in {init_s:.1f}s ({time.perf_counter() - T_START:.1f}s since start; vLLM {'colocated' if cuda else 'off'}); policy "
        f"{next(policy.parameters()).dtype} on {next(policy.parameters()).device}; {n} sequences per step in "
        f"{accumulation} micro-batches of {args.micro_rows}",
        flush=True,
    )
    phases.wrap(trainer, "_generate_and_score_completions", "rollout")
    phases.wrap(trainer, "_generate_single_turn", "generate")
    phases.wrap(trainer, "_get_per_token_logps_and_entropies", "logprob")
    if cuda:
        phases.wrap(trainer.vllm_generation, "sync_weights", "sync")

    trainer.train()
    if len(steps) != args.steps:
        raise RuntimeError(f"expected {args.steps} optimizer steps, timed {len(steps)}")
    if len(rollout_lengths) != args.steps:
        raise RuntimeError(f"expected one generation per step, saw {len(rollout_lengths)} for {args.steps} steps")

    versions = {
        "trl": trl.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
    }
    if cuda:
        import vllm

        versions["vllm"] = vllm.__version__
        versions["gpu"] = torch.cuda.get_device_name(0)
    keys = [k for k in steps[0] if k != "trl"]
    result = {k: [s[k] for s in steps] for k in keys}
    result["trl_logs"] = [s.get("trl", {}) for s in steps]
    result.update(
        init_s=init_s,
        ready_since_start_s=t0 - T_START + init_s,
        versions=versions,
        matmul_params=matmul_params,
        settings={k: v for k, v in settings.items() if k != "use_cpu"}
        | {
            "prompts": args.prompts,
            "prompt_len": args.prompt_len,
            "model": model_dir,
            "vllm_max_num_seqs": config.per_device_train_batch_size * config.steps_per_generation,
            "vllm_max_num_batched_tokens": 4096,
            "vllm_prefix_caching": "vLLM default (on)",
            "loss_type": config.loss_type,
            "scale_rewards": config.scale_rewards,
            "vllm_importance_sampling_correction": config.vllm_importance_sampling_correction,
        },
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="directory written by `shapes.py DIR 0.6b`")
    parser.add_argument("--tag", default=None, help="result name suffix (default 0.6b, or cpu_smoke)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--micro-rows", type=int, default=None)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny model on CPU, HF generate instead of vLLM, 8 new tokens, 2 steps"
    )
    args = parser.parse_args()
    # (GPU default, CPU smoke default) for the flags whose default depends on the mode
    for name, gpu, cpu in [
        ("tag", "0.6b", "cpu_smoke"),
        ("steps", 3, 2),
        ("prompts", 32, 2),
        ("samples", 8, 4),
        ("new_tokens", 512, 8),
        ("micro_rows", 32, 4),
    ]:
        if getattr(args, name) is None:
            setattr(args, name, cpu if args.cpu_smoke else gpu)
    if args.cpu_smoke == bool(args.model):
        parser.error("give exactly one of --model DIR and --cpu-smoke")

    name = f"trl_grpo_step_{args.tag}"
    tmp = tempfile.mkdtemp(prefix="trl_step_bench_")
    try:
        model_dir = make_model(str(Path(tmp, "tiny")), "tiny", device="cpu") if args.cpu_smoke else args.model
        result = run(args, model_dir, str(Path(tmp, "out")))
    except Exception as exc:
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    shutil.rmtree(tmp, ignore_errors=True)
    record(name, result)
    sys.stdout.flush()
    sys.stderr.flush()
    # The colocated vLLM engine and the process group it started live in this process: skip their teardown, which
    # can hang (above all after a failure half-way through building them).
    os._exit(1 if "error" in result else 0)


if __name__ == "__main__":
    main()
