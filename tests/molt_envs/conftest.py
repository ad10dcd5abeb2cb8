"""Fixtures of the molt_envs tests, made from this layer and the libraries alone (nothing of ``molt_train``): a
tokenizer trained with ``tokenizers`` and a ChatML chat template, a tiny random bigram language model and an
``Engine`` that samples from it. ``chat_support`` (helpers of the session-server tests) is importable by name.

They override the root conftest's fixtures of the same names (the trainer's tiny Qwen2 and its HF engine), which the
``molt_train`` tests keep using.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from molt_envs import Generation, SamplingParams

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib puts no test directory on sys.path

GSM8K_TRAIN = Path(__file__).resolve().parents[2] / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
# ChatML with Qwen-style tools (the format molt_envs' tool-call parser and ByteChatTokenizer use): tools listed in the
# system turn, assistant tool calls as <tool_call> JSON blocks, consecutive tool results grouped into one user turn.
# transformers renders chat templates with trim_blocks and lstrip_blocks: a line ending in a tag adds no newline. Apart
# from the shorter tools preamble, it renders what the trainer's tiny tokenizer does (the tests' exact texts assume it).
CHATML_TEMPLATE = r"""{% if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}
{{ messages[0].content }}

{% endif %}
# Tools
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{% for message in messages %}
{% if message.role == 'system' and loop.first %}
{% elif message.role == 'assistant' %}
<|im_start|>assistant
{{ message.content or '' }}{% for call in message.tool_calls or [] %}
{% set fn = call.function if call.function is defined else call %}
{% if (message.content or '') or not loop.first %}{{ '\n' }}{% endif %}
<tool_call>
{"name": "{{ fn.name }}", "arguments": {{ fn.arguments if fn.arguments is string else fn.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}
{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}
<|im_start|>user{% endif %}

<tool_response>
{{ message.content }}
</tool_response>{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{% else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A byte-level BPE of 1,024 tokens trained on 1,500 GSM8K rows (about a second), as a transformers fast
    tokenizer with the ChatML template; end of turn (and of sequence) is ``<|im_end|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    with GSM8K_TRAIN.open() as f:
        texts = [row["question"] + "\n" + row["answer"] for row in map(json.loads, list(f)[:1500])]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=1024, special_tokens=SPECIAL_TOKENS, initial_alphabet=alphabet, show_progress=False
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


class BigramModel:
    """A random bigram language model: the next token's logits depend on the current token only.
    ``model(ids[batch, length]).logits[batch, length, vocab]``, as a transformers causal LM answers."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        import torch

        self.logits = torch.randn(vocab_size, vocab_size, generator=torch.Generator().manual_seed(seed)) * 2

    def __call__(self, input_ids):
        return SimpleNamespace(logits=self.logits[input_ids])


class BigramEngine:
    """The ``Engine`` protocol over a ``BigramModel``: each token is sampled from ``softmax(logits / temperature)``
    (greedy at temperature 0, log-probs then at temperature 1) and returned with its log-prob under that
    distribution; a stop token ends the turn once ``min_tokens`` are out; a seeded request is reproducible. Like a
    real engine it refuses a prompt that leaves no room under ``max_positions`` (top-p/top-k are not implemented)."""

    def __init__(self, model: BigramModel, tokenizer, max_positions: int = 1024) -> None:
        self.model, self.eos_token_id, self.max_positions = model, tokenizer.eos_token_id, max_positions

    async def generate(self, prompt_ids, params: SamplingParams, images=None) -> Generation:
        import torch

        if not prompt_ids:
            raise ValueError("prompt_ids is empty; an engine needs at least one token to condition on")
        if len(prompt_ids) + params.max_tokens > self.max_positions:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds {self.max_positions}"
            )
        await asyncio.sleep(0)  # let concurrent requests interleave, as a batching engine's do
        rng = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        stops = set(params.stop_token_ids if params.stop_token_ids is not None else [self.eos_token_id])
        ids, log_probs, last = [], [], prompt_ids[-1]
        for step in range(params.max_tokens):
            logp = torch.log_softmax(self.model.logits[last] / (params.temperature or 1.0), -1)
            weights = logp.exp()
            if step < params.min_tokens:
                weights[list(stops)] = 0.0
            token = int(weights.argmax() if params.temperature == 0 else torch.multinomial(weights, 1, generator=rng))
            ids.append(token)
            log_probs.append(float(logp[token]))
            last = token
            if token in stops and step >= params.min_tokens:
                return Generation(ids, log_probs, "stop")
        return Generation(ids, log_probs, "length")


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer) -> BigramModel:
    return BigramModel(len(tiny_tokenizer), seed=0)


@pytest.fixture
def tiny_engine(tiny_model, tiny_tokenizer) -> BigramEngine:
    return BigramEngine(tiny_model, tiny_tokenizer)
