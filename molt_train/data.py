"""Training rows: prompts, labels and reference completions from an env's split or a JSONL file.

Rows are ``{"prompt": [chat messages] | str, "label": ..., "reference": str | None, "images": [...]}``: a vision
env's split carries its rows' images, and ``--data.image_key`` names a JSONL row's field holding its image(s) (a
base64 string, a ``data:`` URI or a path relative to the file; one or a list). ``PromptSampler`` hands out batch
``k`` deterministically (a fresh seeded permutation per epoch), so a resumed run continues from the same data
position. ``encode_sft`` derives the assistant span from the model's own chat template; for a vision model (a
processor for ``tokenizer``) the prompt's images are placed and expanded as a rollout's would be.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from molt_train.config import DataConfig, EvalCommandConfig, RLConfig, SFTConfig


def load_rows(
    cfg: RLConfig | SFTConfig | EvalCommandConfig, split: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """The training rows (``split`` None): ``--data.prompt_dataset`` when given, else the env's ``--data.split``,
    at most ``--data.max_samples``. Or at most ``limit`` rows of the env's ``split`` (evaluation)."""
    if split is None:
        split, limit = cfg.data.split, cfg.data.max_samples
        if cfg.data.prompt_dataset:
            return _jsonl_rows(Path(cfg.data.prompt_dataset), cfg.data, limit)
    if cfg.env is None:
        raise ValueError(f"split {split!r} needs --env (a --data.prompt_dataset has no splits)")
    import env_registry

    spec = env_registry.spec(cfg.env)
    rows = env_registry.load_split(spec, split, limit)
    return [
        {"prompt": r["prompt"], "label": r["label"], "reference": r["reference"], "images": r["images"]} for r in rows
    ]


def load_eval_rows(cfg: RLConfig | SFTConfig | EvalCommandConfig) -> list[dict[str, Any]]:
    """The held-out rows: ``--eval.dataset`` when given (its fields named by ``--data.input_key`` /
    ``--data.label_key``), else the env's ``--eval.split``; at most ``--eval.max_samples``."""
    if cfg.eval.dataset:
        return _jsonl_rows(Path(cfg.eval.dataset), cfg.data, cfg.eval.max_samples, flag="--eval.dataset")
    return load_rows(cfg, cfg.eval.split, cfg.eval.max_samples)


def _jsonl_rows(
    path: Path, data: DataConfig, limit: int | None, flag: str = "--data.prompt_dataset"
) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {str(path)!r} does not exist")
    rows: list[dict[str, Any]] = []
    if limit == 0:
        return rows
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n} is not valid JSON: {exc}") from None
            if data.input_key not in raw:
                raise ValueError(
                    f"{path}:{n} has no {data.input_key!r} field (fields: {sorted(raw)}); set --data.input_key"
                )
            prompt = raw[data.input_key]
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            images = _row_images(raw, data.image_key, path, n) if data.image_key else []
            rows.append(
                {
                    "prompt": prompt,
                    "label": raw.get(data.label_key),
                    "reference": raw.get(data.output_key),
                    "images": images,
                }
            )
            if limit is not None and len(rows) >= limit:
                break
    if not rows and limit != 0:
        raise ValueError(f"{flag} {path} has no rows")
    return rows


def _row_images(raw: dict[str, Any], key: str, path: Path, n: int) -> list[Any]:
    """A JSONL row's images: base64 / ``data:`` strings as they are (the runner decodes them), file paths (relative
    to the dataset file) read as bytes."""
    if key not in raw:
        raise ValueError(f"{path}:{n} has no {key!r} field (fields: {sorted(raw)}); fix --data.image_key")
    value = raw[key]
    images = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, str):
            raise ValueError(f"{path}:{n} {key!r} must hold strings (base64, data: URIs or paths), got {item!r:.80}")
        file = (path.parent / item) if len(item) < 4096 and not item.startswith("data:") else None
        images.append(file.read_bytes() if file is not None and file.is_file() else item)
    return images


class PromptSampler:
    """Batch ``k`` is a fixed slice of a seeded permutation of the rows (a new permutation per epoch)."""

    def __init__(self, num_rows: int, batch_size: int, seed: int) -> None:
        if batch_size > num_rows:
            raise ValueError(f"batch size {batch_size} exceeds the {num_rows} rows of the dataset")
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self._orders: dict[int, list[int]] = {}

    def batch(self, k: int) -> list[int]:
        per_epoch = self.num_rows // self.batch_size
        epoch, pos = divmod(k, per_epoch)
        if epoch not in self._orders:
            order = list(range(self.num_rows))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch][pos * self.batch_size : (pos + 1) * self.batch_size]


def encode_sft(
    tokenizer: Any, prompt: str | list[dict[str, Any]], reference: str, max_len: int, images: list[Any] | None = None
) -> tuple[list[int], list[bool], Any]:
    """Token ids of prompt + assistant reply, a loss mask that is True on the reply through its end token, and the
    prompt's image inputs (``VisionInputs``, None without images).

    The prompt is the template with ``add_generation_prompt`` (exactly what a rollout conditions on); the reply is
    whatever the template adds after it for the assistant message, up to and including the eos token.

    Raises:
        ValueError: the template renders the prompt differently once a reply follows, or the images do not fit
        under ``max_len`` (``molt_envs.vision.ImageError``: a bad image or a text-only model).
    """
    from molt_envs.vision import load_image, place_images, require_codec, text_tokenizer

    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    codec, mm = None, None
    if images:
        codec = require_codec(tokenizer, len(images))
        messages, images = place_images(messages, images)
        images = [load_image(image, f"image {k}") for k, image in enumerate(images)]
    tokenizer = text_tokenizer(tokenizer)
    prefix = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": str(reference)}], tokenize=False)
    if not full.startswith(prefix):
        raise ValueError(
            "the chat template renders the prompt differently once an assistant reply follows; "
            "the assistant span cannot be derived from it"
        )
    if codec is not None:
        prompt_ids, mm = codec.encode(prefix, images)
        if len(prompt_ids) >= max_len:
            raise ValueError(f"the prompt with its images is {len(prompt_ids)} tokens; raise --data.max_len")
    else:
        prompt_ids = tokenizer.encode(prefix, add_special_tokens=False)
    reply_ids = tokenizer.encode(full[len(prefix) :], add_special_tokens=False)
    eos = tokenizer.eos_token_id
    if eos in reply_ids:
        reply_ids = reply_ids[: reply_ids.index(eos) + 1]
    ids = (prompt_ids + reply_ids)[:max_len]
    mask = ([False] * len(prompt_ids) + [True] * len(reply_ids))[:max_len]
    return ids, mask, mm
