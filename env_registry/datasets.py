"""An env's dataset splits: JSONL files shipped inside its package, or generator functions; an env behind an env
server (a URL, an isolated install) streams them from its server.

Rows come out normalized: ``{"prompt": [chat messages] | str, "label": ..., "reference": str | None, "images": [...],
"row": raw}``; ``images`` is the row's ``image_key`` field as a list (empty without one): PIL images, encoded bytes or
base64 strings, which the runner decodes and places in the prompt (``molt_envs.vision``).
"""

from __future__ import annotations

import importlib
import importlib.resources
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from env_registry import remote
from env_registry.errors import Error
from env_registry.manifest import DatasetSplit, EnvSpec
from env_registry.remote import RemoteEnvSpec


def split_config(spec: EnvSpec, split: str) -> DatasetSplit:
    """The manifest's declaration of one split.

    Raises:
        Error: if the spec has no such split (the message lists the available ones).
    """
    if split not in spec.datasets:
        available = ", ".join(sorted(spec.datasets)) or "none"
        raise Error(f"{spec.id!r} has no dataset split {split!r}; available splits: {available}")
    return spec.datasets[split]


def split_path(spec: EnvSpec, split: str) -> Path:
    """The JSONL file of a path-based split (relative to the env module's package directory).

    Raises:
        Error: if the split does not exist or its file is missing from the installed package.
    """
    cfg = split_config(spec, split)
    module = spec.entry_point.partition(":")[0]
    package = module.rpartition(".")[0] or module
    path = Path(str(importlib.resources.files(package).joinpath(cfg.path)))
    if not path.is_file():
        raise Error(f"dataset file for {spec.id!r} split {split!r} is missing: {path}; reinstall the package")
    return path


def iter_split(spec: EnvSpec, split: str) -> Iterator[dict[str, Any]]:
    """Stream a split's rows, normalized (see ``normalize_row``), from its JSONL file or its generator.

    Args:
        spec: the env's spec. split: e.g. ``"train"``.

    Returns:
        An iterator of ``{"prompt", "label", "reference", "row"}`` dicts.

    Raises:
        Error: for a missing split or file, a line that is not JSON, or a row without the split's keys (the
            message names the row and its fields).
    """
    if isinstance(spec, RemoteEnvSpec):
        split_config(spec, split)
        yield from remote.rows(spec, split)
        return
    cfg = split_config(spec, split)
    if cfg.generator is not None:
        module, _, fn = cfg.generator.partition(":")
        kwargs = {**spec.kwargs, **cfg.kwargs} if cfg.env_kwargs else cfg.kwargs  # the split's own kwargs win
        raw_rows = getattr(importlib.import_module(module), fn)(split=split, **kwargs)
    else:
        raw_rows = _read_jsonl(split_path(spec, split))
    for i, row in enumerate(raw_rows):
        yield normalize_row(row, cfg, f"{spec.id} {split} row {i}")


def load_split(spec: EnvSpec, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` rows of a split (all of them for None), as ``iter_split`` yields them.

    Raises:
        Error: as ``iter_split``.
    """
    if isinstance(spec, RemoteEnvSpec):  # the server stops after ``limit`` rows
        split_config(spec, split)
        return list(remote.rows(spec, split, limit))
    return list(islice(iter_split(spec, split), limit))


def count_rows(spec: EnvSpec, split: str) -> int:
    """How many rows a split has (a file's non-empty lines, counted without parsing them; a generator's rows).

    Raises:
        Error: for a missing split or file.
    """
    cfg = split_config(spec, split)
    if cfg.path is not None and not isinstance(spec, RemoteEnvSpec):
        with split_path(spec, split).open("rb") as f:
            return sum(1 for line in f if line.strip())
    return sum(1 for _ in iter_split(spec, split))


def normalize_row(row: dict[str, Any], cfg: DatasetSplit, where: str) -> dict[str, Any]:
    """One raw row as ``{"prompt": chat messages | as given, "label", "reference", "images", "row": raw}``: a string
    input goes through the split's prompt template and system prompt; ``images`` is the ``image_key`` field as a list.

    Args:
        row: the raw row. cfg: the split's declaration. where: names the row in errors.

    Raises:
        Error: if the row lacks the input, label or image key.
    """
    for key in (cfg.input_key, cfg.label_key, *([cfg.image_key] if cfg.image_key else [])):
        if key not in row:
            raise Error(f"{where} has no {key!r} field (its fields: {sorted(row)}); fix the data or the split's keys")
    prompt = row[cfg.input_key]
    if isinstance(prompt, str):
        text = cfg.prompt_template.format(input=prompt) if cfg.prompt_template else prompt
        prompt = ([{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []) + [
            {"role": "user", "content": text}
        ]
    images = row[cfg.image_key] if cfg.image_key else []
    return {
        "prompt": prompt,
        "label": row[cfg.label_key],
        "reference": row.get(cfg.reference_key) if cfg.reference_key else None,
        "images": list(images) if isinstance(images, list | tuple) else [images],
        "row": row,
    }


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise Error(f"{path}:{n} is not valid JSON: {exc}") from None
