"""MoE routing across rollout and training (``molt_train.routing``) on a tiny random Qwen3-MoE (2 layers, 8 experts,
top-2): the hf engine's records are what a plain forward routes; after the routers move, the trainer's own choices
differ from the records, and replaying them routes exactly the recorded experts (the plain and the shared-prefix
forward alike) while the routers still get gradients; a ``molt-train rl`` run with ``--train.routing_replay``
reports the mismatch; a dense model is refused."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch

from molt_envs import SamplingParams, Trajectory
from molt_train.config import parse
from molt_train.engines.hf import HFEngine
from molt_train.experience import make_experience
from molt_train.logprob_model import LogProbModel
from molt_train.routing import NO_RECORD, GateReplay, router_modules

LAYERS, EXPERTS, TOP_K = 2, 8, 2
AGENT = str(Path(__file__).parent / "agents" / "parity_reward.py")  # rewards that differ within a group


@pytest.fixture(scope="module")
def moe(tiny_tokenizer):
    from molt_train.models.tiny import build_tiny_moe

    return build_tiny_moe(tiny_tokenizer, num_layers=LAYERS, num_experts=EXPERTS, top_k=TOP_K).eval()


def chosen_experts(model) -> list[list[torch.Tensor]]:
    """Hooks that keep the expert ids every router returns (per forward, per layer), and the list they fill."""
    seen: list[list[torch.Tensor]] = []
    for layer, router in enumerate(router_modules(model, "test")):

        def keep(_module, _args, out, layer=layer):
            if layer == 0:
                seen.append([])
            seen[-1].append(out[2].detach().clone())

        router.register_forward_hook(keep)
    return seen


@pytest.fixture(scope="module")
def generated(moe, tiny_tokenizer):
    """Four samples of the engine in one batch: two prompts of different lengths (left padding), two samples each
    (a shared prefill), different lengths; each (prompt, generated ids, record)."""
    engine = HFEngine(moe, tiny_tokenizer, record_routing=True)
    prompts = [tiny_tokenizer("Natalia sold clips to")["input_ids"], tiny_tokenizer("3+4=")["input_ids"]]
    jobs = [(p, SamplingParams(temperature=1.0, max_tokens=m, seed=s)) for p in prompts for s, m in ((1, 9), (2, 6))]

    async def run():
        return await asyncio.gather(*(engine.generate(p, params) for p, params in jobs))

    outs = asyncio.run(run())
    assert engine.stats["batches"] == 1
    return [(p, out.token_ids, engine.routing_record(p, out.token_ids)) for (p, _), out in zip(jobs, outs, strict=True)]


def test_hf_engine_records_what_a_plain_forward_of_prompt_and_completion_routes(moe, generated):
    probe = copy.deepcopy(moe)
    seen = chosen_experts(probe)
    for prompt, ids, record in generated:
        assert record.dtype == torch.int16 and record.shape == (len(prompt) + len(ids) - 1, LAYERS, TOP_K)
        with torch.no_grad():
            probe(torch.tensor([prompt + ids[:-1]]))
        for layer in range(LAYERS):
            mine = seen[-1][layer].sort(-1).values
            assert torch.equal(record[:, layer].long().sort(-1).values, mine), layer


def experience(generated):
    trajs = []
    for i, (prompt, ids, record) in enumerate(generated):
        t = Trajectory(reward=float(i % 2), group_id=f"g{i // 2}", rollout_id=f"r{i}")
        t.append_observation(prompt)
        t.append_action(ids, [-1.0] * len(ids))
        t.info["routing"] = record
        trajs.append(t)
    exp = make_experience(trajs, max_len=64, pad_id=0)
    exp.advantages = torch.linspace(-1, 1, exp.action_mask.numel()).reshape(exp.action_mask.shape) * exp.action_mask
    return exp


def perturbed(moe):
    """The policy after its routers moved (an optimizer step since the rollout, as in async training)."""
    policy = copy.deepcopy(moe)
    torch.manual_seed(1)
    with torch.no_grad():
        for router in router_modules(policy, "test"):
            router.weight.add_(torch.randn_like(router.weight) * router.weight.std())
    return policy


@pytest.mark.parametrize("share_prefixes", [False, True])
def test_replay_routes_the_recorded_experts_and_the_routers_still_learn(moe, generated, share_prefixes):
    exp = experience(generated)
    routing = exp.extra["routing"]
    assert routing.shape == (*exp.action_mask.shape, LAYERS, TOP_K)
    distinct = {tuple(p): len(p) for p, _, _ in generated}
    shared_prompt_tokens = sum(len(p) for p, _, _ in generated) - sum(distinct.values())
    logps = {}
    for replay in (False, True):
        policy = perturbed(moe)
        model = LogProbModel(policy, chunk_size=16, share_prefixes=share_prefixes)
        model.replay = GateReplay(policy, replay=replay)
        seen = chosen_experts(policy)
        logps[replay] = logp = model(exp.input_ids, exp.attention_mask, 1.0, exp.action_mask, routing=routing)
        differ, recorded = model.replay.take()
        valid = routing[..., 0, 0] != NO_RECORD
        # every recorded (token, layer) decision once; a prompt's shared by two rows runs (and counts) once
        assert recorded == LAYERS * (int(valid.sum()) - (shared_prompt_tokens if share_prefixes else 0))
        assert differ > 0  # the moved routers choose otherwise (counted before the replay overrides them)
        if replay:
            assert len(seen) == (2 if share_prefixes else 1)  # the shared forward: prefixes, then the suffixes
            if not share_prefixes:
                for layer in range(LAYERS):
                    forced = seen[0][layer].view(*exp.input_ids.shape, TOP_K)[:, :-1]
                    assert torch.equal(forced[valid], routing[:, :, layer][valid].long())
            (logp * exp.advantages).sum().backward()
            grads = [router.weight.grad for router in router_modules(policy, "test")]
            assert all(g is not None and g.abs().sum() > 0 for g in grads)
    mask = exp.action_mask
    assert not torch.allclose(logps[False][mask], logps[True][mask])  # replay changed the forward


def test_replay_gives_the_same_log_probs_with_and_without_shared_prefixes(moe, generated):
    exp = experience(generated)
    out = []
    for share in (False, True):
        policy = perturbed(moe)
        model = LogProbModel(policy, chunk_size=16, share_prefixes=share)
        model.replay = GateReplay(policy, replay=True)
        with torch.no_grad():
            out.append(model(exp.input_ids, exp.attention_mask, 1.0, exp.action_mask, routing=exp.extra["routing"]))
    mask = exp.action_mask
    torch.testing.assert_close(out[0][mask], out[1][mask], atol=1e-5, rtol=1e-5)


def test_vllm_routing_of_both_output_layouts_is_one_record_per_forwarded_position():
    """vLLM builds return the whole sequence's experts on the completion, or the generated tokens' there and the
    prompt's on the request; either becomes (prompt + generated - 1) positions, NO_RECORD where vLLM gave none."""
    from types import SimpleNamespace

    import numpy as np

    from molt_train.engines.vllm import vllm_routing

    prompt_len, generated = 5, 4
    full = np.arange((prompt_len + generated - 1) * LAYERS * TOP_K, dtype=np.int16).reshape(-1, LAYERS, TOP_K)
    whole = SimpleNamespace(outputs=[SimpleNamespace(routed_experts=full)])
    split = SimpleNamespace(
        outputs=[SimpleNamespace(routed_experts=np.concatenate([full[prompt_len:], full[:1]]))],  # last row: padding
        prompt_routed_experts=full[:prompt_len],
    )
    for output in (whole, split):
        record = vllm_routing(output, prompt_len, generated)
        assert record.dtype == torch.int16 and torch.equal(record, torch.as_tensor(full))
    short = SimpleNamespace(outputs=[SimpleNamespace(routed_experts=full[:3])])
    record = vllm_routing(short, prompt_len, generated)
    assert torch.equal(record[:3], torch.as_tensor(full[:3])) and bool((record[3:] == NO_RECORD).all())
    with pytest.raises(RuntimeError, match="returned no routed_experts"):
        vllm_routing(SimpleNamespace(outputs=[SimpleNamespace(routed_experts=None)]), prompt_len, generated)


