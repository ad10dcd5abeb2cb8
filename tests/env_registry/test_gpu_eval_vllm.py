"""``molt-env eval --model DIR --engine vllm`` on a real GPU (run on the H200; skipped without CUDA or vLLM): the
checkpoint is served by ``molt-train serve --engine vllm`` and evaluated through its endpoint, Env and ChatAgent IDs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("vllm")

sys.path.insert(0, str(Path(__file__).parent))

from eval_support import molt_env, samples, summary  # noqa: E402


def test_eval_through_a_vllm_served_checkpoint(tmp_path):
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    texts = [f"{a}+{b}={a + b}" for a in range(30) for b in range(30)]
    tok = train_tokenizer(texts, vocab_size=512)
    model = build_tiny_model(tok, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512)
    checkpoint = save_tiny(model, tok, tmp_path / "hf")
    out = tmp_path / "eval"
    done = molt_env("eval", "molt/arith-v1", "molt/chat-gsm8k-v1", "--model", str(checkpoint), "--engine", "vllm",
                    "-n", "4", "--k", "1,4", "--max-samples", "16", "--max-new-tokens", "16", "--concurrency", "64",
                    "--out", str(out), timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = summary(out)
    assert result["model"] == f"vllm:{checkpoint}" and result["failures"] == {}
    assert result["num_samples"] == 2 * 16 * 4 and len(samples(out)) == 128
    assert all(r["completion_tokens"] for r in samples(out))
