"""Checkpoints: ``<output_dir>/checkpoints/step_N/`` holds ``hf/`` (safetensors + tokenizer, loadable by
``AutoModelForCausalLM``), ``trainer_state.pt`` (optimizer, scheduler, RNG), ``state.json`` (step, data position),
``adapter/`` for a LoRA run and ``_critic/`` for a PPO (gae) run. A run of envs records the envs it trained on
(``env_registry.mix.env_lock``) in ``state.json`` (``env_lock``) and in each ``hf/`` as ``molt_env_lock.json``.

Everything is written into a temporary directory and renamed into place, and ``latest`` is replaced atomically
last, so a run killed at any instant leaves either the previous checkpoint or the new one, never half of one.
``--ckpt.save_hf`` copies each saved checkpoint's ``hf/`` to ``<output_dir>/hf_steps/step_N/``, outside the rotation.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from env_registry.mix import lock_changes, write_lock
from molt_train.worker_group import WorkerGroup


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def save(
    group: WorkerGroup,
    output_dir: str | Path,
    step: int,
    tokenizer_path: str,
    state: dict[str, Any],
    max_num: int,
    critic: WorkerGroup | None = None,
    env_lock: dict[str, Any] | None = None,
) -> Path:
    """``step_N``: the policy's hf/ and state, and with a ``critic`` group its ``_critic/`` (weights, optimizer);
    ``env_lock`` goes into ``state.json`` and ``hf/molt_env_lock.json``."""
    root = checkpoints_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    group.call("save", directory=str(tmp), tokenizer_path=tokenizer_path)
    if critic is not None:
        critic.call("save", directory=str(tmp))
    if env_lock is not None:
        state = {**state, "env_lock": env_lock}
        if (tmp / "hf").is_dir():
            write_lock(tmp / "hf", env_lock)
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    final = root / f"step_{step}"
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    _write_atomic(root / "latest", final.name)
    for old in sorted(root.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))[: -max(max_num, 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    pointer = checkpoints_dir(output_dir) / "latest"
    if not pointer.is_file():
        return None
    path = checkpoints_dir(output_dir) / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def read_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "state.json").read_text())


def warn_env_changes(state: dict[str, Any], env_lock: dict[str, Any] | None, checkpoint: Path) -> list[str]:
    """A resumed run: warn, naming each env whose version or spec hash differs from the one ``checkpoint`` was
    trained on (its ``state.json``'s ``env_lock``); returns the sentences."""
    changes = lock_changes(state.get("env_lock"), env_lock or {})
    for change in changes:
        warnings.warn(f"resuming {checkpoint} with a changed env: {change}", stacklevel=2)
    return changes


def export_hf(
    group: WorkerGroup, output_dir: str | Path, tokenizer_path: str, env_lock: dict[str, Any] | None = None
) -> Path:
    """Write the current weights to ``<output_dir>/hf`` atomically (model + tokenizer only, and ``env_lock`` as
    ``molt_env_lock.json``; a LoRA run also writes its PEFT adapter directory to ``<output_dir>/adapter``)."""
    out = Path(output_dir)
    tmp = out / ".tmp-export"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    group.call("save", directory=str(tmp), tokenizer_path=tokenizer_path, with_state=False)
    if env_lock is not None and (tmp / "hf").is_dir():
        write_lock(tmp / "hf", env_lock)
    for name in ("hf", "adapter"):
        if not (tmp / name).exists():
            continue
        final, old = out / name, out / f".old-{name}"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.rename(final, old)
        os.rename(tmp / name, final)
        shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return out / "hf"


def keep_hf(checkpoint: Path, output_dir: str | Path, step: int) -> Path:
    """``--ckpt.save_hf``: copy ``checkpoint``'s model to ``<output_dir>/hf_steps/step_N`` (atomically), where the
    rotation of ``--ckpt.max_num`` never reaches it."""
    root = Path(output_dir) / "hf_steps"
    root.mkdir(parents=True, exist_ok=True)
    tmp, final = root / f".tmp-step_{step}", root / f"step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint / "hf", tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    return final


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
