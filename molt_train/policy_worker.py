"""``PolicyWorker``: one FSDP2 rank of the policy (or of the frozen reference), run as a Ray actor.

A transformers causal LM is sharded with ``fully_shard`` (each decoder layer, then the root), gloo on CPU and NCCL
on GPU. Log-probs are computed in chunks of ``logprob_chunk_size`` tokens, each recomputed in backward, so the fp32
full-vocabulary logits of the whole batch never exist at once. ``train_step`` runs one optimizer step over the
worker's micro-batches; the loss denominators are those of the whole optimizer window (all micro-batches on all
ranks), and the loss is scaled by the world size because FSDP averages gradients over ranks.
"""

from __future__ import annotations

import inspect
import math
import os
import random
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from molt_train.actor_backend import load_policy_model
from molt_train.algorithms import aggregate, get_policy_loss, is_correction, kl_loss, mismatch_metrics


def _chunk_logp(hidden: Tensor, targets: Tensor, weight: Tensor, temperature: float) -> Tensor:
    logits = (hidden @ weight.t()).float() / temperature
    return logits.gather(-1, targets[:, None])[:, 0] - logits.logsumexp(-1)


def _lr_lambda(cfg: dict[str, Any]):
    """Linear warm-up over ``warmup_steps``, then ``constant`` or ``cosine`` decay to ``min_lr_ratio`` at
    ``total_steps``."""
    warmup, total = max(int(cfg.get("warmup_steps", 0)), 0), max(int(cfg.get("total_steps", 1)), 1)
    schedule, floor = cfg.get("lr_scheduler", "constant"), float(cfg.get("min_lr_ratio", 0.0))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class LogProbModel(nn.Module):
    """Wraps a causal LM so one forward returns per-token log-probs of the next tokens, (N, L-1).

    With ``share_prefixes``, rows whose tokens before their first action are identical (the samples of a GRPO group
    share their prompt) run that prefix once: one forward over the distinct prefixes with a KV cache, the cache
    copied to each row, one forward over the rows' remaining tokens. The log-probs are those of the plain forward
    (up to float rounding) and the gradients flow through the copies, so the result is the same computation on fewer
    tokens; it is used when it saves at least a fifth of the tokens.
    """

    def __init__(
        self, lm: nn.Module, chunk_size: int, share_prefixes: bool = False, compile_chunks: bool = False
    ) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.share_prefixes = share_prefixes
        # compiled, a chunk's upcast, log-sum-exp and gather fuse: its fp32 logits are never written out
        self._chunk_logp = torch.compile(_chunk_logp, dynamic=True) if compile_chunks else _chunk_logp
        # transformers 5.x names the KV cache argument `cache`; 4.x called it `past_key_values`
        self._cache_arg = "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0, action_mask: Tensor | None = None
    ) -> Tensor:
        """``action_mask`` (N, L-1): where the actions start, for prefix sharing (None: a plain forward)."""
        if self.share_prefixes and action_mask is not None:
            lengths = attention_mask.sum(1)
            first_action = torch.where(action_mask.any(1), action_mask.int().argmax(1) + 1, lengths)
            prefix_lens = torch.minimum(first_action, lengths).clamp(min=1)
            rows = [tuple(ids[:p]) for ids, p in zip(input_ids.tolist(), prefix_lens.tolist(), strict=True)]
            first: dict[tuple[int, ...], int] = {}  # distinct prefix -> its first row
            owner = [first.setdefault(r, i) for i, r in enumerate(rows)]
            suffix = int((lengths - prefix_lens).max())
            shared_tokens = len(first) * int(prefix_lens.max()) + len(rows) * suffix
            if shared_tokens <= 0.8 * input_ids.numel():
                device = input_ids.device
                distinct = list(first.values())
                slot = {row: k for k, row in enumerate(distinct)}
                return self._shared_forward(
                    input_ids,
                    temperature,
                    lengths,
                    prefix_lens,
                    torch.tensor(distinct, device=device),
                    torch.tensor([slot[o] for o in owner], device=device),
                    suffix,
                )
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.lm.model(
            input_ids=input_ids,
            attention_mask=attention_mask,  # [0]: a ModelOutput or a
            position_ids=position_ids,
            use_cache=False,
        )[0][:, :-1]  # tuple (AutoModel's)
        return self._logp(hidden, input_ids[:, 1:], temperature).clone()  # FSDP2 warns on view outputs

    def _shared_forward(
        self,
        input_ids: Tensor,
        temperature: float,
        lengths: Tensor,
        prefix_lens: Tensor,
        first: Tensor,
        owner: Tensor,
        suffix: int,
    ) -> Tensor:
        """``first``: a row of each distinct prefix; ``owner``: each row's prefix (an index into ``first``);
        ``suffix``: the longest row's tokens after its prefix."""
        n, length = input_ids.shape
        device = input_ids.device
        p = prefix_lens[first]
        width = int(p.max())
        steps = torch.arange(width, device=device)
        prefix_mask = (steps < p[:, None]).long()  # right-padded: no query row is fully masked
        prefix = self.lm.model(
            input_ids=input_ids[first, :width],
            attention_mask=prefix_mask,
            position_ids=steps.expand(len(first), width),
            use_cache=True,
        )
        prefix_hidden = prefix.last_hidden_state
        pieces = [self._logp(prefix_hidden[:, :-1], input_ids[first, 1:width], temperature).reshape(-1)]
        p_row = prefix_lens[:, None]
        t = torch.arange(length - 1, device=device)[None, :]
        index = torch.where(t < p_row - 1, owner[:, None] * (width - 1) + t, -1)
        if suffix > 0:
            cols = p_row + torch.arange(suffix, device=device)[None, :]
            suffix_ids = input_ids.gather(1, cols.clamp(max=length - 1))
            cache = getattr(prefix, self._cache_arg)
            cache.reorder_cache(owner)
            mask = torch.cat([prefix_mask[owner], (cols < lengths[:, None]).long()], dim=1)
            rest = self.lm.model(
                input_ids=suffix_ids, attention_mask=mask, position_ids=cols, use_cache=True, **{self._cache_arg: cache}
            ).last_hidden_state
            last = prefix_hidden[owner, prefix_lens - 1][:, None]  # predicts each row's first suffix token
            pieces.append(self._logp(torch.cat([last, rest[:, :-1]], dim=1), suffix_ids, temperature).reshape(-1))
            offset = t - p_row + 1
            in_suffix = (offset >= 0) & (offset < suffix)
            index = torch.where(
                in_suffix, len(first) * (width - 1) + torch.arange(n, device=device)[:, None] * suffix + offset, index
            )
        pieces.append(torch.zeros(1, device=device))  # positions past a row's end (padding): 0
        flat = torch.cat(pieces)
        return flat[torch.where(index < 0, flat.numel() - 1, index)]

    def _logp(self, hidden: Tensor, targets: Tensor, temperature: float) -> Tensor:
        """Log-probs of ``targets`` (N, T) from ``hidden`` (N, T, H), in chunks of ``chunk_size`` positions."""
        n, length, width = hidden.shape
        flat, targets = hidden.reshape(-1, width), targets.reshape(-1)
        weight = self.lm.lm_head.weight
        chunks = []
        for s in range(0, flat.shape[0], self.chunk_size):
            args = (flat[s : s + self.chunk_size], targets[s : s + self.chunk_size], weight, temperature)
            chunks.append(
                checkpoint(self._chunk_logp, *args, use_reentrant=False)
                if torch.is_grad_enabled()
                else self._chunk_logp(*args)
            )
        return torch.cat(chunks).reshape(n, length) if chunks else hidden.new_zeros(n, length)


