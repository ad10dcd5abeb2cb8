"""``CriticWorker``: one FSDP2 rank of the PPO critic (``--algo.advantage.estimator gae``), run as a Ray actor.

The critic is the policy's model class without its output head: the transformers backbone of the ``--critic.*``
checkpoint (default: the actor's) and a scalar value head, ``nn.Linear(hidden, 1)``. ``V[:, t]`` is the value of the
context before token ``t + 1``, on the next-token axis of the log-probs and the action mask. It has its own AdamW
(``--critic.adam.*``) and trains on the clipped value loss (``--critic.value_clip``) against the GAE returns. Its
resumable state is ``_critic/critic.pt`` inside each checkpoint (weights, optimizer, scheduler).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from molt_train.actor_backend import load_policy_model
from molt_train.algorithms import value_loss
from molt_train.policy_worker import _to_device, free_port, join_process_group, lr_factor

if TYPE_CHECKING:
    from molt_train.config.algo import CriticConfig
    from molt_train.config.groups import ActorConfig

CRITIC_DIR = "_critic"


class ValueModel(nn.Module):
    """A causal LM's backbone with a scalar value head: forward -> (N, L-1) values."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )[0][:, :-1]
        return self.value_head(hidden.float()).squeeze(-1).clone()


class CriticWorker:
    """One rank of the critic built from ``model_path`` with the ``--actor.*`` sharding/precision settings and the
    ``--critic.*`` optimizer; ``total_steps``: the run's optimizer steps (the LR schedule)."""

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
        critic: CriticConfig,
        total_steps: int = 1,
        num_threads: int = 0,
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.rank, self.world_size, self.actor, self.critic = rank, world_size, actor, critic
        self.device = join_process_group(rank, world_size, master_addr, master_port, seed=seed, num_threads=num_threads)
        lm = load_policy_model(actor.backend, model_path, dtype=torch.float32)
        model = ValueModel(lm.model, lm.config.hidden_size).to(self.device)
        gpu = self.device.type == "cuda"
        precision = MixedPrecisionPolicy(
            param_dtype=getattr(torch, actor.param_dtype) if gpu else None, reduce_dtype=torch.float32
        )
        mesh = init_device_mesh(self.device.type, (world_size,))
        for layer in model.backbone.layers:
            fully_shard(layer, mesh=mesh, mp_policy=precision, reshard_after_forward=world_size > 1)
        self.model = fully_shard(model, mesh=mesh, mp_policy=precision)
        adam = critic.adam
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(actor, total_steps))

    @torch.no_grad()
    def values(self, micro_batches: list[dict[str, Any]]) -> list[Tensor]:
        """V of every position of each micro-batch, (n, L-1) on the CPU."""
        self.model.eval()
        return [
            self.model(mb["input_ids"].to(self.device), mb["attention_mask"].to(self.device)).cpu()
            for mb in micro_batches
        ]

    def train_step(
        self, micro_batches: list[dict[str, Any]], window: dict[str, Any], algo: Any = None, temperature: float = 1.0
    ) -> dict[str, Any]:
        """One optimizer step on the clipped value loss against ``extra["returns"]`` (old values:
        ``extra["values"]``), over the window's action tokens. ``algo``/``temperature`` are the policy's step
        arguments (``WorkerGroup.train_step`` calls every model alike); the critic reads neither."""
        del algo, temperature
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, Tensor] = {}
        tokens_seen, loss_sum = 0, torch.zeros((), device=self.device)
        for mb in micro_batches:
            mb = _to_device(mb, self.device)
            mask, n = mb["action_mask"], int(mb["action_mask"].sum())
            values = self.model(mb["input_ids"], mb["attention_mask"])
            old, returns = mb["extra"].get("values"), mb["extra"].get("returns")
            if old is None:  # a padding micro-batch (no rows on this rank)
                old = returns = torch.zeros_like(values)
            loss, metrics = value_loss(
                values, old, returns, mask, value_clip=self.critic.value_clip, num_tokens=window["num_tokens"]
            )
            (loss * self.world_size).backward()
            loss_sum += loss.detach()
            tokens_seen += n
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v.float() * n
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.actor.max_norm or float("inf"))
        self.optimizer.step()
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return {
            "loss": float(loss_sum),
            "tokens": tokens_seen,
            "grad_norm": float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm),
            "lr": lr,
            "weighted": {k: float(v) for k, v in totals.items()},
        }

    def save(self, directory: str, tokenizer_path: str = "", with_state: bool = True) -> None:
        """``<directory>/_critic/critic.pt``: the full weights (backbone + value head) and, ``with_state``, the
        optimizer and scheduler; every rank must call it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = {"model": get_model_state_dict(self.model, options=options)}
        if with_state:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer, options=options)
            state["scheduler"] = self.scheduler.state_dict()
        if self.rank == 0:
            out = Path(directory) / CRITIC_DIR
            out.mkdir(parents=True, exist_ok=True)
            torch.save(state, out / "critic.pt")

    def load_state(self, directory: str) -> None:
        """Restore the weights, optimizer and scheduler of ``save``'s ``<directory>/_critic``."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        state = torch.load(Path(directory) / CRITIC_DIR / "critic.pt", weights_only=False)
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, state["model"], options=options)
        set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=state["optimizer"], options=options)
        self.scheduler.load_state_dict(state["scheduler"])

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def node_endpoint(self) -> tuple[str, int]:
        return free_port()
