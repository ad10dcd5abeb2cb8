"""The CPU-checkable parts of the vLLM path: option mapping, pinned sampling, log-prob extraction, weight buckets,
the optional import, and the actor backends. The engine itself runs in test_gpu_vllm.py (H200)."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import subprocess
import sys

import pytest
import torch

from molt_envs import SamplingParams
from molt_train.actor_backend import freeze_router, load_policy_model
from molt_train.config import RLConfig, VLLMConfig, parse
from molt_train.config.flags import flags as flag_list
from molt_train.engines.vllm import (
    VLLMEngine,
    broadcast_plan,
    engine_kwargs,
    sampled_logprobs,
    sampling_kwargs,
)
from molt_train.engines.weight_buckets import ALIGN, TensorMeta, pack, plan_buckets, share, unpack


def test_importing_the_engine_module_does_not_import_vllm():
    code = "import sys, molt_train.engines.vllm, molt_train.engines.vllm_worker; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_engine_without_vllm_names_the_fix():
    if _has_vllm():
        pytest.skip("vllm is installed here")
    with pytest.raises(ImportError, match="--rollout.engine vllm needs vLLM"):
        VLLMEngine("/nonexistent", VLLMConfig())


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def test_engine_kwargs_pin_logprob_mode_worker_extension_and_generation_config():
    kw = engine_kwargs(VLLMConfig(), "/m")
    assert kw["model"] == "/m" and kw["dtype"] == "bfloat16"
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert kw["worker_extension_cls"] == "molt_train.engines.vllm_worker.WeightSyncExtension"
    assert kw["generation_config"] == "vllm"
    assert kw["gpu_memory_utilization"] == 0.35 and kw["enable_sleep_mode"] is False
    assert "speculative_config" not in kw and "max_num_batched_tokens" not in kw


def test_engine_kwargs_pass_scaling_knobs_through():
    kw = engine_kwargs(
        VLLMConfig(
            tensor_parallel_size=2,
            data_parallel_size=4,
            enforce_eager=True,
            max_num_batched_tokens=32768,
            mtp_num_speculative_tokens=1,
            enable_sleep=True,
            dtype="float16",
        ),
        "/m",
        seed=3,
    )
    assert (kw["tensor_parallel_size"], kw["data_parallel_size"]) == (2, 4)
    assert kw["enforce_eager"] is True and kw["max_num_batched_tokens"] == 32768 and kw["dtype"] == "float16"
    assert kw["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
    assert kw["enable_sleep_mode"] is True and kw["seed"] == 3
    # TP: vLLM's own worker processes (in a Ray placement group it would otherwise pick its Ray executor)
    assert kw["distributed_executor_backend"] == "mp" and "enable_expert_parallel" not in kw
    moe = engine_kwargs(VLLMConfig(tensor_parallel_size=2, enable_expert_parallel=True), "/m")
    assert moe["enable_expert_parallel"] is True
    assert "distributed_executor_backend" not in engine_kwargs(VLLMConfig(data_parallel_size=2), "/m")


def test_cuda_graphs_cover_a_full_decode_batch_above_vllms_512_default():
    assert engine_kwargs(VLLMConfig(max_num_seqs=1024), "/m")["compilation_config"] == {
        "max_cudagraph_capture_size": 1024
    }
    assert "compilation_config" not in engine_kwargs(VLLMConfig(max_num_seqs=256), "/m")  # vLLM's default covers it
    assert "compilation_config" not in engine_kwargs(VLLMConfig(max_num_seqs=1024, enforce_eager=True), "/m")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--vllm.tensor_parallel_size", "0"], "tensor_parallel_size must be >= 1"),
        (["--rollout.engine", "vllm", "--vllm.gpu_memory_utilization", "1.5"], "gpu_memory_utilization must be in"),
        (
            ["--rollout.engine", "vllm", "--vllm.mtp_num_speculative_tokens", "1", "--vllm.enable_prefix_caching"],
            "cannot be combined",
        ),
        (["--vllm.dtype", "fp8"], "--vllm.dtype 'fp8' is unknown; choose one of"),
    ],
)
def test_bad_options_are_refused_naming_the_flag(flags, message, capsys):
    with pytest.raises(SystemExit):
        parse("rl", ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "o", *flags])
    assert message in capsys.readouterr().err


def test_every_option_is_a_vllm_flag_with_its_default_and_help():
    rl = {f.name: f for f in flag_list(RLConfig, "rl")}
    defaults = VLLMConfig()
    for field in dataclasses.fields(VLLMConfig):
        flag = rl[f"vllm.{field.name}"]
        assert flag.default == getattr(defaults, field.name) and flag.help, field.name
    assert defaults.bucket_bytes == defaults.bucket_mb << 20


def test_sampling_kwargs_pin_the_whole_set():
    kw = sampling_kwargs(
        SamplingParams(temperature=0.7, top_p=0.9, top_k=-1, max_tokens=12, min_tokens=2, seed=5),
        default_stop_ids=[7, 9],
    )
    assert kw["stop_token_ids"] == [7, 9] and kw["ignore_eos"] is True
    assert kw["top_k"] == 0 and kw["min_p"] == 0.0 and kw["repetition_penalty"] == 1.0
    assert kw["presence_penalty"] == 0.0 and kw["frequency_penalty"] == 0.0
    assert (kw["temperature"], kw["top_p"], kw["max_tokens"], kw["min_tokens"], kw["seed"]) == (0.7, 0.9, 12, 2, 5)
    assert kw["logprobs"] == 0 and kw["detokenize"] is False and kw["n"] == 1
    assert sampling_kwargs(SamplingParams(stop_token_ids=[], top_k=40), [7])["stop_token_ids"] == []
    assert sampling_kwargs(SamplingParams(top_k=40), [7])["top_k"] == 40


class _Logprob:
    def __init__(self, value: float) -> None:
        self.logprob = value


def test_sampled_logprobs_from_flat_and_dict_layouts():
    flat = _Flat(start_indices=[0, 1], end_indices=[1, 3], token_ids=[5, 8, 6], logprobs=[-0.5, -2.0, -1.25])
    assert sampled_logprobs(flat, [5, 6]) == [-0.5, -1.25]
    assert sampled_logprobs([{5: _Logprob(-0.5)}, {6: _Logprob(-1.0), 2: _Logprob(-3.0)}], [5, 6]) == [-0.5, -1.0]
    with pytest.raises(RuntimeError, match="2 log-prob positions for 3 tokens"):
        sampled_logprobs([{5: _Logprob(-0.5)}, {6: _Logprob(-1.0)}], [5, 6, 7])
    with pytest.raises(RuntimeError, match="no log-prob for sampled token 9"):
        sampled_logprobs(flat, [5, 9])


class _Flat:  # vLLM's FlatLogprobs layout
    def __init__(self, **fields: list) -> None:
        self.__dict__.update(fields)

    def __len__(self) -> int:
        return len(self.start_indices)


def _named() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(3, 5, generator=g)),
        ("b.weight", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("c.index", torch.arange(11, dtype=torch.int64)),
        ("d.big", torch.randn(64, 64, generator=g)),  # 16 KiB: larger than the bucket below
        ("e.tail", torch.randn(2, 2, generator=g).to(torch.float16)),
    ]


def test_pack_then_unpack_gives_back_every_tensor_bitwise():
    named = _named()
    buckets = list(pack(named, bucket_bytes=4096))
    got = [(n, t) for b in buckets for n, t in unpack(b.buffer, b.metas)]
    assert [n for n, _ in got] == [n for n, _ in named]
    for (_, want), (_, have) in zip(named, got, strict=True):
        assert have.dtype == want.dtype and have.shape == want.shape
        assert torch.equal(
            have.view(torch.uint8) if have.dim() else have, want.view(torch.uint8) if want.dim() else want
        )


def test_buckets_respect_the_size_limit_and_alignment():
    plan = plan_buckets(_named(), bucket_bytes=4096)
    assert [[m.name for m, _ in b] for b in plan] == [["a.weight", "b.weight", "c.index"], ["d.big"], ["e.tail"]]
    for bucket in plan:
        assert all(m.offset % ALIGN == 0 for m, _ in bucket)
        last = bucket[-1][0]
        assert last.offset + last.nbytes <= 4096 or len(bucket) == 1  # only a lone oversized tensor exceeds it
    assert sum(b.nbytes for b in pack(_named(), 4096)) == sum(t.numel() * t.element_size() for _, t in _named())
    with pytest.raises(ValueError, match="bucket_bytes must be at least"):
        plan_buckets(_named(), bucket_bytes=16)


def test_unpack_refuses_metadata_of_another_bucket():
    bucket = next(pack(_named()[:1], 4096))
    with pytest.raises(ValueError, match="past the bucket"):
        unpack(bucket.buffer, [TensorMeta("x", "float32", (100,), 0, 400)])


def test_broadcast_plan_carries_the_metadata_the_worker_unpacks():
    named = _named()
    plan = broadcast_plan(named, 4096)
    assert [size for _, size in plan] == [b.buffer.numel() for b in pack(named, 4096)]
    metas = [TensorMeta.from_tuple(m) for blob, _ in plan for m in pickle.loads(blob)]
    assert [m.name for m in metas] == [n for n, _ in named]
    assert metas[1] == TensorMeta("b.weight", "bfloat16", (7,), metas[1].offset, 14)


def test_cpu_buckets_cannot_be_shared_by_cuda_ipc():
    with pytest.raises(ValueError, match="only CUDA buckets"):
        share(next(pack(_named(), 4096)))


def test_actor_backend_errors_name_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="unknown --actor.backend 'megatron'"):
        load_policy_model("megatron", "/m")
    monkeypatch.setitem(sys.modules, "nemo_automodel", None)  # not importable, whatever is installed
    with pytest.raises(ImportError, match="--actor.backend automodel needs NVIDIA NeMo AutoModel"):
        load_policy_model("automodel", "/m")


def test_freeze_router_freezes_only_router_weights():
    model = torch.nn.Module()
    model.mlp = torch.nn.Module()
    model.mlp.gate = torch.nn.Linear(4, 2, bias=False)  # MoE router
    model.mlp.gate_proj = torch.nn.Linear(4, 4)  # dense MLP projection: must keep training
    assert freeze_router(model) == ["mlp.gate.weight"]
    assert not model.mlp.gate.weight.requires_grad and model.mlp.gate_proj.weight.requires_grad
    dense = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no MoE router parameters"):
        freeze_router(dense)


def test_every_data_parallel_replica_answers_a_worker_rpc():
    """vLLM's data-parallel client sends a utility call to every engine core but returns core 0's answers only;
    ``_all_workers`` asks each core itself so an RPC's answers (e.g. the weight check's) cover every replica. The
    client here is a stand-in for vLLM's (pure dispatch logic)."""
    from molt_train.engines.vllm import _all_workers

    class Core:
        core_engines = [b"\x00\x00", b"\x01\x00"]
        asked: list = []

        async def _call_utility_async(self, method, *args, engine):
            self.asked.append((method, args, engine))
            return [f"{engine.hex()}-worker{w}" for w in range(2)]  # TP=2 workers per replica

    class LLM:
        engine_core = Core()

        async def collective_rpc(self, method, args=()):
            return ["core0-only"]

    answers = asyncio.run(_all_workers(LLM(), "molt_end_check", (1,)))
    assert answers == ["0000-worker0", "0000-worker1", "0100-worker0", "0100-worker1"]
    assert [a[0] for a in Core.asked] == ["collective_rpc"] * 2
    assert Core.asked[0][1] == ("molt_end_check", None, (1,), None)  # method, timeout, args, kwargs
    LLM.engine_core.core_engines = [b"\x00\x00"]  # one replica: vLLM's own path
    assert asyncio.run(_all_workers(LLM(), "m", ())) == ["core0-only"]


def test_no_compile_keeps_full_decode_graphs_and_drops_dynamo():
    kw = engine_kwargs(VLLMConfig(compile=False), "/m")
    assert kw["compilation_config"] == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"} and not kw["enforce_eager"]
    big = engine_kwargs(VLLMConfig(compile=False, max_num_seqs=1024), "/m")["compilation_config"]
    assert big == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "max_cudagraph_capture_size": 1024}
