"""``LogProbModel``: the shared-prefix forward gives the plain forward's log-probs and gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from molt_train.logprob_model import LogProbModel


def group_batch(prompts: list[list[int]], completions: list[list[list[int]]]):
    """Right-padded rows prompt + completion, the completion tokens marked as actions."""
    rows = [(p, c) for p, cs in zip(prompts, completions, strict=True) for c in cs]
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    action = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        mask[i, : len(p) + len(c)] = 1
        action[i, len(p) : len(p) + len(c)] = True
    return ids, mask, action[:, 1:]


def logp_and_grads(model: LogProbModel, ids, mask, action, share: bool):
    model.zero_grad()
    logp = model(ids, mask, 0.8, action if share else None)
    ((logp * action).sum() / action.sum()).backward()
    return logp.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("chunk_size", [1024, 7])
def test_shared_prefixes_give_the_plain_forwards_logprobs_and_gradients(tiny_model, tiny_tokenizer, chunk_size):
    model = LogProbModel(copy.deepcopy(tiny_model).float(), chunk_size, share_prefixes=True)
    prompts = [tiny_tokenizer.encode(t) for t in ("Janet has 3 ducks and", "7", "How many eggs does she sell")]
    gen = torch.Generator().manual_seed(0)
    completions = [
        [torch.randint(5, 200, (int(n),), generator=gen).tolist() for n in torch.randint(1, 6, (4,), generator=gen)]
        for _ in prompts
    ]
    ids, mask, action = group_batch(prompts, completions)
    plain, plain_grads = logp_and_grads(model, ids, mask, action, share=False)
    calls = []
    model.lm.model.register_forward_hook(lambda *_: calls.append(1))
    shared, shared_grads = logp_and_grads(model, ids, mask, action, share=True)
    assert len(calls) == 2  # the distinct prompts once, then every row's completion on their KV cache
    valid = mask[:, 1:].bool()  # positions that predict a real token
    assert torch.allclose(plain[valid], shared[valid], atol=1e-5)
    for name, grad in plain_grads.items():
        assert torch.allclose(grad, shared_grads[name], atol=1e-6, rtol=1e-4), name


def test_rows_without_a_shared_prefix_take_the_plain_forward(tiny_model, tiny_tokenizer):
    model = LogProbModel(copy.deepcopy(tiny_model).float(), 1024, share_prefixes=True)
    prompts = [tiny_tokenizer.encode(t) for t in ("a b", "c d e", "f")]
    ids, mask, action = group_batch(prompts, [[[11, 12]], [[13]], [[14, 15, 16]]])
    calls = []
    model.lm.model.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        model(ids, mask, 1.0, action)
    assert len(calls) == 1  # nothing to share: one forward, no prefix + suffix pair
