"""MoE routing across rollout and training: the rollout engine records which experts every position went through,
the training forward measures how often its own routers choose otherwise and, with ``--train.routing_replay``
(R3, rollout routing replay), routes each token through the recorded experts instead.

A record is an int16 tensor ``(positions, moe_layers, k)`` of expert ids on the next-token axis: row ``t`` holds
the experts token ``t`` went through in each MoE layer, in the forward whose output predicts token ``t + 1``
(``NO_RECORD`` rows: a position no generation forwarded; it routes live). The hf engine records with forward hooks
on its routers, the vllm engine takes vLLM's ``routed_experts`` (``enable_return_routed_experts``).

``GateReplay`` wraps the forward of each router of the training model (transformers' softmax top-k routers:
Qwen2/3-MoE, OLMoE, Mixtral). Given the records of the tokens of the forward about to run (``set``), each router
counts the (token, layer) decisions whose top-k set differs from the record (``train/routing_mismatch_frac``) and,
replaying, returns the recorded expert ids with weights recomputed from its own probabilities at those experts
(renormalised as the router does), so the router's weights still get gradients.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from molt_train.actor_backend import ROUTER_PATTERN

NO_RECORD = -1
REPLAYABLE = ("Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter", "OlmoeTopKRouter", "MixtralTopKRouter")


def router_modules(model: nn.Module, flag: str) -> list[nn.Module]:
    """The model's MoE routers in layer order: the modules owning the parameters ``--actor.freeze_moe_router``
    freezes (``ROUTER_PATTERN``). A model without any is refused, naming ``flag``."""
    owners = {name.rsplit(".", 1)[0] for name, _ in model.named_parameters() if ROUTER_PATTERN.search(name)}
    routers = [module for name, module in model.named_modules() if name in owners]
    if not routers:
        raise ValueError(
            f"{flag}: the model has no MoE router (no '*.gate.weight' or '*.router.*' parameters), so there is no "
            "routing to record or replay; drop the flag for a dense model"
        )
    return routers


class GateReplay:
    """The routers of ``model`` under the records of the forward running (``set``): mismatch counted, and with
    ``replay`` the recorded experts used."""

    def __init__(self, model: nn.Module, replay: bool, flag: str = "--train.routing_replay") -> None:
        self.routers = router_modules(model, flag)
        unknown = sorted({type(r).__name__ for r in self.routers} - set(REPLAYABLE))
        if unknown:
            raise ValueError(f"{flag}: routers of class {', '.join(unknown)} are not supported (only {REPLAYABLE})")
        self.replay = replay
        self.routes: Tensor | None = None  # (tokens, layers, k) of the forward running, tokens as the routers see
        self._uncounted: set[int] = set()  # layers not yet counted for these records (a recompute is not counted)
        self.differ: Any = 0
        self.decisions: Any = 0
        for i, router in enumerate(self.routers):
            router.forward = self._wrap(i, router, router.forward)

    def set(self, routes: Tensor | None) -> None:
        """The records of the next forward's tokens, ``(rows, positions, layers, k)`` matching its ``input_ids``
        (``NO_RECORD`` where none), or None: route live, count nothing."""
        if routes is not None:
            k = getattr(self.routers[0], "top_k", routes.shape[-1])
            if routes.shape[2] != len(self.routers) or routes.shape[3] != k:
                raise ValueError(
                    f"the routing records are {tuple(routes.shape[2:])} (layers, k) per position, the model has "
                    f"{len(self.routers)} MoE layers of top-{k}: were they recorded on another model?"
                )
            routes = routes.reshape(-1, *routes.shape[2:])
        self.routes = routes
        self._uncounted = set(range(len(self.routers)))

    def take(self) -> tuple[int, int]:
        """(differing, recorded) (token, layer) decisions counted since the last call."""
        counts = int(self.differ), int(self.decisions)
        self.differ = self.decisions = 0
        return counts

    def _wrap(self, layer: int, router: nn.Module, forward: Any) -> Any:
        def routed(hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            logits, weights, chosen = forward(hidden_states)
            if self.routes is None:
                return logits, weights, chosen
            if self.routes.shape[0] != chosen.shape[0]:
                raise RuntimeError(
                    f"MoE layer {layer} routes {chosen.shape[0]} tokens, the records cover {self.routes.shape[0]}"
                )
            recorded = self.routes[:, layer].to(chosen.device, torch.long)
            valid = recorded[:, 0] != NO_RECORD
            if layer in self._uncounted:
                self._uncounted.discard(layer)
                differs = (chosen.sort(-1).values != recorded.sort(-1).values).any(-1) & valid
                self.differ = self.differ + differs.sum()
                self.decisions = self.decisions + valid.sum()
            if not self.replay:
                return logits, weights, chosen
            forced = torch.where(valid[:, None], recorded, chosen)
            forced_weights = torch.softmax(logits.float(), dim=-1).gather(-1, forced)
            if getattr(router, "norm_topk_prob", True):  # Mixtral's router always renormalises
                forced_weights = forced_weights / forced_weights.sum(-1, keepdim=True)
            return logits, forced_weights.to(weights.dtype), forced

        return routed


def input_axis(routing: Tensor) -> Tensor:
    """Records on the next-token axis ``(rows, L-1, ...)`` -> one per input position ``(rows, L, ...)``: the last
    token predicts nothing, so it has no record."""
    return torch.cat([routing, routing.new_full((routing.shape[0], 1, *routing.shape[2:]), NO_RECORD)], dim=1)
