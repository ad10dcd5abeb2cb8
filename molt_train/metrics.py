"""Per-step metrics: one JSON line per step in ``metrics.jsonl``, TensorBoard scalars, a rich progress bar (a mixed
run's shows each env's reward), and (``--logger.wandb_project``) a Weights & Biases run.

The W&B run lives in ``<output_dir>/wandb`` and its id is kept in ``<output_dir>/wandb/run_id``, so a resumed run
(``--ckpt.load_enable``) continues the same W&B run. ``WANDB_MODE=offline`` writes it there only (what ``wandb sync``
uploads later); online it streams as well.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from molt_train.config.groups import LoggerConfig


class MetricsLogger:
    def __init__(
        self,
        output_dir: str | Path,
        total_steps: int,
        start_step: int = 0,
        progress: bool = True,
        description: str = "train",
        logger: LoggerConfig | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # a fresh run replaces an earlier run's records; a resumed one appends (``read_metrics``: last record wins)
        self._file = self.path.open("a" if start_step else "w", encoding="utf-8")
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
        self._wandb = None
        if logger is not None and logger.wandb_project:
            self._wandb = _wandb_run(Path(output_dir), logger, config, resume=start_step > 0)
        self._progress = None
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
            )
            self._task = self._progress.add_task(description, total=total_steps, completed=start_step, status="")
            self._progress.start()

    def log(self, step: int, metrics: dict[str, Any], status_keys: Mapping[str, str] | Sequence[str] = ()) -> None:
        """Write one step's record; the progress bar shows ``status_keys`` (label -> key, or keys labelled by their
        last part)."""
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        for key, value in clean.items():
            self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self._progress is not None:
            labels = status_keys if isinstance(status_keys, Mapping) else {k.split("/")[-1]: k for k in status_keys}
            status = "  ".join(f"{label}={clean[k]:.3g}" for label, k in labels.items() if k in clean)
            self._progress.update(self._task, completed=step, status=status)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        self._tb.close()
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def _wandb_run(output_dir: Path, logger: LoggerConfig, config: dict[str, Any] | None, resume: bool) -> Any:
    """A W&B run of ``--logger.wandb_project`` in ``<output_dir>/wandb``; a resumed run continues its id."""
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "--logger.wandb_project needs the wandb package: pip install wandb (or drop the flag)"
        ) from None
    root = output_dir / "wandb"
    root.mkdir(parents=True, exist_ok=True)
    id_file = root / "run_id"
    run_id = id_file.read_text().strip() if resume and id_file.is_file() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id)
    return wandb.init(
        project=logger.wandb_project,
        name=logger.wandb_run_name,
        id=run_id,
        resume="allow",
        dir=str(output_dir),
        config=config,
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """The run's metrics, one dict per step; when a resumed run re-logged a step, its last record wins."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {run_dir} a molt-train run directory?")
    by_step: dict[int, dict[str, float]] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                by_step[int(record["step"])] = {**by_step.get(int(record["step"]), {}), **record}
    return [by_step[s] for s in sorted(by_step)]
