"""Where an RL run's actors go: ``plan_placement`` turns the config and the cluster's size into one ``Placement``.

The decision, in one place:

- ``--rollout.engine hf`` (the CPU default): no placement group. Trainer ranks take a whole GPU each when the cluster
  has enough (else they run on the CPU); the rollout actor takes none. With ``--train.colocate_all`` on a GPU
  cluster, the ranks, the reference and the rollout actor share the GPUs as fractions of them. Weights travel as a
  state dict through Ray's object store.
- ``--rollout.engine vllm --train.colocate_all``: a placement group of one-GPU bundles, bundle i holding trainer rank
  i (and its reference rank); the engine shares bundle 0 with rank 0, so trainer and engine sync by CUDA IPC.
- ``--rollout.engine vllm`` alone (disaggregated): one more bundle, a GPU of the engine's own; rank 0 broadcasts the
  weights to it over NCCL.
- An engine over ``--vllm.tensor_parallel_size`` x ``--vllm.data_parallel_size`` = S GPUs: disaggregated, its bundle
  holds S GPUs (the rollout actor takes them all; vLLM's worker processes split them); colocated, its workers use
  the GPUs of bundles 0..S-1 (``engine_device_bundles``: trainer ranks 0..S-1's), the actor itself sitting in
  bundle 0, and each of those ranks shares the weights from its own GPU.

Actors that share a GPU take ``COLOCATED_GPU_FRACTION`` of it each. CPU threads are split between the processes that
compute at the same time (rollout and training overlap unless the run is on-policy, ``TrainConfig.on_policy``).

Over several nodes (``--ray.address``): every trainer rank has a bundle of its own, so a rank always packs with its
GPU, and the bundles are ``PACK``ed (one node while it has room, more when it has not); CPU trainer ranks stay on
the driver's node, next to ``--ckpt.output_dir``. The rendezvous of a group is hosted on its rank 0's node
(``worker_group.WorkerGroup``). CPU rollout actors (``--rollout.num_workers``) are spread round-robin over the alive
nodes (``spread``), as the sandbox ``ray`` provider spreads its actors; a node lost mid-run costs its episodes (``RLTrainer``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from molt_train.runtime import cpu_threads

if TYPE_CHECKING:
    from molt_train.config.commands import RLConfig

COLOCATED_GPU_FRACTION = 0.25  # policy, reference and rollout actors on one GPU: at most 3 x 0.25
PLACEMENT_TIMEOUT_S = 120


@dataclass(frozen=True)
class Placement:
    """The topology of one RL run (pure data: computed, compared, logged; ``reserve`` makes it real).

    trainer_gpus: each policy (and reference) rank's share of a GPU; 0 = on the CPU.
    engine_gpus: the rollout actor's share of a GPU (disaggregated: its engine's TP x DP GPUs); 0 = on the CPU.
    bundles: the placement group's bundles, () for none; ``strategy`` how Ray places them.
    trainer_bundles: the bundle of each trainer rank (rank i -> ``trainer_bundles[i]``), () without a group.
    engine_bundle: the rollout actor's bundle, None without a group.
    engine_device_bundles: colocated, an engine of several GPUs: the bundles whose GPUs its workers use (in
        order), () otherwise; their trainer ranks each share the weights with the worker on their GPU.
    reference_gpus / reference_bundles: the same for the reference ranks: the trainer's own with
        ``--train.colocate_fsdp_models`` (the default), GPUs (bundles) of their own without it.
    weight_sync: "object_store" (the hf engine: a CPU state dict), "cuda_ipc" (vllm on rank 0's GPU) or "nccl"
        (vllm on a GPU of its own, rank 0 broadcasts).
    rollout_threads / trainer_threads / reference_threads: torch CPU threads of each process.
    """

    trainer_gpus: float
    engine_gpus: float
    weight_sync: str
    rollout_threads: int
    trainer_threads: int
    reference_threads: int
    bundles: tuple[dict[str, float], ...] = ()
    strategy: str = "PACK"
    trainer_bundles: tuple[int, ...] = ()
    engine_bundle: int | None = None
    reference_gpus: float = 0.0  # each reference rank's share of a GPU (= trainer_gpus when colocated)
    reference_bundles: tuple[int, ...] = ()  # the bundle of each reference rank (the trainer's when colocated)
    engine_device_bundles: tuple[int, ...] = ()


def plan_placement(cfg: RLConfig, cluster_gpus: float, host_cpus: int) -> Placement:
    """The placement of ``cfg``'s actors on a cluster with ``cluster_gpus`` GPUs and ``host_cpus`` cores per host.

    Raises:
        RuntimeError: the cluster cannot hold it; the message names the flags to change.
    """
    engine, ranks = cfg.rollout.engine, cfg.actor.num_workers
    if engine == "vllm" and cluster_gpus <= 0:
        raise RuntimeError(
            "--rollout.engine vllm needs a GPU, and the Ray cluster has none; use --rollout.engine hf or run on a "
            "GPU machine"
        )
    colocated = cfg.train.colocate_all and cluster_gpus > 0
    nccl = engine == "vllm" and not colocated
    # a rank shares its GPU with the other group (and, colocated, with the engine); an engine of its own takes a
    # whole GPU; the hf engine without --train.colocate_all runs on the CPU
    share = COLOCATED_GPU_FRACTION if colocated or nccl else 1.0
    trainer_gpus = share if cluster_gpus >= ranks * share else 0.0
    span = cfg.vllm.gpus_per_engine if engine == "vllm" else 1
    engine_gpus = COLOCATED_GPU_FRACTION if colocated else (float(span) if nccl else 0.0)
    overlap = 0 if cfg.train.on_policy else 1  # rollout overlaps training: they split the cores

    def threads(concurrent: int) -> int:
        return cpu_threads(cfg.actor.num_threads, concurrent, host_cpus)

    plan: dict[str, Any] = {
        "trainer_gpus": trainer_gpus,
        "engine_gpus": engine_gpus,
        "weight_sync": "nccl" if nccl else ("cuda_ipc" if engine == "vllm" else "object_store"),
        "rollout_threads": threads(1 + overlap * ranks),
        "trainer_threads": threads(ranks + overlap),
        "reference_threads": threads(ranks),
    }
    # --no-train.colocate_fsdp_models: the reference ranks on GPUs of their own (only a GPU run has any to give)
    separate = not cfg.train.colocate_fsdp_models and cfg.algo.kl.init_coef > 0 and cfg.algo.kl.ref == "model"
    separate = separate and trainer_gpus > 0
    if engine != "vllm":
        if separate and cluster_gpus < 2 * ranks:
            raise RuntimeError(
                f"--no-train.colocate_fsdp_models gives the reference ranks GPUs of their own: {2 * ranks} GPUs for "
                f"{ranks} policy + {ranks} reference ranks, but the Ray cluster has {cluster_gpus:g}; drop "
                "--no-train.colocate_fsdp_models or use fewer trainer ranks"
            )
        return Placement(**plan, reference_gpus=1.0 if separate else trainer_gpus)
    refs = ranks if separate else 0
    bundles = ({"GPU": 1.0},) * (ranks + refs) + (({"GPU": float(span)},) if nccl else ())
    needed = ranks + refs + (span if nccl else 0)
    if cluster_gpus < needed:
        tp, dp = cfg.vllm.tensor_parallel_size, cfg.vllm.data_parallel_size
        raise RuntimeError(
            f"--rollout.engine vllm puts each of the --actor.num_workers {ranks} trainer ranks on a GPU of its own, "
            f"and the engine's --vllm.tensor_parallel_size {tp} x --vllm.data_parallel_size {dp} GPUs too unless "
            f"--train.colocate_all (and the reference ranks with --no-train.colocate_fsdp_models): {needed} GPUs, "
            f"but the Ray cluster has {cluster_gpus:g}; add --train.colocate_all or use fewer trainer ranks or a "
            "smaller engine"
        )
    if colocated and span > ranks:  # the config refuses it; a Placement never names bundles it lacks
        raise RuntimeError(f"a colocated engine of {span} GPUs needs {span} trainer ranks' GPUs, got {ranks}")
    return Placement(
        **plan,
        bundles=bundles,
        trainer_bundles=tuple(range(ranks)),
        engine_bundle=ranks + refs if nccl else 0,
        reference_gpus=trainer_gpus,
        reference_bundles=tuple(range(ranks, ranks + refs)) if separate else tuple(range(ranks)),
        engine_device_bundles=tuple(range(span)) if colocated and span > 1 else (),
    )


def reserve(placement: Placement) -> Any:
    """The Ray placement group of ``placement`` once its bundles are reserved (None when it has none)."""
    if not placement.bundles:
        return None
    import ray
    from ray.util.placement_group import placement_group

    group = placement_group([dict(b) for b in placement.bundles], strategy=placement.strategy)
    ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    return group


def in_bundle(group: Any, bundle: int | None) -> dict[str, Any]:
    """Ray ``.options(...)`` that schedule an actor or task in ``bundle`` of ``group`` (nothing without a group)."""
    if group is None or bundle is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)}


def bundle_gpu_ids(group: Any, bundles: tuple[int, ...]) -> list[str]:
    """The GPU of each of ``bundles`` (one-GPU bundles of ``group``) as Ray numbers it (``CUDA_VISIBLE_DEVICES``
    entries): a colocated engine of several GPUs shows its worker processes these, in this order."""
    import ray

    probe = ray.remote(num_cpus=0, num_gpus=0.01)(lambda: [str(i) for i in ray.get_gpu_ids()])
    ids = ray.get([probe.options(**in_bundle(group, b)).remote() for b in bundles])
    if any(len(found) != 1 for found in ids):
        raise RuntimeError(f"expected one GPU in each of bundles {bundles}, Ray gave {ids}")
    return [found[0] for found in ids]


def rank_options(group: Any, gpus: float, bundles: tuple[int, ...], rank: int) -> dict[str, Any]:
    """Ray ``.options(...)`` of rank ``rank`` of a trainer group (the policy's, the reference's) whose ranks hold
    ``gpus`` each and sit in ``bundles``: its bundle, or (CPU ranks) the driver's node."""
    if group is not None:
        return in_bundle(group, bundles[rank])
    return on_this_node() if gpus == 0 else {}


def rollout_options(group: Any, placement: Placement, index: int, avoid: tuple[str, ...] = ()) -> dict[str, Any]:
    """Ray ``.options(...)`` of rollout actor ``index``: the engine's bundle, or (CPU engines) a node of its own,
    never one of the ``avoid`` node IDs (a node just lost, which Ray may not have noticed yet)."""
    if group is not None:
        return in_bundle(group, placement.engine_bundle)
    return spread(index, avoid) if placement.engine_gpus == 0 else {}


def spread(index: int, avoid: tuple[str, ...] = ()) -> dict[str, Any]:
    """Ray ``.options(...)`` putting the ``index``-th of several actors on the ``index``-th alive node (the driver's
    first, round-robin). Ray's own ``SPREAD``, and even a soft affinity, left rollout actors created one after the
    other on one node; a node that dies is no longer alive, so an actor re-created later goes to a surviving one."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    alive = sorted(
        sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in avoid),
        key=lambda node: node != here,
    )
    if not alive:
        raise RuntimeError(f"no alive Ray node is left to place an actor on (lost: {', '.join(avoid)})")
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(alive[index % len(alive)], soft=False)}


def on_this_node() -> dict[str, Any]:
    """Ray ``.options(...)`` pinning an actor or task to the calling process's node (it dies with that node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}
