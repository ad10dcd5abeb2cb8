"""The GPU path's flags on the CPU: ``--rollout.engine vllm``, ``--train.colocate_all``, ``--train.partial_rollout_enable``,
``--train.check_weight_update_equal``, ``--actor.backend``: what parses, what is refused (naming the flags), the
clear errors when vLLM / NeMo AutoModel are not importable, and the rollout worker's weight check and whole-batch
sync on a real tiny model."""

from __future__ import annotations

import asyncio
import importlib.machinery
import pickle
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from molt_train.config import parse
from molt_train.engines.vllm import engine_kwargs

BASE = ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "out"]
VLLM = [
    "--rollout.engine",
    "vllm",
    "--train.colocate_all",
    "--vllm.gpu_memory_utilization",
    "0.35",
    "--rollout.n_samples_per_prompt",
    "8",
    "--algo.advantage.estimator",
    "grpo",
]
AGENTS = Path(__file__).parent / "agents"


def importable(monkeypatch, name: str) -> None:
    """Make ``name`` look installed to the config's import probe (no module code is ever run)."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    monkeypatch.setitem(sys.modules, name, module)


def missing(monkeypatch, name: str) -> None:
    monkeypatch.setitem(sys.modules, name, None)  # not importable, whatever is installed


def test_the_issue_command_line_parses_into_engine_options(monkeypatch):
    importable(monkeypatch, "vllm")
    cfg = parse(
        "rl",
        BASE
        + VLLM
        + [
            "--vllm.enforce_eager",
            "--vllm.max_num_seqs",
            "64",
            "--train.check_weight_update_equal",
            "--train.seed",
            "7",
        ],
    )
    assert cfg.rollout.engine == "vllm" and cfg.train.colocate_all and cfg.train.check_weight_update_equal
    assert cfg.train.partial_rollout_enable is False and cfg.actor.backend == "hf"
    options = cfg.vllm
    assert options.gpu_memory_utilization == 0.35 and options.enforce_eager and options.max_num_seqs == 64
    kwargs = engine_kwargs(options, "m", cfg.train.seed)  # what the rollout actor starts vLLM with
    assert kwargs["seed"] == 7 and kwargs["max_model_len"] == cfg.data.max_len  # sized to the run, seeded by it


def test_defaults_keep_the_cpu_path():
    cfg = parse("rl", BASE)
    assert cfg.rollout.engine == "hf" and cfg.actor.backend == "hf"
    assert not (cfg.train.colocate_all or cfg.train.partial_rollout_enable or cfg.train.check_weight_update_equal)


def test_partial_rollout_with_is_correction_is_accepted(monkeypatch):
    importable(monkeypatch, "vllm")
    cfg = parse(
        "rl",
        BASE
        + VLLM
        + [
            "--train.partial_rollout_enable",
            "--algo.advantage.is_correction_level",
            "token",
            "--algo.advantage.is_correction_mode",
            "trunc",
        ],
    )
    assert cfg.train.partial_rollout_enable


def test_disaggregated_placement_parses(monkeypatch):
    """Issue 8's command line: vLLM on a GPU of its own, two trainer GPUs (one FSDP2 rank each), NCCL sync."""
    importable(monkeypatch, "vllm")
    cfg = parse(
        "rl",
        BASE
        + VLLM[:2]
        + VLLM[3:]
        + [
            "--vllm.num_engines",
            "1",
            "--actor.num_gpus_per_node",
            "2",
            "--train.async_queue_size",
            "2",
            "--algo.advantage.is_correction_level",
            "token",
        ],
    )
    assert not cfg.train.colocate_all and cfg.actor.num_workers == 2 and cfg.vllm.num_engines == 1
    two_way = parse("rl", BASE + VLLM + ["--actor.num_gpus_per_node", "2"])  # 2-way FSDP2, vLLM on rank 0's GPU
    assert two_way.train.colocate_all and two_way.actor.num_workers == 2


def test_engines_sharing_the_colocated_gpu_parse(monkeypatch):
    """Two engine processes on the trainer's GPU, the memory fraction split between them."""
    importable(monkeypatch, "vllm")
    options = parse("rl", BASE + VLLM + ["--vllm.num_engines", "2"]).vllm
    assert options.num_engines == 2 and engine_kwargs(options, "m")["gpu_memory_utilization"] == 0.175


