"""Shared fixtures: a tiny tokenizer and model trained/built from scratch (no downloads), and an HF engine on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GSM8K_TRAIN = Path(__file__).resolve().parents[1] / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from molt_train.models.tiny import train_tokenizer

    with GSM8K_TRAIN.open() as f:
        rows = [json.loads(line) for _, line in zip(range(1500), f, strict=False)]
    return train_tokenizer([r["question"] + "\n" + r["answer"] for r in rows], vocab_size=1024)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from molt_train.models.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer, seed=0)


@pytest.fixture
def tiny_engine(tiny_model, tiny_tokenizer):
    from molt_train.engines.hf import HFEngine

    return HFEngine(tiny_model, tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory):
    """A ``tiny-vl`` checkpoint (LLaVA classes, its processor) whose tokenizer was trained on shapes questions."""
    from molt_envs.envs.shapes import COLOURS, KINDS, generate_split
    from molt_train.models.tiny_vl import build_tiny_vl

    texts = [f"{r['question']} {r['answer']}" for r in generate_split("train", 200)] + list(COLOURS) + list(KINDS)
    return build_tiny_vl(texts, tmp_path_factory.mktemp("tiny-vl"), vocab_size=384, seed=0)


@pytest.fixture(scope="session")
def tiny_vl_engine(tiny_vl_dir):
    """An HF engine on the tiny VLM; ``.processor`` is what runners take, ``.tokenizer`` its text tokenizer."""
    from molt_train.engines.hf import HFEngine

    return HFEngine.from_pretrained(str(tiny_vl_dir))
