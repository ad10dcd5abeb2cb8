"""``plan_placement``: the whole topology of an RL run from its flags and the cluster's size, as a pure value."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from molt_train.config import parse
from molt_train.placement import COLOCATED_GPU_FRACTION, Placement, plan_placement

BASE = ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "out"]
VLLM = ["--rollout.engine", "vllm"]


@pytest.fixture(autouse=True)
def vllm_importable(monkeypatch):
    """The config's import probe sees a vllm module (no code of it runs)."""
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setitem(sys.modules, "vllm", module)


def plan(*flags: str, gpus: float = 0, cpus: int = 8) -> Placement:
    return plan_placement(parse("rl", BASE + list(flags)), cluster_gpus=gpus, host_cpus=cpus)


def test_a_cpu_run_has_no_placement_group_and_overlapped_it_splits_the_cores():
    p = plan("--actor.num_workers", "2", "--no-train.force_sync_mode")
    assert (p.trainer_gpus, p.engine_gpus, p.weight_sync) == (0.0, 0.0, "object_store")
    assert p.bundles == () and p.trainer_bundles == () and p.engine_bundle is None
    # rollout overlaps training (asked for): the rollout actor and the two ranks share 8 cores
    assert (p.rollout_threads, p.trainer_threads, p.reference_threads) == (8 // 3, 8 // 3, 8 // 2)


def test_strictly_on_policy_rollout_and_training_take_turns_with_every_core():
    for p in (plan(), plan("--train.force_sync_mode")):  # on-policy is the default
        assert (p.rollout_threads, p.trainer_threads) == (8, 8)
    assert plan("--actor.num_threads", "3").trainer_threads == 3  # the flag wins


def test_hf_on_a_gpu_cluster_gives_each_rank_a_gpu_or_shares_them_colocated():
    assert (plan(gpus=1).trainer_gpus, plan(gpus=1).engine_gpus) == (1.0, 0.0)
    assert plan("--actor.num_workers", "2", gpus=1).trainer_gpus == 0.0  # too few GPUs: the ranks stay on the CPU
    shared = plan("--train.colocate_all", gpus=1)
    assert shared.trainer_gpus == shared.engine_gpus == COLOCATED_GPU_FRACTION and shared.bundles == ()


def test_vllm_colocated_shares_rank_0s_bundle_and_syncs_by_cuda_ipc():
    p = plan(*VLLM, "--train.colocate_all", "--actor.num_gpus_per_node", "2", gpus=2)
    assert p.bundles == ({"GPU": 1.0}, {"GPU": 1.0}) and p.strategy == "PACK"
    assert p.trainer_bundles == (0, 1) and p.engine_bundle == 0 and p.weight_sync == "cuda_ipc"
    assert p.trainer_gpus == p.engine_gpus == COLOCATED_GPU_FRACTION  # policy + reference + engine fit one GPU


def test_vllm_disaggregated_gets_a_gpu_of_its_own_and_syncs_by_nccl():
    p = plan(*VLLM, gpus=2)
    assert len(p.bundles) == 2 and p.trainer_bundles == (0,) and p.engine_bundle == 1
    assert (p.engine_gpus, p.trainer_gpus, p.weight_sync) == (1.0, COLOCATED_GPU_FRACTION, "nccl")


def test_a_disaggregated_engine_over_tp_x_dp_gpus_takes_one_bundle_of_them_all():
    p = plan(*VLLM, "--vllm.tensor_parallel_size", "2", "--vllm.data_parallel_size", "2", gpus=5)
    assert p.bundles == ({"GPU": 1.0}, {"GPU": 4.0}) and p.engine_bundle == 1 and p.engine_gpus == 4.0
    assert p.weight_sync == "nccl" and p.engine_device_bundles == ()
    with pytest.raises(RuntimeError, match=r"--vllm.tensor_parallel_size 2 x --vllm.data_parallel_size 2 GPUs"):
        plan(*VLLM, "--vllm.tensor_parallel_size", "2", "--vllm.data_parallel_size", "2", gpus=4)


def test_a_colocated_engine_over_two_gpus_uses_both_trainer_ranks_gpus():
    p = plan(
        *VLLM, "--train.colocate_all", "--actor.num_gpus_per_node", "2", "--vllm.tensor_parallel_size", "2", gpus=2
    )
    assert p.bundles == ({"GPU": 1.0}, {"GPU": 1.0}) and p.engine_bundle == 0 and p.weight_sync == "cuda_ipc"
    assert p.engine_device_bundles == (0, 1) and p.engine_gpus == COLOCATED_GPU_FRACTION
    one = plan(*VLLM, "--train.colocate_all", "--actor.num_gpus_per_node", "2", gpus=2)
    assert one.engine_device_bundles == ()  # a one-GPU engine stays on rank 0's GPU


def test_a_cluster_short_of_gpus_is_refused_naming_the_flags():
    with pytest.raises(RuntimeError, match=r"2 GPUs, but the Ray cluster has 1; add --train.colocate_all"):
        plan(*VLLM, gpus=1)
    with pytest.raises(RuntimeError, match="--rollout.engine vllm needs a GPU, and the Ray cluster has none"):
        plan(*VLLM, "--train.colocate_all", gpus=0)


def test_a_gpu_rollout_worker_goes_where_its_gpu_share_is():
    from molt_train.placement import rollout_options

    assert rollout_options(None, plan("--train.colocate_all", gpus=1), 0) == {}  # spread on the CPU: test_multinode


def test_several_rollout_workers_need_the_hf_engine(capsys):
    with pytest.raises(SystemExit):
        parse("rl", BASE + VLLM + ["--rollout.num_workers", "2", "--train.colocate_all"])
    assert "--rollout.num_workers 2 needs --rollout.engine hf" in capsys.readouterr().err


def test_rendezvous_ports_come_from_below_the_ephemeral_range_whatever_the_seed():
    """A process group's port is drawn above Ray's worker ports and below the kernel's ephemeral range (where
    outgoing connections take their local ports: the CI's EADDRINUSE), and not from ``random``, which ranks seed
    alike."""
    import random
    import socket

    from molt_train.policy_worker import free_port

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    ports = set()
    for _ in range(5):
        random.seed(0)
        _, port = free_port()
        assert 20000 <= port < ephemeral_low
        with socket.socket() as s:
            s.bind(("", port))  # free when handed out
        ports.add(port)
    assert len(ports) > 1