REFUSED = [
    (VLLM + ["--vllm.tensor_parallel_size", "2"], "= 2 GPUs, but --actor.num_workers is 1"),
    (
        VLLM + ["--vllm.data_parallel_size", "2", "--vllm.num_engines", "2", "--actor.num_gpus_per_node", "2"],
        "x --vllm.data_parallel_size 2 GPUs takes --vllm.num_engines 1",
    ),
    (VLLM + ["--vllm.enable_expert_parallel"], "here 1 x 1: raise --vllm.tensor_parallel_size"),
    (VLLM[:2] + ["--vllm.num_engines", "2"], "--vllm.num_engines 2 puts that many engines on the one GPU"),
    (VLLM[:2] + ["--vllm.enable_sleep", "--train.force_sync_mode"], "on a GPU of its own"),
    (["--actor.num_gpus_per_node", "2", "--actor.num_workers", "3"], "contradicts --actor.num_workers 3"),
    (VLLM + ["--vllm.gpu_memory_utilization", "1.5"], "--vllm.gpu_memory_utilization must be in (0, 1]"),
    (VLLM + ["--vllm.max_model_len", "512"], "--vllm.max_model_len 512 is shorter than --data.max_len 1024"),
    (VLLM + ["--vllm.enable_sleep", "--no-train.force_sync_mode"], "add --train.force_sync_mode"),
    (VLLM + ["--train.partial_rollout_enable"], "--train.partial_rollout_enable=True) trains on off-policy"),
    (
        VLLM
        + ["--train.partial_rollout_enable", "--train.force_sync_mode", "--algo.advantage.is_correction_level", "geo"],
        "--train.force_sync_mode forbids",
    ),
    (["--train.partial_rollout_enable", "--algo.advantage.is_correction_level", "geo"], "add --rollout.engine vllm"),
    (["--rollout.engine", "sglang"], "--rollout.engine 'sglang' is unknown"),
    (["--actor.backend", "megatron"], "--actor.backend 'megatron' is unknown"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSED)
def test_refused_combinations_name_the_flags(extra, message, monkeypatch, capsys):
    importable(monkeypatch, "vllm")
    with pytest.raises(SystemExit) as exc:
        parse("rl", BASE + extra)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_vllm_not_importable_is_a_clear_error(monkeypatch, capsys):
    missing(monkeypatch, "vllm")
    with pytest.raises(SystemExit):
        parse("rl", BASE + VLLM)
    err = capsys.readouterr().err
    assert "--rollout.engine vllm needs vLLM" in err and "pip install vllm" in err and "not importable" in err


@pytest.mark.parametrize("command", ["rl", "sft"])
def test_automodel_not_importable_is_a_clear_error(command, monkeypatch, capsys):
    missing(monkeypatch, "nemo_automodel")
    with pytest.raises(SystemExit):
        parse(command, BASE + ["--actor.backend", "automodel"])
    err = capsys.readouterr().err
    assert "--actor.backend automodel needs NVIDIA NeMo AutoModel" in err and "pip install nemo-automodel" in err


def test_automodel_when_importable_reaches_the_worker_config(monkeypatch):
    importable(monkeypatch, "nemo_automodel")
    cfg = parse("rl", BASE + ["--actor.backend", "automodel", "--actor.freeze_moe_router"])
    actor = pickle.loads(pickle.dumps(cfg.actor))  # the object each PolicyWorker rank receives through Ray
    assert actor.backend == "automodel" and actor.freeze_moe_router is True


# -- the rollout worker on a real tiny model (hf engine) --


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    tok = train_tokenizer([f"{a}+{b}={a + b}" for a in range(30) for b in range(30)], vocab_size=300)
    return str(save_tiny(build_tiny_model(tok, hidden_size=32), tok, tmp_path_factory.mktemp("tiny")))


def worker(path: str):
    from molt_train.rollout import RolloutWorker

    w = RolloutWorker(
        path, env_id=None, agent_path=str(AGENTS / "segmented_arith.py"), max_len=64, timeout_s=60, max_batch_size=64
    )
    w.set_prompts(
        [{"prompt": [{"role": "user", "content": f"{i}+1="}], "label": str(i + 1)} for i in range(4)],
        batch_size=4,
        seed=0,
    )
    return w


async def test_weight_check_passes_after_a_sync_and_names_what_it_did_not_reach(tiny_path):
    from molt_train.rollout import compare_weights

    w = worker(tiny_path)
    new = {k: v + 0.5 for k, v in w.weights().items()}
    timing = await w.update_weights(new, check=True)
    assert timing["weight_sync/checked_params"] == len(new)
    assert all(torch.equal(w.weights()[k], v) for k, v in new.items())
    name = sorted(new)[0]
    assert compare_weights(dict(w.engine.model.named_parameters()), {**new, name: new[name] + 1}) == [f"stale: {name}"]
    partial = {k: v for k, v in new.items() if k != name}
    with pytest.raises(RuntimeError, match=rf"check_weight_update_equal: .*1 engine parameters .*uncovered: {name}"):
        await w.update_weights(partial, check=True)


async def test_without_partial_rollout_a_sync_waits_for_the_batch_in_flight(tiny_path):
    w = worker(tiny_path)
    w.whole_batches = True  # what the vllm engine without --train.partial_rollout_enable runs with
    params = {"temperature": 1.0, "max_tokens": 24}
    rollout = asyncio.create_task(w.generate_step(0, params, n_samples=8, seed=0))
    while not (w._batch_lock and w._batch_lock.locked()) and not rollout.done():
        await asyncio.sleep(0.001)
    await w.update_weights(w.weights())
    synced = time.time()
    batch = await rollout
    assert batch["end"] <= synced  # the sync ran only once the whole batch was done


def test_no_vllm_compile_is_refused_beside_enforce_eager_and_reaches_the_engine(monkeypatch, capsys):
    importable(monkeypatch, "vllm")
    with pytest.raises(SystemExit) as exc:
        parse("rl", BASE + VLLM + ["--vllm.enforce_eager", "--no-vllm.compile"])
    assert exc.value.code == 2 and "--vllm.compile False has no effect" in capsys.readouterr().err
    cfg = parse("rl", BASE + VLLM + ["--no-vllm.compile"])
    assert engine_kwargs(cfg.vllm, "m")["compilation_config"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