def test_a_dense_model_or_a_compiled_policy_is_refused(tiny_model, tiny_tokenizer, capsys):
    with pytest.raises(ValueError, match="--train.routing_replay: the model has no MoE router"):
        GateReplay(tiny_model, replay=True)
    with pytest.raises(ValueError, match="the model has no MoE router"):
        HFEngine(tiny_model, tiny_tokenizer, record_routing=True)
    base = ["--env", "molt/arith-v1", "--ckpt.output_dir", "o", "--actor.model_name_or_path", "m"]
    with pytest.raises(SystemExit) as exc:
        parse("rl", [*base, "--train.routing_replay", "--actor.compile"])
    assert exc.value.code == 2 and "--actor.backend hf without --actor.compile" in capsys.readouterr().err


def test_an_rl_run_with_routing_replay_reports_the_mismatch(ray_local, moe, tiny_tokenizer, tmp_path):
    """Two steps, the second on a rollout one step stale (--no-train.force_sync_mode): its records are of the
    weights before step 1 moved the routers."""
    from molt_train import rl_cli
    from molt_train.models.tiny import save_tiny

    model = save_tiny(moe, tiny_tokenizer, tmp_path / "moe")
    out = tmp_path / "run"
    argv = ["--env", "molt/arith-v1", "--train.agent_path", AGENT, "--actor.model_name_or_path", str(model)]
    argv += ["--ckpt.output_dir", str(out), "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2"]
    argv += ["--rollout.max_new_tokens", "6", "--algo.advantage.estimator", "grpo", "--actor.adam.lr", "1e-2"]
    argv += ["--train.num_steps", "2", "--no-train.force_sync_mode", "--eval.max_samples", "2"]
    assert rl_cli.main([*argv, "--no-logger.progress", "--train.routing_replay"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    assert len(steps) == 2 and steps[0]["train/grad_norm"] > 0
    fracs = [r["train/routing_mismatch_frac"] for r in steps]
    # step 1: the rollout's weights, fp32 both sides, so the trainer's routers agree with records aligned with the
    # tokens; step 2: the routers moved since its rollout, and the trainer's own choices differ
    assert fracs[0] < 0.02 and fracs[1] > 0.1, fracs
