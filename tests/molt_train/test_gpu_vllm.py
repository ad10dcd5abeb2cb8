"""The vLLM engine on a real GPU, colocated with a torch policy on the same device (run on the H200; skipped
without CUDA or vLLM): three GRPO steps with a weight-sync equality check after each, mismatch metrics bounded in
sync mode, the check catching a stale parameter, partial rollout across a sync, and a trainer checkpoint loading
in vLLM (with sleep/wake keeping the weights). The first three also with two engines sharing the GPU
(``--vllm.num_engines 2``): requests dealt to both, every sync, check and pause reaching both."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
vllm = pytest.importorskip("vllm")

from molt_envs import SamplingParams  # noqa: E402
from molt_train.algorithms import (  # noqa: E402
    AdvantageInputs,
    aggregate,
    get_estimator,
    mismatch_metrics,
    ppo_loss,
)
from molt_train.config import VLLMConfig  # noqa: E402
from molt_train.engines.vllm import VLLMEngine  # noqa: E402
from molt_train.logprob_model import LogProbModel  # noqa: E402
from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer  # noqa: E402

TEXTS = [f"what is {a} plus {b}? the answer is {a + b}." for a in range(40) for b in range(40)]


@pytest.fixture(scope="module", params=[1, 2], ids=["one_engine", "two_engines"])
def colocated(request, tmp_path_factory):
    tok = train_tokenizer(TEXTS, vocab_size=1024)
    model = build_tiny_model(tok, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512)
    path = str(save_tiny(model, tok, tmp_path_factory.mktemp("tiny")))
    loop = asyncio.new_event_loop()

    async def start() -> VLLMEngine:
        return VLLMEngine(
            path,
            VLLMConfig(gpu_memory_utilization=0.15, enforce_eager=True, max_model_len=512, num_engines=request.param),
        )

    engine = loop.run_until_complete(start())
    policy = model.cuda()
    yield loop, engine, policy, tok, path
    engine.shutdown()
    pending = asyncio.all_tasks(loop)  # vLLM's output handler: let its cancellation run before the loop closes
    for task in pending:
        task.cancel()

    async def drain():  # gather inside the loop: outside it, gather would bind the futures to another loop
        await asyncio.gather(*pending, return_exceptions=True)

    loop.run_until_complete(drain())
    loop.close()


def weights(policy) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.detach().to(torch.bfloat16)) for n, p in policy.named_parameters()]


def rl_step(loop, engine, policy, tok, optim, step: int) -> dict[str, float]:
    """Generate 4 prompts x 4 samples, recompute log-probs, one GRPO/PPO update, sync; returns mismatch metrics."""
    prompts = [tok.encode(f"what is {a} plus 3?") for a in range(4)]
    rows = [(i, j) for i in range(4) for j in range(4)]

    async def generate():
        return await asyncio.gather(
            *[
                engine.generate(
                    prompts[i], SamplingParams(max_tokens=24, stop_token_ids=[], seed=step * 100 + 10 * i + j)
                )
                for i, j in rows
            ]
        )

    gens = loop.run_until_complete(generate())
    width = max(len(prompts[i]) + len(g.token_ids) for (i, _), g in zip(rows, gens, strict=True))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    rollout = torch.zeros((len(rows), width - 1))
    for r, ((i, _), g) in enumerate(zip(rows, gens, strict=True)):
        seq = prompts[i] + g.token_ids
        ids[r, : len(seq)], attn[r, : len(seq)] = torch.tensor(seq), 1
        mask[r, len(prompts[i]) - 1 : len(seq) - 1] = True
        rollout[r, len(prompts[i]) - 1 : len(seq) - 1] = torch.tensor(g.log_probs)
    ids, attn, mask, rollout = ids.cuda(), attn.cuda(), mask.cuda(), rollout.cuda()
    lp = LogProbModel(policy, chunk_size=256)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logp_old = lp(ids, attn).float()
    metrics = {k: float(v) for k, v in mismatch_metrics(logp_old, rollout, mask).items()}

    rewards = torch.tensor([sum(t % 2 == 0 for t in g.token_ids) / len(g.token_ids) for g in gens]).cuda()
    adv, _ = get_estimator("grpo")(
        AdvantageInputs(rewards, mask, [str(i) for i, _ in rows], [f"{i}:{j}" for i, j in rows])
    )
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logp = lp(ids, attn).float()
    loss_tokens, _ = ppo_loss(logp, logp_old, adv, mask)
    aggregate(loss_tokens, mask).backward()
    optim.step()
    optim.zero_grad()
    moved = loop.run_until_complete(engine.update_weights(weights(policy)))
    assert moved == sum(p.numel() * 2 for p in policy.parameters())
    return metrics


def test_three_colocated_steps_sync_equal_and_mismatch_bounded(colocated):
    loop, engine, policy, tok, _ = colocated
    assert loop.run_until_complete(engine.check_weight_update_equal(weights(policy))) == []
    optim = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    before = {n: t.clone() for n, t in weights(policy)}
    for step in range(3):
        metrics = rl_step(loop, engine, policy, tok, optim, step)
        assert set(metrics) >= {"mismatch/bitwise_frac", "mismatch/abs_diff_mean", "mismatch/k3_kl"}
        assert 0.0 <= metrics["mismatch/bitwise_frac"] <= 1.0
        assert metrics["mismatch/k3_kl"] < 1e-3, metrics  # same weights, different kernels: tiny
        assert metrics["mismatch/abs_diff_mean"] < 0.05, metrics
        assert engine.last_sync["buckets"] >= 1 and engine.last_sync["copy_s"] > 0
        assert loop.run_until_complete(engine.check_weight_update_equal(weights(policy))) == [], f"step {step}"
    assert any(not torch.equal(before[n], t) for n, t in weights(policy)), "training changed no weight"
    assert engine.weight_version >= 3
    served = engine.stats["requests_per_engine"]
    assert len(served) == engine.options.num_engines and min(served) >= 16, served  # 48 requests, dealt to all


def test_check_names_a_parameter_the_sync_left_stale(colocated):
    loop, engine, policy, _, _ = colocated
    with torch.no_grad():
        policy.model.norm.weight.add_(0.5)  # changed in the trainer, never synced
    found = loop.run_until_complete(engine.check_weight_update_equal(weights(policy)))
    assert found == ["stale: model.norm.weight"]
    # the check loaded the trainer's weights, so engine and trainer agree again
    assert loop.run_until_complete(engine.check_weight_update_equal(weights(policy))) == []


def test_partial_rollout_requests_continue_across_a_sync(colocated):
    loop, engine, policy, tok, _ = colocated

    async def scenario():
        prompt = tok.encode("what is 1 plus 2?")
        tasks = [
            asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=400, stop_token_ids=[], seed=i)))
            for i in range(16)
        ]
        await asyncio.sleep(0.3)
        with torch.no_grad():
            policy.model.norm.weight.mul_(0.9)
        await engine.update_weights(weights(policy))
        sync = dict(engine.last_sync)
        return await asyncio.gather(*tasks), sync

    served = list(engine.stats["requests_per_engine"])
    gens, sync = loop.run_until_complete(scenario())
    in_flight = [b - a for a, b in zip(served, engine.stats["requests_per_engine"], strict=True)]
    assert in_flight == [16 // len(served)] * len(served), in_flight  # every engine had requests to pause
    assert sync["paused"] == 1.0, "requests were in flight: the sync must pause them"
    assert all(len(g.token_ids) == 400 and len(g.log_probs) == 400 for g in gens)
    assert any(g.extra["weight_versions"][0] != g.extra["weight_versions"][1] for g in gens)
    assert loop.run_until_complete(engine.check_weight_update_equal(weights(policy))) == []


def test_trainer_checkpoint_loads_in_vllm_and_survives_sleep_wake(colocated, tmp_path):
    loop, engine, policy, tok, _ = colocated
    if engine.options.num_engines > 1:
        pytest.skip("starts an engine of its own")
    save_tiny(policy, tok, tmp_path)  # the trainer's HF export format

    async def scenario():
        engine = VLLMEngine(
            str(tmp_path),
            VLLMConfig(gpu_memory_utilization=0.15, enforce_eager=True, max_model_len=512, enable_sleep=True),
        )
        try:
            loaded = await engine.check_weight_update_equal(weights(policy))
            await engine.sleep(1)
            await engine.wake_up()
            after_wake = await engine.check_weight_update_equal(weights(policy))
            gen = await engine.generate(tok.encode("what is 2 plus 2?"), SamplingParams(max_tokens=8, seed=0))
        finally:
            engine.shutdown()
        return loaded, after_wake, gen

    loaded, after_wake, gen = loop.run_until_complete(scenario())
    assert loaded == [] and after_wake == []
    assert 1 <= len(gen.token_ids) <= 8 and len(gen.log_probs) == len(gen.token_ids)
