"""``--eval.top_p`` (and ``--eval.temperature``) reach the engine the eval samples with: every trainer eval (the
periodic and final ones, ``--eval.eval_only``, ``molt-train eval``, the SFT final eval) goes through
``RolloutWorker.evaluate``, here on the hf engine of a tiny checkpoint."""

from __future__ import annotations

import pytest

from molt_train.config import parse


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_tokenizer, tmp_path_factory):
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("tiny-eval"))


@pytest.mark.parametrize(("extra", "top_p"), [(["--eval.top_p", "0.7"], 0.7), ([], 1.0)])
def test_the_eval_samples_at_eval_top_p(tiny_checkpoint, monkeypatch, extra, top_p):
    from molt_train.engines.hf import HFEngine
    from molt_train.rollout import evaluate_checkpoint

    seen = []
    generate = HFEngine.generate

    async def recording(self, prompt, params, *args, **kwargs):
        seen.append(params)
        return await generate(self, prompt, params, *args, **kwargs)

    monkeypatch.setattr(HFEngine, "generate", recording)
    argv = ["--env", "molt/arith-v1", "--actor.model_name_or_path", str(tiny_checkpoint), "--eval.max_samples", "2"]
    argv += ["--eval.temperature", "1.0", "--rollout.max_new_tokens", "3", *extra]
    cfg = parse("eval", argv)
    evaluate_checkpoint(cfg, tiny_checkpoint)
    assert seen and {(p.top_p, p.temperature) for p in seen} == {(top_p, 1.0)}
