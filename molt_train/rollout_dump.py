"""``--train.rollout_dump_dir`` / ``--train.rollout_replay_dir``: rollout batches on disk, one pickle per batch.

A dump holds every batch the trainer took, as it took it (``DIR/batch_<index>.pkl``, index = step - 1: the
trajectories with their token ids, rollout log-probs and rewards, the drop counts and the timing), written
atomically. A replay reads them back in order, so a run can be re-trained on exactly the samples of another one with
no engine and no generation: same weights, same seed and same batches give the same losses, bit for bit.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any


def batch_path(directory: str | Path, index: int) -> Path:
    return Path(directory) / f"batch_{index:06d}.pkl"


def write(directory: str | Path, batch: dict[str, Any]) -> Path:
    """Dump ``batch`` (a rollout batch; its ``"step"`` is its index) into ``directory``."""
    path = batch_path(directory, batch["step"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
    return path


def read(directory: str | Path, index: int) -> dict[str, Any]:
    """Dumped batch ``index`` of ``directory``.

    Raises:
        FileNotFoundError: the dump holds no such batch (the message says how many it holds).
    """
    path = batch_path(directory, index)
    if not path.is_file():
        held = len(list(Path(directory).glob("batch_*.pkl")))
        raise FileNotFoundError(
            f"--train.rollout_replay_dir {str(directory)!r} has no batch {index} ({path.name}); it holds {held} "
            f"batches: replay at most --train.num_steps {held} (the dumping run's steps)"
        )
    with path.open("rb") as f:
        return pickle.load(f)  # noqa: S301 (a dump this trainer wrote; never an untrusted file)
