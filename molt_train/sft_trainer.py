"""``SFTTrainer``: supervised fine-tuning on reference completions, through the same FSDP2 policy ranks as RL.

With ``--model.config tiny`` the tokenizer (byte-level BPE, one token per digit) is trained on the env's train split
and a randomly initialised model is built, so nothing is downloaded; ``tiny-vl`` builds a vision-language model and
its processor the same way (``molt_train.models.tiny_vl``). Each row is rendered with the chat template (a vision
row's images placed and expanded by the processor, their tensors sent with the row to the policy ranks); the loss
covers only the assistant reply (through its end token). Several ``--env ID:WEIGHT`` mix their rows into each batch
by weight (``MixSampler``; ``train/<env>/rows`` counts them). ``run()`` writes ``<output_dir>/hf`` (with the
processor, for a vision model).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from env_registry.mix import env_lock
from molt_envs.vision import VisionInputs, text_tokenizer
from molt_train import checkpoint
from molt_train import lora as lora_adapters
from molt_train.config.commands import SFTConfig
from molt_train.data import MixSampler, encode_sft, env_mix, load_rows
from molt_train.experience import Experience
from molt_train.metrics import MetricsLogger
from molt_train.models.multimodal import load_processor
from molt_train.runtime import cpu_threads, init_ray, quiet
from molt_train.worker_group import WorkerGroup


class SFTTrainer:
    """Encodes ``cfg``'s rows and starts the policy ranks; ``run()`` trains and exports the final model."""

    def __init__(self, cfg: SFTConfig) -> None:
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
        self.start_step, data_state = 0, None
        self.env_lock = env_lock(env_mix(cfg))  # the envs trained on: state.json, each hf/molt_env_lock.json
        self.resumed_from = checkpoint.latest(out) if cfg.ckpt.load_enable else None
        if self.resumed_from is not None:
            checkpoint.warn_env_changes(checkpoint.read_state(self.resumed_from), self.env_lock, self.resumed_from)
        lora = cfg.model if lora_adapters.enabled(cfg.model) else None
        adapter_dir = None
        if self.resumed_from is not None and lora is not None:  # the base + the run's adapter
            self.model_path = Path(cfg.actor.model_name_or_path).resolve()
            adapter_dir = str(self.resumed_from / "adapter")
            self.start_step = checkpoint.read_state(self.resumed_from)["step"]
        elif self.resumed_from is not None:
            self.model_path = self.resumed_from / "hf"
            state = checkpoint.read_state(self.resumed_from)
            self.start_step, data_state = state["step"], state.get("data")
        elif cfg.model.config is not None:
            self.model_path = build_tiny(cfg, rows, out / "init")
        else:
            self.model_path = Path(cfg.actor.model_name_or_path).resolve()
        processor = load_processor(self.model_path)  # the tokenizer, or a vision model's processor
        tokenizer = text_tokenizer(processor)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.encoded = [
            encode_sft(processor, r["prompt"], r["reference"], cfg.data.max_len, r.get("images")) for r in rows
        ]
        self.envs = [r.get("env") for r in rows]
        weights = {e.env_id: e.weight for e in env_mix(cfg)} if not cfg.data.prompt_dataset else None
        self.sampler = MixSampler(rows, weights, cfg.train.batch_size, cfg.train.seed, data_state, self.start_step)
        init_ray(cfg.ray)
        threads = cpu_threads(cfg.actor.num_threads, cfg.actor.num_workers)
        self.policy = WorkerGroup(
            cfg.actor,
            cfg.train,
            str(self.model_path),
            total_steps=cfg.train.num_steps,
            num_threads=threads,
            fsdp=cfg.fsdp,
            lora=lora,
            adapter_dir=adapter_dir,
        )
        if self.resumed_from is not None:
            self.policy.call("load_state", directory=str(self.resumed_from))

    def run(self) -> Path:
        """Train ``--train.num_steps`` steps; returns the exported model directory."""
        cfg, total = self.cfg, self.cfg.train.num_steps
        logger = MetricsLogger(
            self.output_dir, total, self.start_step, cfg.logger.progress, "sft", cfg.logger, dataclasses.asdict(cfg)
        )
        try:
            for step in range(self.start_step + 1, total + 1):
                t = time.perf_counter()
                picked = self.sampler.batch(step - 1)
                exp = sft_batch([self.encoded[i] for i in picked], self.pad_id)
                metrics = self.policy.train_step(exp, self.pad_id)
                metrics = {f"train/{k}" if "/" not in k else k: v for k, v in metrics.items()}
                for i in picked:  # a mix: the rows each env gave this step
                    if self.envs[i] is not None:
                        metrics[f"train/{self.envs[i]}/rows"] = metrics.get(f"train/{self.envs[i]}/rows", 0) + 1
                metrics["timing/step"] = time.perf_counter() - t
                if cfg.ckpt.save_steps and step % cfg.ckpt.save_steps == 0 and step < total:
                    state = {"data": self.sampler.state()}
                    checkpoint.save(
                        self.policy,
                        self.output_dir,
                        step,
                        str(self.model_path),
                        state,
                        cfg.ckpt.max_num,
                        env_lock=self.env_lock,
                    )
                logger.log(step, metrics, ("train/loss",))
        finally:
            logger.close()
        return checkpoint.export_hf(self.policy, self.output_dir, str(self.model_path), self.env_lock)

    def shutdown(self) -> None:
        self.policy.shutdown()


ROLE_NAMES = ("system", "user", "assistant")


def build_tiny(cfg: SFTConfig, rows: list[dict[str, Any]], out: Path) -> Path:
    """Train a tokenizer on the rows' text and save a fresh tiny model (``--model.*``: ``tiny``, or ``tiny-vl`` with
    its processor) next to it."""
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    texts = [_text(r["prompt"]) + " " + str(r["reference"] if r["reference"] is not None else r["label"]) for r in rows]
    m = cfg.model
    if m.role_tokens:  # role headers of a few tokens, not one a character (molt_envs/README.md, tictactoe-v3)
        texts += [" ".join(ROLE_NAMES)] * max(1, len(rows) // 10)
    if m.config == "tiny-vl":
        from molt_train.models.tiny_vl import build_tiny_vl

        return build_tiny_vl(
            texts,
            out,
            vocab_size=m.vocab_size,
            hidden_size=m.hidden_size,
            num_layers=m.num_layers,
            num_heads=m.num_heads,
            intermediate_size=m.intermediate_size,
            image_size=m.image_size,
            patch_size=m.patch_size,
            max_positions=cfg.data.max_len,
            seed=cfg.train.seed,
        )
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


def sft_batch(encoded: list[tuple[list[int], list[bool], VisionInputs | None]], pad_id: int) -> Experience:
    """Encoded rows (token ids, loss mask, image inputs) padded into one batch whose action mask is the loss mask."""
    n, width = len(encoded), max(len(ids) for ids, _, _ in encoded)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.bool)
    for i, (ids, mask, _) in enumerate(encoded):
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
        mm=[mm for _, _, mm in encoded] if any(mm for _, _, mm in encoded) else [],
    )
