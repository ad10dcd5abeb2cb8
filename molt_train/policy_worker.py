"""``PolicyWorker``: one FSDP2 rank of the policy (or of the frozen reference), run as a Ray actor.

A transformers causal LM (``--actor.backend``) is sharded with ``fully_shard`` (each decoder layer, a vision model's
vision blocks too, then the root), gloo on CPU and NCCL on GPU, and wrapped in a ``LogProbModel``. A vision model's
micro-batches carry their rows' image tensors (``mm``), which the forward consumes. The worker receives the ``--actor.*`` group itself
(``ActorConfig``) and, per step, the ``--algo.*`` group (``AlgoConfig``): ``train_step`` runs one optimizer step over
the worker's micro-batches with ``rl_loss`` (or, without an ``AlgoConfig``, the SFT loss). The loss denominators are
those of the whole optimizer window (all micro-batches on all data-parallel ranks), and the loss is scaled by the
data-parallel size because FSDP averages gradients over those ranks. ``--fsdp.*`` (``molt_train.parallel``) adds
tensor parallelism inside each layer, expert parallelism (an MoE model's experts split over the ranks, outside
FSDP2, their gradients reduced by ``parallel.reduce_expert_grads``) and optimizer offload to the CPU.

An MoE policy with ``routing`` (``--train.record_routing``: "record", ``--train.routing_replay``: "replay") gets a
``GateReplay`` on its routers (``molt_train.routing``): every forward of a micro-batch that carries the rollout's
routing (``extra["routing"]``) counts the routing mismatch and, replaying, routes through the recorded experts.
``train_step`` returns the step's counts (``routing``), which the controller reports as
``train/routing_mismatch_frac``.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor
from transformers.core_model_loading import revert_weight_conversion

from molt_train import context_parallel, parallel
from molt_train import lora as lora_adapters
from molt_train.actor_backend import load_policy_model
from molt_train.algorithms import (
    aggregate,
    centering_term,
    get_policy_loss,
    is_correction,
    kl_loss,
    masked_mean,
    mismatch_metrics,
)
from molt_train.config.fsdp import FSDPConfig
from molt_train.logprob_model import LogProbModel
from molt_train.models.multimodal import layers_to_shard, load_processor, model_class
from molt_train.routing import GateReplay

if TYPE_CHECKING:
    from molt_train.config.algo import AlgoConfig
    from molt_train.config.groups import ActorConfig, ModelConfig


def rl_loss(
    logp: Tensor, mb: dict[str, Any], window: dict[str, Any], actor: ActorConfig, algo: AlgoConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """One micro-batch's share of the RL loss and its metrics; ``mb``'s tensors are on ``logp``'s device.

    policy loss (``--actor.loss_mode``, against pi_old: ``extra["logp_old"]`` when the batch was recomputed, else the
    forward's own log-probs, detached) x IS weights (``--algo.advantage.is_correction_*``), + A x the score-centering
    term (``--algo.advantage.score_centering_top_k``: ``mb["centering"]``) -> aggregated by ``--actor.loss_agg_mode``
    over the window's denominators, + beta x the KL loss (``--algo.kl.use_loss``).
    """
    mask, rollout_logp = mb["action_mask"], mb["rollout_logp"]
    old = mb["extra"].get("logp_old")
    old = logp.detach() if old is None else old  # one step on fresh samples: pi_old = pi
    low, high = actor.eps_clip_low_high
    loss_tokens, metrics = get_policy_loss(actor.loss_mode)(
        logp, old, mb["advantages"], mask, eps_low=low, eps_high=high, dual_clip=actor.dual_clip
    )
    adv = algo.advantage
    if adv.is_correction_level != "off":
        weights, is_metrics = is_correction(
            old,
            rollout_logp,
            mask,
            level=adv.is_correction_level,
            mode=adv.is_correction_mode,
            threshold=adv.is_correction_threshold,
            gating=adv.is_correction_gating,
        )
        loss_tokens = loss_tokens * weights
        metrics.update(is_metrics)
    centering = mb.get("centering")
    if centering is not None:
        term = centering_term(
            centering["cand_logp"],
            mb["extra"]["top_logq"],
            centering["expected_logp"],
            level=adv.is_correction_level,
            mode=adv.is_correction_mode,
            threshold=adv.is_correction_threshold,
        )
        loss_tokens = torch.where(mask, loss_tokens + mb["advantages"] * term, torch.zeros_like(loss_tokens))
        metrics["score_centering/term_mean"] = masked_mean(term.detach(), mask)
    mode = actor.loss_agg_mode
    if mode == "token-mean":
        loss = aggregate(loss_tokens, mask, mode, num_tokens=window["num_tokens"])
    else:
        units = mb["rollout_ids"] if mode == "seq-mean-token-mean" else mb["group_ids"]
        loss = aggregate(
            loss_tokens, mask, mode, unit_ids=units, unit_tokens=window["unit_tokens"], num_units=window["num_units"]
        )
    metrics.update(mismatch_metrics(old, rollout_logp, mask))
    kl = algo.kl
    if kl.init_coef > 0 and kl.use_loss:
        ref = mb["extra"].get("logp_ref")
        ref = rollout_logp if ref is None else ref
        term = kl_loss(logp, ref, mask, estimator=kl.estimator, num_tokens=window["num_tokens"])
        loss = loss + kl.init_coef * term
        metrics["kl_loss"] = term.detach() * window["num_tokens"] / max(int(mask.sum()), 1)
    return loss, metrics


def lr_factor(actor: ActorConfig, total_steps: int):
    """Linear warm-up over ``--actor.lr_warmup_ratio`` of ``total_steps``, then ``--actor.lr_scheduler``: constant,
    or cosine decay to ``--actor.min_lr_ratio`` at ``total_steps``."""
    total = max(total_steps, 1)
    warmup, floor = math.ceil(actor.lr_warmup_ratio * total), actor.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if actor.lr_scheduler == "constant":
            return 1.0
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class PolicyWorker:
    """One rank of a model built from ``model_path`` with the ``--actor.*`` settings; ``trainable=False``: the frozen
    reference (no optimizer). ``total_steps``: the run's optimizer steps (the LR schedule's length)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        actor: ActorConfig,
        model_path: str,
        *,
        seed: int,
        total_steps: int = 1,
        trainable: bool = True,
        num_threads: int = 0,
        fsdp: FSDPConfig | None = None,
        lora: ModelConfig | None = None,
        adapter_dir: str | None = None,
        routing: str | None = None,
    ) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers.utils import logging

        logging.disable_progress_bar()
        self.rank, self.world_size, self.actor = rank, world_size, actor
        self.device = join_process_group(rank, world_size, master_addr, master_port, seed=seed, num_threads=num_threads)
        fsdp = fsdp or FSDPConfig()
        lm = load_policy_model(
            actor.backend,
            model_path,
            dtype=torch.float32,
            attn_implementation=fsdp.attn_implementation,
            freeze_moe_router=actor.freeze_moe_router,
        )
        self.lora = lora if lora_adapters.enabled(lora) and trainable else None
        if self.lora is not None:  # only the adapters train (the frozen reference keeps the plain checkpoint)
            lora_adapters.inject(lm, self.lora, adapter_dir)
        # the frozen reference routes with its own weights: it scores the rollout, it did not generate it
        self.replay = GateReplay(lm, replay=routing == "replay") if routing and trainable else None
        lm = lm.to(self.device)
        self.config = lm.config
        if actor.gradient_checkpoint:
            lm.gradient_checkpointing_enable()
        gpu = self.device.type == "cuda"
        compiled = gpu and actor.compile
        # fp32 master weights; on GPU, FSDP2 all-gathers them as param_dtype for the forward and backward
        precision = MixedPrecisionPolicy(
            param_dtype=getattr(torch, actor.param_dtype) if gpu else None, reduce_dtype=torch.float32
        )
        mesh = parallel.device_mesh(self.device.type, world_size, fsdp)
        if fsdp.tp_size > 1:
            parallel.tensor_parallel(lm, mesh["tp"])
        if fsdp.cp_size > 1:
            context_parallel.enable(lm, fsdp.cp_size)
        # the loss is scaled by the data-parallel groups; FSDP2 shards (and averages) over their cp ranks too
        self.dp_size = mesh["dp"].size()
        dp_mesh = mesh["dp", "cp"]._flatten("dp_cp") if fsdp.cp_size > 1 else mesh["dp"]
        shard = {"mp_policy": precision, "offload_policy": parallel.offload_policy(fsdp, pin_memory=gpu)}
        self.experts: list[torch.nn.Parameter] = []  # expert-parallel DTensors, outside FSDP2
        self.expert_mesh = None
        if fsdp.ep_size > 1:
            if gpu and actor.param_dtype != "float32":
                raise ValueError(
                    f"--fsdp.ep_size {fsdp.ep_size} keeps the experts out of FSDP2's mixed precision: their fp32 "
                    f"weights would meet --actor.param_dtype {actor.param_dtype} activations; use "
                    "--actor.param_dtype float32 or --fsdp.ep_size 1"
                )
            self.expert_mesh = parallel.expert_mesh(self.device.type, world_size, fsdp.ep_size)
            self.experts = parallel.expert_parallel(lm, self.expert_mesh)
            shard["ignored_params"] = set(self.experts)
        for layer in layers_to_shard(lm):
            if compiled:  # the forward only: FSDP2's hooks around it stay eager
                layer.forward = torch.compile(layer.forward)
            # one rank: keep the layer's compute-dtype copy from forward to backward (resharding frees nothing)
            fully_shard(layer, mesh=dp_mesh, reshard_after_forward=dp_mesh.size() > 1, **shard)
        # a KV cache does not combine with activation checkpointing, compiled layers, or AutoModel's tuple outputs;
        # a shared-prefix forward runs the layers once or twice as a rank's rows decide, and the experts' all-to-all
        # needs every rank of an expert group to run them alike
        share = actor.backend == "hf" and not actor.gradient_checkpoint and not compiled and not self.experts
        share = share and fsdp.cp_size == 1
        self.model = LogProbModel(lm, actor.logprob_chunk_size, compile_chunks=compiled, share_prefixes=share)
        self.model.replay = self.replay
        self.model.cp_group = mesh["cp"].get_group() if fsdp.cp_size > 1 else None
        fully_shard(self.model, mesh=dp_mesh, **shard)
        self.optimizer = self.scheduler = None
        self._shared: list[Any] = []  # weight buckets a colocated engine is reading by CUDA IPC
        if trainable:
            adam = actor.adam
            # the fused multi-tensor step cannot mix the two meshes of a tensor- or expert-parallel model
            self.optimizer = torch.optim.AdamW(
                [p for p in self.model.parameters() if p.requires_grad],
                lr=adam.lr,
                betas=adam.betas,
                eps=adam.eps,
                weight_decay=adam.weight_decay,
                foreach=None if fsdp.tp_size == 1 and fsdp.ep_size == 1 else False,
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(actor, total_steps))
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
                _mm(mb, self.device),
                routing=mb["extra"].get("routing"),
            ).cpu()
            for mb in micro_batches
        ]

    # -- one optimizer step --
    def train_step(
        self,
        micro_batches: list[dict[str, Any]],
        window: dict[str, Any],
        algo: AlgoConfig | None = None,
        temperature: float = 1.0,
    ) -> dict[str, Any]:
        """``window``: num_tokens, unit_tokens, num_units (the whole step's denominators). ``algo``: the RL loss's
        settings (``rl_loss``); None: SFT (the token-mean negative log-likelihood of the masked tokens).
        ``temperature``: the one the log-probs are computed at (the rollout's)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, Tensor] = {}  # summed on the device: no host sync between micro-batches
        tokens_seen, loss_sum = 0, torch.zeros((), device=self.device)
        if self.replay is not None:
            self.replay.take()  # what forwards before this step counted
        for mb in micro_batches:
            mb = _to_device(mb, self.device)
            mask = mb["action_mask"]
            n = int(mask.sum())
            top_ids = mb["extra"].get("top_ids")
            logp = self.model(
                mb["input_ids"],
                mb["attention_mask"],
                temperature,
                mask,
                mb["mm"],
                candidates=top_ids,
                routing=mb["extra"].get("routing"),
            )
            if top_ids is not None:  # score centering: the candidates' log-probs come with the targets'
                mb["centering"] = {"expected_logp": logp[..., 1], "cand_logp": logp[..., 2:]}
                logp = logp[..., 0]
            if algo is None:
                loss, metrics = aggregate(-logp, mask, num_tokens=window["num_tokens"]), {}
            else:
                loss, metrics = rl_loss(logp, mb, window, self.actor, algo)
            (loss * self.dp_size).backward()  # FSDP2 averages gradients over the data-parallel ranks
            loss_sum += loss.detach()
            tokens_seen += n
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + torch.as_tensor(v, device=self.device).detach().float() * n
        if self.experts:
            parallel.reduce_expert_grads(self.experts, self.expert_mesh, self.dp_size)
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
            "routing": self.replay.take() if self.replay is not None else None,  # (differing, recorded) decisions
        }

    def _clip(self) -> float:
        return parallel.clip_grad_norm(list(self.model.parameters()), self.actor.max_norm or float("inf"))

    # -- weights and checkpoints --
    def full_state_dict(self, cpu_offload: bool = True, ranks: int = 1) -> dict[str, Tensor] | None:
        """The unsharded HF-named weights on rank 0 (None elsewhere), in CPU memory or, without ``cpu_offload``,
        on this rank's device, there on ranks 0..``ranks``-1; every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload))
        if self.rank >= (1 if cpu_offload else ranks):  # offloaded, only rank 0 receives the gathered tensors
            return None
        tied = getattr(self.config, "tie_word_embeddings", False)
        return {k.removeprefix("lm."): v for k, v in sd.items() if not (tied and k == "lm.lm_head.weight")}

    def adapter_state_dict(self) -> dict[str, Tensor] | None:
        """LoRA runs: rank 0's copy of the adapter weights only (what the hf engine receives); every rank calls it."""
        weights = self.full_state_dict()
        return None if weights is None else {k: v for k, v in weights.items() if lora_adapters.is_adapter_weight(k)}

    def save_adapter(self, directory: str) -> None:
        """LoRA runs: the current adapter as a PEFT adapter directory (what the vllm engine loads); every rank calls
        it, rank 0 writes."""
        weights = self.full_state_dict()
        if self.rank == 0:
            lora_adapters.save(self.config, weights, self.lora, Path(directory), merged=False)

    def _engine_weights(self, dtype: str, ranks: int = 1) -> list[tuple[str, Tensor]] | None:
        """Ranks 0..``ranks``-1: the full weights on this GPU cast to the engine's ``dtype`` ('auto' keeps them);
        None on the other ranks. Every rank must call it (the shards are gathered)."""
        weights = self.full_state_dict(cpu_offload=False, ranks=ranks)
        if weights is None:
            return None
        if self.device.type != "cuda":
            raise RuntimeError("syncing weights to a vllm engine needs the trainer on a GPU; this rank runs on the CPU")
        # vLLM loads the checkpoint's layout, which transformers may change on load (Qwen3-MoE: one fused
        # experts.gate_up_proj per layer for the checkpoint's experts.{i}.gate_proj/up_proj); undo it as
        # save_pretrained does, or vLLM's load_weights skips those tensors and serves stale experts
        weights = revert_weight_conversion(self.model.lm, weights)
        target = None if dtype == "auto" else getattr(torch, dtype)
        return [(name, t if target is None else t.to(target)) for name, t in weights.items()]

    def share_weights(self, dtype: str, bucket_bytes: int, ranks: int = 1) -> tuple[list[bytes], int] | None:
        """Ranks 0..``ranks``-1 (1: rank 0; an engine over several GPUs: the ranks on them): the engine weights
        packed into GPU buckets and shared by CUDA IPC with the rollout engine's worker on this GPU: (payloads,
        bytes). The buckets stay alive until ``release_shared``. Every rank must call it."""
        from molt_train.engines.weight_buckets import pack, share

        weights = self._engine_weights(dtype, ranks)
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
        """HF safetensors (+ tokenizer, or a vision model's processor) and the optimizer/scheduler/RNG state; every
        rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        weights = self.full_state_dict()
        optim = None
        if with_state and self.optimizer is not None:
            optim = get_optimizer_state_dict(
                self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        if self.rank != 0:
            return
        out = Path(directory)
        if self.lora is not None:  # adapter/ (PEFT) and hf/ (merged)
            lora_adapters.save(self.config, weights, self.lora, out)
        else:
            model = model_class(self.config).from_config(self.config, dtype=torch.float32)
            missing, unexpected = model.load_state_dict(weights, strict=False)
            tied = {"lm_head.weight"} if self.config.tie_word_embeddings else set()
            if unexpected or set(missing) - tied:
                raise RuntimeError(
                    f"checkpoint weights do not match the model: missing {missing}, unexpected {unexpected}"
                )
            model.tie_weights()
            model.save_pretrained(out / "hf")
        load_processor(tokenizer_path).save_pretrained(out / "hf")
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

    def node_endpoint(self) -> tuple[str, int]:
        """This rank's node address and a free TCP port on it (a rendezvous this rank hosts: the NCCL weight group)."""
        return free_port()


