"""``WorkerGroup``: the FSDP2 ranks of one model (the policy, or the frozen reference) as Ray actors, seen from the
controller, and the two calls that spread a batch over them: ``train_step`` (one optimizer step) and ``logprobs``.

A batch is split into per-rank micro-batches by ``experience.plan_micro_batches`` under ``--train.micro_batch_size``
and ``--train.max_tokens_per_gpu``; the loss denominators of the whole optimizer window go with every micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from molt_train.experience import Experience, micro_batch, plan_micro_batches
from molt_train.placement import on_this_node
from molt_train.policy_worker import PolicyWorker, free_port

if TYPE_CHECKING:
    from molt_train.config.algo import AlgoConfig
    from molt_train.config.fsdp import FSDPConfig
    from molt_train.config.groups import ActorConfig, TrainConfig


class WorkerGroup:
    """``actor.num_workers`` PolicyWorker Ray actors forming one FSDP2 process group.

    Args:
        actor: the ``--actor.*`` group, handed to every rank as is.
        train: the ``--train.*`` group (seed, micro-batch limits).
        model_path: the checkpoint the ranks load (the policy's, a resumed one, or the reference's).
        total_steps: optimizer steps of the run (the LR schedule).
        gpus: each rank's share of a GPU (0: CPU). place: rank -> its Ray ``.options(...)`` (a placement-group
            bundle, a node); default: CPU ranks on the driver's node.
        fsdp: the ``--fsdp.*`` group (tensor parallel size, optimizer offload), handed to ``PolicyWorker`` ranks;
            None: plain FSDP2 (and nothing handed on, as a ``CriticWorker`` takes no ``fsdp``).
        worker_cls: the rank's class, ``PolicyWorker`` or ``CriticWorker``; ``options``: its own keyword
            arguments (``PolicyWorker``: ``trainable=False`` for the frozen reference, ``lora`` / ``adapter_dir``;
            ``CriticWorker``: ``critic``).
    """

    def __init__(
        self,
        actor: ActorConfig,
        train: TrainConfig,
        model_path: str,
        *,
        total_steps: int = 1,
        num_threads: int = 0,
        gpus: float = 0.0,
        place: Callable[[int], dict[str, Any]] | None = None,
        name: str = "policy",
        fsdp: FSDPConfig | None = None,
        worker_cls: type = PolicyWorker,
        **options: Any,
    ) -> None:
        import ray

        self.name, self.actor, self.train = name, actor, train
        # ranks that read the same micro-batches: a tensor- or context-parallel group
        self.peers = fsdp.tp_size * fsdp.cp_size if fsdp is not None else 1
        if fsdp is not None:
            options["fsdp"] = fsdp
        ranks = actor.num_workers
        if place is None:  # CPU ranks on the driver's node; GPU ranks where Ray finds their GPUs
            pinned = on_this_node() if gpus == 0 else {}
            place = lambda rank: pinned  # noqa: E731
        # the rendezvous lives on rank 0's node: a task scheduled as rank 0 is picks the port there
        first = place(0)
        addr, port = ray.get(ray.remote(num_cpus=0)(free_port).options(**first).remote()) if first else free_port()
        remote = ray.remote(num_cpus=0, num_gpus=gpus)(worker_cls)
        self.workers = [
            remote.options(**place(rank)).remote(
                rank,
                ranks,
                addr,
                port,
                actor,
                model_path,
                seed=train.seed,
                total_steps=total_steps,
                num_threads=num_threads,
                **options,
            )
            for rank in range(ranks)
        ]

    def train_step(
        self, exp: Experience, pad_id: int, algo: AlgoConfig | None = None, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step over ``exp`` spread over the ranks (``algo``: the RL loss; None: SFT); returns the
        loss, grad norm and learning rate, and the loss's metrics averaged over the window's tokens."""
        plan, per_rank = self._spread(exp, pad_id)
        window = loss_window(exp, "token-mean" if algo is None else self.actor.loss_agg_mode)
        results = self.call("train_step", per_rank, window=window, algo=algo, temperature=temperature)
        results = results[:: self.peers]  # one report per data-parallel group (its TP/CP ranks computed the same)
        tokens = sum(r["tokens"] for r in results)
        out = {
            "loss": sum(r["loss"] for r in results),
            "grad_norm": results[0]["grad_norm"],
            "lr": results[0]["lr"],
            "train/micro_batches": float(len(plan[0])),
            "train/tokens": float(tokens),
        }
        for key in results[0]["weighted"]:
            out[key] = sum(r["weighted"].get(key, 0.0) for r in results) / max(tokens, 1)
        counts = [r["routing"] for r in results if r.get("routing")]
        recorded = sum(c[1] for c in counts)
        if recorded:  # (token, MoE layer) decisions where the trainer's top-k set is not the rollout's
            out["train/routing_mismatch_frac"] = sum(c[0] for c in counts) / recorded
        return out

    def logprobs(self, exp: Experience, pad_id: int, temperature: float) -> torch.Tensor:
        """Forward-only log-probs of every row, (N, L-1), computed across the ranks."""
        return self.per_token("logprobs", exp, pad_id, temperature=temperature)

    def per_token(self, method: str, exp: Experience, pad_id: int, **same: Any) -> torch.Tensor:
        """A forward-only per-position ``method`` of the ranks (``logprobs``, the critic's ``values``) over every
        row of ``exp``, (N, L-1); one answer per data-parallel group is read (its TP ranks computed the same)."""
        plan, per_rank = self._spread(exp, pad_id)
        outputs = self.call(method, per_rank, **same)[:: self.peers]
        result = torch.zeros(exp.action_mask.shape)
        for micros, outs in zip(plan, outputs, strict=True):
            for rows, out in zip(micros, outs, strict=True):
                if rows:
                    result[torch.tensor(rows), : out.shape[1]] = out
        return result

    def _spread(self, exp: Experience, pad_id: int) -> tuple[list[list[list[int]]], list[list[dict[str, Any]]]]:
        """``spread`` over the data-parallel groups; rank r reads group ``r // tp``'s micro-batches."""
        plan, per_group = spread(exp, pad_id, len(self.workers) // self.peers, self.train)
        return plan, [per_group[rank // self.peers] for rank in range(len(self.workers))]

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


def spread(
    exp: Experience, pad_id: int, ranks: int, train: TrainConfig
) -> tuple[list[list[list[int]]], list[list[dict[str, Any]]]]:
    """``exp``'s rows planned over ``ranks`` (``plan[rank][micro]`` row lists, within ``--train.micro_batch_size``
    and ``--train.max_tokens_per_gpu``) and the micro-batches of that plan, per rank."""
    plan = plan_micro_batches(exp.lengths.tolist(), ranks, train.micro_batch_size, train.max_tokens_per_gpu)
    return plan, [[micro_batch(exp, rows, pad_id) for rows in micros] for micros in plan]


def loss_window(exp: Experience, loss_agg_mode: str) -> dict[str, Any]:
    """The denominators of one optimizer step over ``exp``, which every micro-batch's loss divides by: its action
    tokens, and for the grouped ``--actor.loss_agg_mode``s the action tokens of each unit (rollout or prompt)."""
    mask = exp.action_mask
    window: dict[str, Any] = {"num_tokens": int(mask.sum())}
    if loss_agg_mode != "token-mean":
        units = exp.rollout_ids if loss_agg_mode == "seq-mean-token-mean" else exp.group_ids
        counts: dict[str, int] = {}
        for unit, n in zip(units, mask.sum(1).tolist(), strict=True):
            counts[unit] = counts.get(unit, 0) + int(n)
        window.update(unit_tokens=counts, num_units=sum(1 for n in counts.values() if n > 0))
    return window
