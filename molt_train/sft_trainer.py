"""``SFTTrainer``: supervised fine-tuning on reference completions, through the same FSDP2 policy ranks as RL.

With ``--model.config tiny`` the tokenizer (byte-level BPE, one token per digit) is trained on the env's train split
and a randomly initialised model is built, so nothing is downloaded. Each row is rendered with the chat template;
the loss covers only the assistant reply (through its end token). ``run()`` writes ``<output_dir>/hf``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from molt_train import checkpoint
from molt_train.config import SFTConfig
from molt_train.data import PromptSampler, encode_sft, load_rows
from molt_train.experience import Experience
from molt_train.metrics import MetricsLogger
from molt_train.runtime import cpu_threads, init_ray, quiet
from molt_train.worker_group import WorkerGroup


class SFTTrainer:
    """Encodes ``cfg``'s rows and starts the policy ranks; ``run()`` trains and exports the final model."""

    def __init__(self, cfg: SFTConfig) -> None:
        from transformers import AutoTokenizer

        quiet()
        self.cfg = cfg
        self.output_dir = out = Path(cfg.ckpt.output_dir).resolve()
        out.mkdir(parents=True, exist_ok=True)
        rows = load_rows(cfg)
        missing = [i for i, r in enumerate(rows) if r["reference"] is None]
        if missing:
            raise ValueError(
                f"row {missing[0]} has no reference completion; SFT needs the env split's reference_key "
                "or --data.output_key"
            )
        self.start_step = 0
        self.resumed_from = checkpoint.latest(out) if cfg.ckpt.load_enable else None
        if self.resumed_from is not None:
            self.model_path = self.resumed_from / "hf"
            self.start_step = checkpoint.read_state(self.resumed_from)["step"]
        elif cfg.model.config == "tiny":
            self.model_path = build_tiny(cfg, rows, out / "init")
        else:
            self.model_path = Path(cfg.actor.model_name_or_path).resolve()
        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.encoded = [encode_sft(tokenizer, r["prompt"], r["reference"], cfg.data.max_len) for r in rows]
        self.sampler = PromptSampler(len(self.encoded), cfg.train.batch_size, cfg.train.seed)
        init_ray(cfg.ray)
        threads = cpu_threads(cfg.actor.num_threads, cfg.actor.num_workers)
        self.policy = WorkerGroup(
            cfg.actor,
            cfg.train,
            str(self.model_path),
            total_steps=cfg.train.num_steps,
            num_threads=threads,
            fsdp=cfg.fsdp,
        )
        if self.resumed_from is not None:
            self.policy.call("load_state", directory=str(self.resumed_from))

    def run(self) -> Path:
        """Train ``--train.num_steps`` steps; returns the exported model directory."""
        cfg, total = self.cfg, self.cfg.train.num_steps
        logger = MetricsLogger(self.output_dir, total, self.start_step, cfg.logger.progress, "sft")
        try:
            for step in range(self.start_step + 1, total + 1):
                t = time.perf_counter()
                exp = sft_batch([self.encoded[i] for i in self.sampler.batch(step - 1)], self.pad_id)
                metrics = self.policy.train_step(exp, self.pad_id)
                metrics = {f"train/{k}" if "/" not in k else k: v for k, v in metrics.items()}
                metrics["timing/step"] = time.perf_counter() - t
                if cfg.ckpt.save_steps and step % cfg.ckpt.save_steps == 0 and step < total:
                    state = {"data_position": step * cfg.train.batch_size}
                    checkpoint.save(self.policy, self.output_dir, step, str(self.model_path), state, cfg.ckpt.max_num)
                logger.log(step, metrics, ("train/loss",))
        finally:
            logger.close()
        return checkpoint.export_hf(self.policy, self.output_dir, str(self.model_path))

    def shutdown(self) -> None:
        self.policy.shutdown()


def build_tiny(cfg: SFTConfig, rows: list[dict[str, Any]], out: Path) -> Path:
    """Train a tokenizer on the rows' text and save a fresh tiny model (``--model.*``) next to it."""
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    texts = [_text(r["prompt"]) + " " + str(r["reference"] if r["reference"] is not None else r["label"]) for r in rows]
    m = cfg.model
    tokenizer = train_tokenizer(texts, vocab_size=m.vocab_size, split_digits=True)
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
    """Encoded rows (token ids, loss mask) padded into one batch whose action mask is the loss mask."""
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
