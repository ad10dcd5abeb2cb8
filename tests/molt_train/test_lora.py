"""LoRA through PEFT (``--model.lora_*``): SFT and RL train only the adapters, the hf engine receives only them, and
a run exports a PEFT adapter directory and the merged model (the real commands, a real local Ray, tiny models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

LORA = ["--model.lora_dim", "4", "--model.lora_alpha", "8", "--actor.adam.lr", "2e-2"]


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def base(tiny_tokenizer, tmp_path_factory) -> Path:
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("base"))


def same_logits(a, b, ids) -> bool:
    with torch.no_grad():
        return torch.allclose(a(input_ids=ids).logits, b(input_ids=ids).logits, atol=1e-5)


def test_sft_with_lora_trains_only_the_adapters_and_exports_adapter_and_merged(ray_local, base, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from molt_train import sft_cli

    argv = ["--env", "molt/arith-v1", "--actor.model_name_or_path", str(base), "--ckpt.output_dir", str(tmp_path)]
    argv += ["--train.num_steps", "3", "--train.batch_size", "8", "--eval.max_samples", "0", "--no-logger.progress"]
    argv += LORA + ["--model.lora_target_modules", "*.q_proj", "*.v_proj", "*.down_proj"]
    assert sft_cli.main(argv) == 0
    losses = [json.loads(line)["train/loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0]
    adapter = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8
    before = AutoModelForCausalLM.from_pretrained(base)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    original = before.state_dict()
    changed = {k for k, v in merged.state_dict().items() if not torch.equal(v, original[k])}
    # the merge moved exactly the targeted projections; embeddings, norms, k/o/gate/up stayed the base's
    assert changed == {
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    }, changed
    ids = torch.tensor([[5, 17, 40, 3, 99]])
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "adapter")
    assert same_logits(peft, merged, ids)  # adapter on the base == the merged checkpoint
    assert not same_logits(before, merged, ids)


def test_rl_with_lora_syncs_only_the_adapters_and_checks_them(ray_local, base, tmp_path):
    from transformers import AutoModelForCausalLM

    from molt_train import rl_cli

    argv = ["--env", "molt/arith-v1", "--actor.model_name_or_path", str(base), "--ckpt.output_dir", str(tmp_path)]
    argv += ["--train.num_steps", "2", "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2"]
    argv += ["--rollout.max_new_tokens", "4", "--eval.max_samples", "0", "--no-logger.progress"]
    argv += ["--train.check_weight_update_equal", "--ckpt.save_steps", "1", "--data.max_len", "64"] + LORA
    assert rl_cli.main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    full = AutoModelForCausalLM.from_pretrained(base)
    full_bytes = sum(p.numel() * 4 for p in full.parameters())
    linear = [m for m in full.modules() if isinstance(m, torch.nn.Linear) and m is not full.lm_head]
    adapter_bytes = sum(4 * 4 * (m.in_features + m.out_features) for m in linear)  # rank 4: A (4 x in) + B (out x 4)
    for r in records:
        assert r["weight_sync/bytes"] == adapter_bytes < full_bytes / 5  # the adapters only reach the engine
        assert r["weight_sync/checked_params"] == 2 * len(linear)  # every lora_A / lora_B equals the trainer's
    assert (tmp_path / "checkpoints" / "step_1" / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight, full.model.layers[0].self_attn.q_proj.weight)
    torch.testing.assert_close(merged.model.embed_tokens.weight, full.model.embed_tokens.weight, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model.lora_dim", "4", "--actor.backend", "automodel"], "--actor.backend automodel is not supported"),
        (["--model.lora_target_modules", "*.q_proj"], "needs --model.lora_dim > 0"),
    ],
)
def test_lora_refusals_name_the_flags(argv, message, capsys):
    from molt_train.config import parse

    with pytest.raises(SystemExit):
        parse("rl", ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "o", *argv])
    assert message in capsys.readouterr().err


def test_lora_targets_that_match_nothing_name_the_flag(tiny_model):
    import copy

    from molt_train import lora
    from molt_train.config import ModelConfig

    with pytest.raises(ValueError, match="--model.lora_target_modules q_proj matched no linear layer"):
        lora.inject(copy.deepcopy(tiny_model), ModelConfig(lora_dim=4, lora_target_modules=("q_proj",)))
