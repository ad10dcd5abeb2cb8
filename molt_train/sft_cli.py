"""``molt-train sft --env ID --model.config tiny --ckpt.output_dir DIR``: supervised fine-tuning on reference
completions, through the same FSDP2 policy workers as RL.

With ``--model.config tiny`` the tokenizer (byte-level BPE, one token per digit) is trained on the env's train split
and a randomly initialised model is built, so nothing is downloaded. Each row is rendered with the chat template;
the loss covers only the assistant reply (through its end token). Writes ``DIR/hf``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from molt_train import checkpoint
from molt_train.config import parse
from molt_train.data import PromptSampler, encode_sft, load_rows
from molt_train.eval_cli import evaluate
from molt_train.experience import Experience
from molt_train.metrics import MetricsLogger
from molt_train.policy_worker import WorkerGroup
from molt_train.trainer import init_ray, quiet, train_window, worker_cfg


def build_tiny(cfg: SimpleNamespace, rows: list[dict[str, Any]], out: Path) -> Path:
    """Train a tokenizer on the rows' text and save a fresh tiny model next to it."""
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    texts = [_text(r["prompt"]) + " " + str(r["reference"] if r["reference"] is not None else r["label"]) for r in rows]
    tokenizer = train_tokenizer(texts, vocab_size=cfg.model.vocab_size, split_digits=True)
    m = cfg.model
    model = build_tiny_model(
        tokenizer,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=max(1, m.num_heads // 2),
        intermediate_size=m.intermediate_size or 4 * m.hidden_size,
        max_positions=cfg.data.max_len,
        seed=cfg.train.seed,
    )
    return save_tiny(model, tokenizer, out)


def _text(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)


def sft_batch(encoded: list[tuple[list[int], list[bool]]], pad_id: int) -> Experience:
    n, width = len(encoded), max(len(ids) for ids, _ in encoded)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.bool)
    for i, (ids, mask) in enumerate(encoded):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        loss_mask[i, : len(ids)] = torch.tensor(mask)
    ids = [str(i) for i in range(n)]
    return Experience(
        input_ids,
        attention,
        loss_mask[:, 1:],
        torch.zeros(n, width - 1),
        torch.zeros(n),
        attention.sum(1),
        torch.zeros(n, dtype=torch.bool),
        ids,
        ids,
        [None] * n,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from transformers import AutoTokenizer

    cfg = parse("sft", argv)
    quiet()
    out = Path(cfg.ckpt.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = load_rows(cfg)
    missing = [i for i, r in enumerate(rows) if r["reference"] is None]
    if missing:
        raise SystemExit(
            f"row {missing[0]} has no reference completion; SFT needs the env split's reference_key "
            "or --data.output_key"
        )
    start_step, resume = 0, checkpoint.latest(out) if cfg.ckpt.load_enable else None
    if resume is not None:
        model_path, start_step = resume / "hf", checkpoint.read_state(resume)["step"]
    elif cfg.model.config == "tiny":
        model_path = build_tiny(cfg, rows, out / "init")
    else:
        model_path = Path(cfg.actor.model_name_or_path).resolve()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    t0 = time.perf_counter()
    encoded = [encode_sft(tokenizer, r["prompt"], r["reference"], cfg.data.max_len) for r in rows]
    init_ray(cfg)
    group = WorkerGroup(cfg.actor.num_workers, worker_cfg(cfg, str(model_path), cfg.train.num_steps))
    try:
        if resume is not None:
            group.call("load_state", directory=str(resume))
        sampler = PromptSampler(len(encoded), cfg.train.batch_size, cfg.train.seed)
        logger = MetricsLogger(out, cfg.train.num_steps, start_step, cfg.logger.progress, "sft")
        try:
            for step in range(start_step + 1, cfg.train.num_steps + 1):
                t = time.perf_counter()
                exp = sft_batch([encoded[i] for i in sampler.batch(step - 1)], pad_id)
                metrics = train_window(group, exp, cfg, pad_id, {"kind": "sft", "temperature": 1.0})
                metrics = {f"train/{k}" if "/" not in k else k: v for k, v in metrics.items()}
                metrics["timing/step"] = time.perf_counter() - t
                if cfg.ckpt.save_steps and step % cfg.ckpt.save_steps == 0 and step < cfg.train.num_steps:
                    checkpoint.save(
                        group,
                        out,
                        step,
                        str(model_path),
                        {"data_position": step * cfg.train.batch_size},
                        cfg.ckpt.max_num,
                    )
                logger.log(step, metrics, ("train/loss",))
        finally:
            logger.close()
        final = checkpoint.export_hf(group, out, str(model_path))
    finally:
        group.shutdown()
    print(f"sft done: {cfg.train.num_steps} steps in {time.perf_counter() - t0:.1f}s, model in {final}")
    if cfg.env and cfg.eval.max_samples != 0:
        result = evaluate(cfg, final)
        print(f"held-out {cfg.eval.split} accuracy {result['accuracy']:.3f} ({int(result['num_rows'])} rows)")
    return 0
