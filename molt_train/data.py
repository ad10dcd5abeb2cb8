"""Training rows: prompts, labels and reference completions from an env's split or a JSONL file.

Rows are ``{"prompt": [chat messages] | str, "label": ..., "reference": str | None, "images": [...], "env": ID}``,
from one env or a weighted mix (``--env ID:WEIGHT`` repeated). A vision env's split carries its rows' images, and
``--data.image_key`` names a JSONL row's field holding its image(s) (a base64 string, a ``data:`` URI or a path
relative to the file; one or a list). ``MixSampler`` hands out batch ``k`` deterministically, by weight, and its
state is each env's data position, so a resumed run continues every env where it was. ``encode_sft`` derives the
assistant span from the model's own chat template; for a vision model (a processor for ``tokenizer``) the prompt's
images are placed and expanded as a rollout's would be.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from env_registry.mix import MixEntry, parse_env_mix

if TYPE_CHECKING:
    from molt_train.config.commands import EvalCommandConfig, RLConfig, SFTConfig
    from molt_train.config.groups import DataConfig


def env_mix(cfg: RLConfig | SFTConfig | EvalCommandConfig) -> list[MixEntry]:
    """The run's envs and their normalised weights (empty with ``--data.prompt_dataset`` and no ``--env``)."""
    env = cfg.env
    return parse_env_mix((env,) if isinstance(env, str) else env) if env else []


def load_rows(
    cfg: RLConfig | SFTConfig | EvalCommandConfig, split: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """The training rows (``split`` None): ``--data.prompt_dataset`` when given, else every env's ``--data.split``,
    at most ``--data.max_samples`` per env. Or at most ``limit`` rows of each env's ``split`` (evaluation). A row
    of an env names it (``row["env"]``, the ``--env`` ID as given), in the order of the ``--env`` flags."""
    if split is None:
        split, limit = cfg.data.split, cfg.data.max_samples
        if cfg.data.prompt_dataset:
            return _jsonl_rows(Path(cfg.data.prompt_dataset), cfg.data, limit)
    mix = env_mix(cfg)
    if not mix:
        raise ValueError(f"split {split!r} needs --env (a --data.prompt_dataset has no splits)")
    import env_registry

    rows = []
    for entry in mix:
        for r in env_registry.load_split(env_registry.spec(entry.env_id), split, limit):
            rows.append(
                {
                    "prompt": r["prompt"],
                    "label": r["label"],
                    "reference": r["reference"],
                    "images": r["images"],
                    "env": entry.env_id,
                }
            )
    return rows


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
        file = None if item.startswith("data:") else path.parent / item
        images.append(file.read_bytes() if file is not None and _is_file(file) else item)
    return images


def _is_file(path: Path) -> bool:
    """Whether ``path`` names a file; a base64 image is no file name (too long for one: ENAMETOOLONG)."""
    try:
        return path.is_file()
    except OSError:
        return False


class MixSampler:
    """Which rows batch ``k`` holds, drawn from several envs by weight; its state is each env's data position.

    Each slot of a batch goes to the env furthest below its weight's share of the slots so far (smooth weighted
    round robin), so after ``n`` rows every env has had ``weight * n`` of them, give or take one. Within an env the
    rows come in a seeded permutation, a fresh one per pass over its rows. ``state()`` after batch ``k`` (each env's
    position and credit, JSON) restarts the sampler exactly there, even under a changed mix: an env keeps its
    position, a new one starts at 0.

    Args:
        rows: the rows, each with its ``"env"`` (or none: one group), grouped by env in mix order.
        weights: env -> weight (summing to 1); ``None``: the one group of unnamed rows.
        batch_size: rows per batch.
        seed: seeds the permutations.
        state: a ``state()`` to continue from, with ``start`` the index of the next batch.
    """

    def __init__(
        self,
        rows: list[dict[str, Any]],
        weights: dict[str | None, float] | None,
        batch_size: int,
        seed: int,
        state: dict[str, Any] | None = None,
        start: int = 0,
    ) -> None:
        self.offsets: dict[str | None, list[int]] = {}
        for i, row in enumerate(rows):
            self.offsets.setdefault(row.get("env"), []).append(i)
        self.weights = weights or {None: 1.0}
        missing = sorted(str(e) for e in self.weights if e not in self.offsets)
        if missing:
            raise ValueError(f"no rows for {', '.join(missing)} (its split is empty?)")
        self.batch_size, self.seed = batch_size, seed
        self._orders: dict[str | None, tuple[int, list[int]]] = {}
        state = state or {}
        self._start = (
            {e: int(state.get("positions", {}).get(str(e), 0)) for e in self.weights},
            {e: float(state.get("credit", {}).get(str(e), 0.0)) for e in self.weights},
            start,
        )
        self._rewind()

    def _rewind(self) -> None:
        positions, credit, self.next_batch = self._start
        self.positions, self.credit = dict(positions), dict(credit)

    def batch(self, k: int) -> list[int]:
        """The row indices of batch ``k`` (sequential use is cheap; an earlier ``k`` replays from the start)."""
        if k < self.next_batch:
            self._rewind()
        while self.next_batch < k:
            self._draw()
        return self._draw()

    def _draw(self) -> list[int]:
        out = []
        for _ in range(self.batch_size):
            for env, weight in self.weights.items():
                self.credit[env] += weight
            env = max(self.weights, key=lambda e: self.credit[e])
            self.credit[env] -= 1.0
            out.append(self._row(env, self.positions[env]))
            self.positions[env] += 1
        self.next_batch += 1
        return out

    def _row(self, env: str | None, position: int) -> int:
        rows = self.offsets[env]
        epoch, i = divmod(position, len(rows))
        if self._orders.get(env, (None,))[0] != epoch:
            order = list(range(len(rows)))
            random.Random(f"{self.seed}:{env}:{epoch}").shuffle(order)
            self._orders[env] = (epoch, order)
        return rows[self._orders[env][1][i]]

    def state(self) -> dict[str, Any]:
        """Each env's data position (rows drawn so far) and credit, after the last batch drawn."""
        return {
            "positions": {str(e): n for e, n in self.positions.items()},
            "credit": {str(e): round(c, 12) for e, c in self.credit.items()},
        }


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