class PolicyWorker:
    """One rank. ``cfg`` keys: model_path, backend, freeze_moe_router, lr, betas, eps, weight_decay, max_norm,
    warmup_steps, seed, trainable, logprob_chunk_size, gradient_checkpoint, param_dtype, compile."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, cfg: dict[str, Any]) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers.utils import logging

        logging.disable_progress_bar()
        if cfg.get("num_threads"):
            torch.set_num_threads(cfg["num_threads"])
        self.rank, self.world_size, self.cfg = rank, world_size, cfg
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo", rank=rank, world_size=world_size)
        torch.manual_seed(cfg["seed"])
        random.seed(cfg["seed"])
        lm = load_policy_model(
            cfg.get("backend", "hf"),
            cfg["model_path"],
            dtype=torch.float32,
            freeze_moe_router=cfg.get("freeze_moe_router", False),
        ).to(self.device)
        self.config = lm.config
        if cfg.get("gradient_checkpoint"):
            lm.gradient_checkpointing_enable()
        gpu = self.device.type == "cuda"
        compiled = gpu and cfg.get("compile", False)
        # fp32 master weights; on GPU, FSDP2 all-gathers them as param_dtype for the forward and backward
        precision = MixedPrecisionPolicy(
            param_dtype=getattr(torch, cfg.get("param_dtype", "bfloat16")) if gpu else None, reduce_dtype=torch.float32
        )
        mesh = init_device_mesh(self.device.type, (world_size,))
        for layer in lm.model.layers:
            if compiled:  # the forward only: FSDP2's hooks around it stay eager
                layer.forward = torch.compile(layer.forward)
            # one rank: keep the layer's compute-dtype copy from forward to backward (resharding frees nothing)
            fully_shard(layer, mesh=mesh, mp_policy=precision, reshard_after_forward=world_size > 1)
        # a KV cache does not combine with activation checkpointing, compiled layers, or AutoModel's tuple outputs
        self.model = LogProbModel(
            lm,
            cfg["logprob_chunk_size"],
            compile_chunks=compiled,
            share_prefixes=(cfg.get("backend", "hf") == "hf" and not cfg.get("gradient_checkpoint") and not compiled),
        )
        fully_shard(self.model, mesh=mesh, mp_policy=precision)
        self.optimizer = self.scheduler = None
        self._shared: list[Any] = []  # weight buckets a colocated engine is reading by CUDA IPC
        if cfg.get("trainable", True):
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=cfg["lr"],
                betas=tuple(cfg["betas"]),
                eps=cfg["eps"],
                weight_decay=cfg["weight_decay"],
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(cfg))
        else:
            self.model.requires_grad_(False)

    # -- forward only (pi_old, reference) --
    @torch.no_grad()
    def logprobs(self, micro_batches: list[dict[str, Any]], temperature: float) -> list[Tensor]:
        self.model.eval()
        return [
            self.model(
                mb["input_ids"].to(self.device),
                mb["attention_mask"].to(self.device),
                temperature,
                mb["action_mask"].to(self.device),
            ).cpu()
            for mb in micro_batches
        ]

    # -- one optimizer step --
    def train_step(self, micro_batches: list[dict[str, Any]], window: dict[str, Any], loss_cfg: dict[str, Any]) -> dict:
        """``window``: num_tokens, unit_tokens, num_units (the whole step's denominators). ``loss_cfg``: kind
        ('rl' | 'sft'), temperature and, for rl, the policy-loss / IS / KL settings."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, Tensor] = {}  # summed on the device: no host sync between micro-batches
        tokens_seen, loss_sum = 0, torch.zeros((), device=self.device)
        for mb in micro_batches:
            n = int(mb["action_mask"].sum())
            mask = mb["action_mask"].to(self.device)
            logp = self.model(
                mb["input_ids"].to(self.device), mb["attention_mask"].to(self.device), loss_cfg["temperature"], mask
            )
            if loss_cfg["kind"] == "sft":
                loss = aggregate(-logp, mask, num_tokens=window["num_tokens"])
                metrics = {}
            else:
                loss, metrics = self._rl_loss(logp, mask, mb, window, loss_cfg)
            (loss * self.world_size).backward()
            loss_sum += loss.detach()
            tokens_seen += n
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + torch.as_tensor(v, device=self.device).detach().float() * n
        grad_norm = self._clip()
        self.optimizer.step()
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return {
            "loss": float(loss_sum),
            "tokens": tokens_seen,
            "grad_norm": grad_norm,
            "lr": lr,
            "weighted": {k: float(v) for k, v in totals.items()},
        }

    def _rl_loss(
        self, logp: Tensor, mask: Tensor, mb: dict[str, Any], window: dict[str, Any], cfg: dict[str, Any]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        rollout_logp = mb["rollout_logp"].to(self.device)
        old = mb["extra"].get("logp_old")
        old = logp.detach() if old is None else old.to(self.device)  # one step on fresh samples: pi_old = pi
        advantages = mb["advantages"].to(self.device)
        loss_tokens, metrics = get_policy_loss(cfg["loss_mode"])(
            logp, old, advantages, mask, eps_low=cfg["eps_low"], eps_high=cfg["eps_high"], dual_clip=cfg["dual_clip"]
        )
        if cfg["is_level"] != "off":
            weights, is_metrics = is_correction(
                old, rollout_logp, mask, level=cfg["is_level"], mode=cfg["is_mode"], threshold=cfg["is_threshold"]
            )
            loss_tokens = loss_tokens * weights
            metrics.update(is_metrics)
        mode = cfg["loss_agg_mode"]
        if mode == "token-mean":
            loss = aggregate(loss_tokens, mask, mode, num_tokens=window["num_tokens"])
        else:
            units = mb["rollout_ids"] if mode == "seq-mean-token-mean" else mb["group_ids"]
            loss = aggregate(
                loss_tokens,
                mask,
                mode,
                unit_ids=units,
                unit_tokens=window["unit_tokens"],
                num_units=window["num_units"],
            )
        metrics.update(mismatch_metrics(old, rollout_logp, mask))
        if cfg["kl_coef"] > 0 and cfg["kl_use_loss"]:
            ref = mb["extra"].get("logp_ref")
            ref = rollout_logp if ref is None else ref.to(self.device)
            kl = kl_loss(logp, ref, mask, estimator=cfg["kl_estimator"], num_tokens=window["num_tokens"])
            loss = loss + cfg["kl_coef"] * kl
            metrics["kl_loss"] = kl.detach() * window["num_tokens"] / max(int(mask.sum()), 1)
        return loss, metrics

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg["max_norm"] or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    # -- weights and checkpoints --
    def full_state_dict(self, cpu_offload: bool = True) -> dict[str, Tensor] | None:
        """The unsharded HF-named weights on rank 0 (None elsewhere), in CPU memory or, without ``cpu_offload``,
        on this rank's device; every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload))
        if self.rank != 0:
            return None
        tied = getattr(self.config, "tie_word_embeddings", False)
        return {k.removeprefix("lm."): v for k, v in sd.items() if not (tied and k == "lm.lm_head.weight")}

    def _engine_weights(self, dtype: str) -> list[tuple[str, Tensor]] | None:
        """Rank 0: the full weights on this GPU cast to the engine's ``dtype`` ('auto' keeps them); None on the
        other ranks. Every rank must call it (the shards are gathered)."""
        weights = self.full_state_dict(cpu_offload=False)
        if weights is None:
            return None
        if self.device.type != "cuda":
            raise RuntimeError("syncing weights to a vllm engine needs the trainer on a GPU; this rank runs on the CPU")
        target = None if dtype == "auto" else getattr(torch, dtype)
        return [(name, t if target is None else t.to(target)) for name, t in weights.items()]

    def share_weights(self, dtype: str, bucket_bytes: int) -> tuple[list[bytes], int] | None:
        """Rank 0: the engine weights packed into GPU buckets and shared by CUDA IPC with a rollout engine on this
        GPU: (payloads, bytes). The buckets stay alive until ``release_shared``. Every rank must call it."""
        from molt_train.engines.weight_buckets import pack, share

        weights = self._engine_weights(dtype)
        if weights is None:
            return None
        self._shared = list(pack(weights, bucket_bytes, device=self.device))
        del weights
        return [share(bucket) for bucket in self._shared], sum(bucket.nbytes for bucket in self._shared)

    # -- NCCL sync to an engine on other GPUs (rank 0 is the group's source) --
    def init_weight_sender(self, host: str, port: int, world_size: int, bucket_bytes: int) -> None:
        """Rank 0: open the weight-sync NCCL group (the engine's workers join it concurrently)."""
        from molt_train.engines.vllm import NcclWeightSender

        self._sender = NcclWeightSender(host, port, world_size, device=self.device.index, bucket_bytes=bucket_bytes)

    def gather_weights(self, dtype: str) -> list[tuple[bytes, int]] | None:
        """Every rank: gather the engine weights onto rank 0, which returns the bucket plan the engine receives
        (``VLLMEngine.receive_broadcast``) and keeps the tensors for ``send_weights``."""
        self._outgoing = self._engine_weights(dtype)
        return None if self._outgoing is None else self._sender.plan(self._outgoing)

    def send_weights(self, times: int = 1) -> int:
        """Rank 0: broadcast the gathered weights ``times`` times (the equality check receives them twice);
        returns bytes per broadcast."""
        try:
            for _ in range(times):
                sent = self._sender.send(self._outgoing)
            return sent
        finally:
            self._outgoing = None

    def release_shared(self) -> None:
        """Drop the buckets of ``share_weights`` once the engine has loaded them."""
        self._shared = []
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()

    def save(self, directory: str, tokenizer_path: str, with_state: bool = True) -> None:
        """HF safetensors (+ tokenizer) and the optimizer/scheduler/RNG state; every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        from transformers import AutoModelForCausalLM, AutoTokenizer

        weights = self.full_state_dict()
        optim = None
        if with_state and self.optimizer is not None:
            optim = get_optimizer_state_dict(
                self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        if self.rank != 0:
            return
        out = Path(directory)
        model = AutoModelForCausalLM.from_config(self.config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        tied = {"lm_head.weight"} if self.config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            raise RuntimeError(f"checkpoint weights do not match the model: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        model.save_pretrained(out / "hf")
        AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(out / "hf")
        if optim is not None:
            torch.save(
                {
                    "optimizer": optim,
                    "scheduler": self.scheduler.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "python_rng": random.getstate(),
                },
                out / "trainer_state.pt",
            )

    def load_state(self, directory: str) -> None:
        """Restore optimizer/scheduler/RNG from ``save``'s output (weights come from loading its hf/ dir)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        state = torch.load(Path(directory) / "trainer_state.pt", weights_only=False)
        set_optimizer_state_dict(
            self.model,
            self.optimizer,
            optim_state_dict=state["optimizer"],
            options=StateDictOptions(full_state_dict=True),
        )
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class WorkerGroup:
    """``num_workers`` PolicyWorker Ray actors forming one FSDP2 process group; each takes ``gpu_fraction`` of a
    GPU when the cluster has GPUs (below 1: colocated with other actors on that GPU)."""

    def __init__(
        self,
        num_workers: int,
        cfg: dict[str, Any],
        name: str = "policy",
        gpu_fraction: float = 1.0,
        placement: Any = None,
    ) -> None:
        """``placement``: a Ray placement group whose bundle i (one GPU) holds rank i."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpus = gpu_fraction if ray.cluster_resources().get("GPU", 0) >= num_workers * gpu_fraction else 0
        actor = ray.remote(num_cpus=0, num_gpus=gpus)(PolicyWorker)
        addr, port = free_port()
        self.workers = [
            actor.options(
                scheduling_strategy=None
                if placement is None
                else PlacementGroupSchedulingStrategy(placement, placement_group_bundle_index=rank)
            ).remote(rank, num_workers, addr, port, cfg)
            for rank in range(num_workers)
        ]
        self.name = name

    def call(self, method: str, *per_rank: list[Any], **same: Any) -> list[Any]:
        """Call ``method`` on every rank (rank i gets ``per_rank[j][i]`` as positional j) and wait for all."""
        import ray

        refs = [getattr(w, method).remote(*(args[i] for args in per_rank), **same) for i, w in enumerate(self.workers)]
        return ray.get(refs)

    def call_async(self, method: str, **same: Any) -> list[Any]:
        return [getattr(w, method).remote(**same) for w in self.workers]

    def shutdown(self) -> None:
        import ray

        try:
            ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
        finally:
            for w in self.workers:
                ray.kill(w)


def free_port() -> tuple[str, int]:
    """This node's address and a free TCP port on it (for a process group's rendezvous)."""
    import socket

    import ray

    addr = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind(("", 0))
        return addr, s.getsockname()[1]
