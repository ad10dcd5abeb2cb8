"""The hf engine: exact ids and log-probs, batching of concurrent requests, and every sampling parameter."""

from __future__ import annotations

import asyncio

import pytest
import torch

from molt_envs import SamplingParams


def teacher_forced_logprobs(model, prompt: list[int], generated: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    scaled = logits / temperature if temperature > 0 else logits
    logp = torch.log_softmax(scaled, dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(generated)[:, None])[:, 0]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
async def test_logprobs_equal_a_teacher_forced_forward_pass(tiny_engine, tiny_model, tiny_tokenizer, temperature):
    prompts = [tiny_tokenizer.encode(text) for text in ("Janet has 3 ducks.", "How many eggs " * 6, "7")]
    params = SamplingParams(temperature=temperature, max_tokens=24, seed=1)
    gens = await asyncio.gather(*[tiny_engine.generate(p, params) for p in prompts])
    for prompt, gen in zip(prompts, gens, strict=True):
        assert len(gen.token_ids) == len(gen.log_probs) > 0
        expected = teacher_forced_logprobs(tiny_model, prompt, gen.token_ids, temperature)
        assert torch.allclose(torch.tensor(gen.log_probs), expected, atol=1e-4), (gen.log_probs, expected)


async def test_concurrent_requests_are_batched(tiny_engine, tiny_tokenizer):
    prompt = tiny_tokenizer.encode("Natalia sold clips")
    await asyncio.gather(*[tiny_engine.generate(prompt, SamplingParams(max_tokens=4, seed=i)) for i in range(16)])
    assert tiny_engine.stats["requests"] == 16
    assert tiny_engine.stats["batches"] < 16  # collected into shared decode batches


async def test_requests_queued_together_are_batched_without_a_clock(tiny_model, tiny_tokenizer):
    """With no batch window at all, what was queued at once still forms full batches: the rows decoded together (and
    so their padding and rounding) do not depend on how fast the engine's loop runs."""
    from molt_train.engines.hf import HFEngine

    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=4, batch_window_s=0.0)
    prompts = [tiny_tokenizer.encode(f"Natalia sold {n} clips") for n in range(10)]
    await asyncio.gather(*[engine.generate(p, SamplingParams(max_tokens=3, seed=i)) for i, p in enumerate(prompts)])
    assert engine.stats["requests"] == 10
    assert engine.stats["batches"] == 3  # 4 + 4 + 2, in the order they were queued


async def test_seed_makes_sampling_reproducible_and_distinct_seeds_differ(tiny_engine, tiny_tokenizer):
    prompt = tiny_tokenizer.encode("Weng earns $12 an hour")
    runs = [await tiny_engine.generate(prompt, SamplingParams(max_tokens=16, seed=s)) for s in (5, 5, 6)]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].token_ids != runs[2].token_ids


async def test_top_k_one_is_greedy_and_greedy_is_argmax(tiny_engine, tiny_model, tiny_tokenizer):
    prompt = tiny_tokenizer.encode("Betty is saving money")
    greedy = await tiny_engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12))
    top1 = await tiny_engine.generate(prompt, SamplingParams(temperature=1.3, top_k=1, max_tokens=12, seed=3))
    assert greedy.token_ids == top1.token_ids
    with torch.no_grad():
        first = tiny_model(torch.tensor([prompt])).logits[0, -1].argmax().item()
    assert greedy.token_ids[0] == first


async def test_top_p_restricts_to_the_nucleus(tiny_engine, tiny_model, tiny_tokenizer):
    prompt = tiny_tokenizer.encode("James writes a letter")
    with torch.no_grad():
        probs = torch.softmax(tiny_model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    sorted_probs, order = probs.sort(descending=True)
    nucleus = set(order[: int((sorted_probs.cumsum(0) < 0.3).sum()) + 1].tolist())
    firsts = {
        (await tiny_engine.generate(prompt, SamplingParams(top_p=0.3, max_tokens=1, seed=s))).token_ids[0]
        for s in range(20)
    }
    assert firsts <= nucleus


async def test_stop_tokens_max_tokens_and_min_tokens(tiny_engine, tiny_tokenizer):
    prompt = tiny_tokenizer.encode("Albert buys pizzas")
    free = await tiny_engine.generate(prompt, SamplingParams(max_tokens=10, seed=2, stop_token_ids=[]))
    assert free.finish_reason == "length" and len(free.token_ids) == 10
    stop_at = free.token_ids[3]
    stopped = await tiny_engine.generate(prompt, SamplingParams(max_tokens=10, seed=2, stop_token_ids=[stop_at]))
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == stop_at
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    held = await tiny_engine.generate(
        prompt, SamplingParams(max_tokens=10, min_tokens=10, seed=2, stop_token_ids=[stop_at])
    )
    assert len(held.token_ids) == 10 and stop_at not in held.token_ids
    assert (await tiny_engine.generate(prompt, SamplingParams(max_tokens=0))).token_ids == []


async def test_bad_input_is_rejected_with_the_value(tiny_engine):
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        await tiny_engine.generate([], SamplingParams())
    with pytest.raises(ValueError, match="exceeds the model's 1024 positions"):
        await tiny_engine.generate([1] * 1000, SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=1.5)


async def test_update_weights_changes_generation_and_reports_bytes(tiny_model, tiny_tokenizer):
    import copy

    from molt_train.engines.hf import HFEngine

    engine = HFEngine(copy.deepcopy(tiny_model), tiny_tokenizer)
    prompt = tiny_tokenizer.encode("Mark has a garden")
    before = await engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8))
    new = {n: p + 0.5 * torch.randn_like(p) for n, p in engine.model.named_parameters()}
    moved = engine.update_weights(new.items())
    assert moved == sum(t.numel() * 4 for t in new.values())
    assert all(torch.equal(p, new[n]) for n, p in engine.model.named_parameters())
    after = await engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8))
    assert after.token_ids != before.token_ids
    with pytest.raises(KeyError, match="does not exist"):
        engine.update_weights([("no.such.weight", torch.zeros(1))])
