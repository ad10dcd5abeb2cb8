"""``molt-train report RUN_DIR``: plot a run's metrics.jsonl to RUN_DIR/report.png (reward, held-out accuracy, KL,
lengths vs step; a mixed run's reward and accuracy per env too)."""

from __future__ import annotations

import argparse
import fnmatch
from collections.abc import Sequence
from pathlib import Path

from molt_train.metrics import read_metrics

PANELS = [  # key patterns (fnmatch): a mixed run adds a curve per env
    ("reward", ["rollout/reward_mean", "rollout/*/reward_mean"]),
    ("held-out accuracy", ["eval/accuracy", "eval/*/accuracy"]),
    ("KL", ["kl", "mismatch/k3_kl"]),
    ("length (tokens)", ["rollout/response_length", "eval/response_length"]),
]


def curves(records: list[dict[str, float]]) -> list[tuple[str, list[str]]]:
    """Each panel's title and the logged keys it plots (its patterns matched against ``records``' keys)."""
    logged = sorted(set().union(*records)) if records else []
    return [(name, [k for p in patterns for k in fnmatch.filter(logged, p)]) for name, patterns in PANELS]


def write_report(run_dir: str | Path, title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    for ax, (name, keys) in zip(axes, curves(records), strict=True):
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o" if len(points) < 30 else None, markersize=3, label=key)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.suptitle(title or str(Path(run_dir).resolve().name))
    fig.tight_layout()
    out = Path(run_dir) / "report.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="molt-train report", description=__doc__)
    parser.add_argument("run_dir", help="a molt-train run directory (holds metrics.jsonl)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        out = write_report(args.run_dir, args.title)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    print(f"wrote {out}")
    return 0
