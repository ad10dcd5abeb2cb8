"""The seed README's flags and quick starts (/work/shared/seeds/molt-README.md; ``molt_train/config/seed.py``).

Every seed flag is accepted (under its own name or as an alias); the SFT and RL quick-start lines, with a tiny
checkpoint of ours and JSONL files in place of its paths, run CPU-sized (two steps) once the flags that need a GPU
stack are left out, and given those flags they exit 2 naming the flag and what it needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from molt_train.config import COMMANDS, parse
from molt_train.config.flags import build_parser
from molt_train.config.seed import SEED_FLAGS

AGENTS = Path(__file__).parent / "agents"


def test_every_seed_flag_is_accepted():
    option_strings = set()
    for command in ("rl", "sft"):
        option_strings |= set(build_parser(COMMANDS[command], command)._option_string_actions)
    missing = [name for name in SEED_FLAGS if f"--{name}" not in option_strings]
    assert not missing
    assert set(SEED_FLAGS.values()) <= {"exists", "alias", "added", "refused"}


def test_the_seed_lora_and_model_names_are_aliases():
    base = ["--env", "molt/arith-v1", "--ckpt.output_dir", "o"]
    cfg = parse("rl", [*base, "--actor.model_name_or_path", "m", "--actor.lora_dim", "8", "--actor.lora_alpha", "32"])
    assert (cfg.model.lora_dim, cfg.model.lora_alpha) == (8, 32.0)
    cfg = parse("sft", [*base, "--model.model_name_or_path", "m", "--data.dataset", "d.jsonl"])
    assert cfg.actor.model_name_or_path == "m" and cfg.data.prompt_dataset == "d.jsonl"


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_tokenizer, tmp_path_factory):
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("tiny-seed"))


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_line(model, data, out) -> list[str]:
    """The seed's SFT quick start (``torchrun ... -m molt.cli.train_sft``: here ``molt-train sft``)."""
    return [
        "--model.model_name_or_path", str(model), "--data.dataset", str(data), "--data.input_key", "input",
        "--data.output_key", "output", "--ckpt.output_dir", str(out), "--fsdp.attn_implementation", "te",
    ]  # fmt: skip


def rl_line(model, data, out) -> list[str]:
    """The seed's RL quick start, with our agent and files."""
    return [
        "--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(data), "--data.input_key", "input",
        "--train.agent_path", str(AGENTS / "parity_reward.py"), "--vllm.num_engines", "2",
        "--vllm.tensor_parallel_size", "2", "--rollout.batch_size", "128", "--train.batch_size", "128",
        "--train.micro_batch_size", "1", "--algo.advantage.estimator", "reinforce", "--fsdp.attn_implementation",
        "te", "--ckpt.output_dir", str(out),
    ]  # fmt: skip


def without(argv: list[str], *names: str) -> list[str]:
    """``argv`` less the flags ``names`` and their values."""
    out, skip = [], False
    for arg in argv:
        if arg.startswith("--"):
            skip = arg in names
        if not skip:
            out.append(arg)
    return out


def replaced(argv: list[str], **values: str) -> list[str]:
    out = list(argv)
    for name, value in values.items():
        out[out.index(f"--{name.replace('__', '.')}") + 1] = value
    return out


def test_the_seed_lines_name_what_their_gpu_flags_need(tmp_path, capsys):
    sft = sft_line("m", "d.jsonl", tmp_path / "sft")
    with pytest.raises(SystemExit) as exc:
        parse("sft", sft)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--fsdp.attn_implementation te" in err and "--actor.backend automodel" in err
    rl = rl_line("m", "p.jsonl", tmp_path / "rl")
    with pytest.raises(SystemExit) as exc:  # the hf engine (the default) never reads --vllm.*
        parse("rl", rl)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--vllm.num_engines 2 has no effect" in err and "add --rollout.engine vllm" in err
    with pytest.raises(SystemExit) as exc:  # on the vllm engine: TransformerEngine, then vLLM itself
        parse("rl", [*rl, "--rollout.engine", "vllm"])
    assert exc.value.code == 2
    assert "--fsdp.attn_implementation te" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        parse("rl", [*without(rl, "--fsdp.attn_implementation"), "--rollout.engine", "vllm"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--rollout.engine vllm needs vLLM" in err or "--vllm.num_engines 2" in err


def test_the_seed_sft_and_rl_quick_starts_run_cpu_sized(ray_local, tiny_checkpoint, tmp_path):
    from molt_train.cli import main

    rows = [{"input": f"{a}+{b}=", "output": str(a + b), "label": str(a + b)} for a in range(4) for b in range(4)]
    data = jsonl(tmp_path / "rows.jsonl", rows)
    sft = without(sft_line(tiny_checkpoint, data, tmp_path / "sft"), "--fsdp.attn_implementation")
    small = ["--train.num_steps", "2", "--train.batch_size", "4", "--eval.max_samples", "0", "--no-logger.progress"]
    assert main(["sft", *sft, *small]) == 0
    assert (tmp_path / "sft" / "hf" / "config.json").is_file()
    rl = without(
        rl_line(tmp_path / "sft" / "hf", data, tmp_path / "rl"),
        "--fsdp.attn_implementation",
        "--vllm.num_engines",
        "--vllm.tensor_parallel_size",
    )
    rl = replaced(rl, rollout__batch_size="2", train__batch_size="2")
    assert main(["rl", *rl, "--train.num_steps", "2", "--rollout.max_new_tokens", "3", "--no-logger.progress"]) == 0
    steps = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "train/loss" in r or "loss" in r][-1] == 2
    assert json.loads((tmp_path / "rl" / "config.json").read_text())["flag_warnings"] == []