def free_port() -> tuple[str, int]:
    """This node's address and a free TCP port on it (for a process group's rendezvous).

    The port is drawn below the kernel's ephemeral range: a port the kernel hands out for ``bind(0)`` is also the
    local port of outgoing connections (Ray opens many), so one found free there can be taken by a connection before
    rank 0 listens on it (``EADDRINUSE``). Ray's worker ports (10002-19999) are left alone too. Drawn with the OS's
    randomness, not ``random``, which the ranks seed alike.
    """
    import secrets
    import socket

    import ray

    addr = ray.util.get_node_ip_address()
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except OSError:  # not Linux: the IANA ephemeral range starts at 49152
        ephemeral_low = 49152
    low = 20000 if ephemeral_low > 21000 else 1024  # above Ray's own worker ports (10002-19999 by default)
    for _ in range(100):
        port = low + secrets.randbelow(ephemeral_low - low)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return addr, port
    raise RuntimeError(f"no free TCP port in {low}..{ephemeral_low - 1} on {addr} after 100 tries")


def join_process_group(
    rank: int, world_size: int, master_addr: str, master_port: int, *, seed: int, num_threads: int = 0
) -> torch.device:
    """Set up this Ray actor as rank ``rank`` of a worker group: its torch threads (``num_threads``; 0 leaves
    torch's default), the process group (NCCL on a GPU, else gloo) at ``master_addr:master_port``, and the torch and
    Python RNGs seeded with ``seed``.

    Returns:
        The rank's device: the actor's GPU when it has one, else the CPU.
    """
    if num_threads:
        torch.set_num_threads(num_threads)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)
    torch.manual_seed(seed)
    random.seed(seed)
    return device


def _to_device(mb: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A micro-batch with its tensors (and those of ``extra`` and ``mm``) on ``device``."""
    moved = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in mb.items()}
    moved["extra"] = {k: v.to(device) for k, v in mb.get("extra", {}).items()}
    moved["mm"] = _mm(mb, device)
    return moved


def _mm(mb: dict[str, Any], device: torch.device) -> dict[str, Tensor]:
    """The micro-batch's image tensors on ``device`` (empty for text rows)."""
    return {k: v.to(device) for k, v in mb.get("mm", {}).items()}
