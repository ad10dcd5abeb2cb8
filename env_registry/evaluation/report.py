"""The files of a finished eval: ``summary.json``, ``report.md`` and ``report.png`` (pass@k curve, reward histogram,
per-env rows for a mix). The figure needs matplotlib; without it ``report.md`` says so and the rest is written.
``load_pyplot`` is also what ``evaluate`` runs in a thread at the start of an eval, so matplotlib's import (about a
second) overlaps the sampling instead of adding to the end."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from env_registry.evaluation.summary import env_records
from env_registry.evaluation.tasks import EnvTask, EvalSettings


def write_outputs(
    out: Path,
    summary: dict[str, Any],
    tasks: Sequence[EnvTask],
    records: dict,
    settings: EvalSettings,
    ks: list[int],
    report: bool = True,
) -> None:
    """Write ``summary.json`` (atomically) and, with ``report``, ``report.md`` and ``report.png``."""
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, out / "summary.json")
    if not report:
        return
    rewards = {t.env_id: [r["reward"] for r in env_records(t, records, settings.n) if r["completed"]] for t in tasks}
    figure = plot(out / "report.png", summary, rewards, ks)
    (out / "report.md").write_text(markdown(summary, ks, figure))


def _per_env(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return summary.get("envs") or {summary["env_id"]: summary}


def markdown(summary: dict[str, Any], ks: list[int], figure: str | None) -> str:
    """``report.md``: what was evaluated, the headline numbers, one row per env, failures, the figure."""
    envs = _per_env(summary)
    mix = "envs" in summary
    lines = [
        f"# Eval of {', '.join(envs)}",
        "",
        f"- model: `{summary['model']}`",
        f"- split `{summary['split']}`, {summary['num_prompts']} prompts x n={summary['n']}, seed {summary['seed']}, "
        f"sampling {json.dumps({k: v for k, v in summary['sampling'].items() if k != 'split'})}",
        f"- started {summary['started']}, finished {summary['finished']}",
    ]
    if mix:
        lines.append("- mix weights: " + ", ".join(f"`{e}` {w:.3g}" for e, w in summary["weights"].items()))
        lines += ["", "| mix (weighted) | " + " | ".join(f"pass@{k}" for k in ks) + " | mean reward |"]
        lines.append("|---" * (len(ks) + 2) + "|")
        lines.append(
            "| all | " + " | ".join(f"{summary[f'pass@{k}']:.4f}" for k in ks) + f" | {summary['mean_reward']:.4f} |"
        )
    header = ["env", "package", *[f"pass@{k}" for k in ks], "mean reward", "tokens out", "turns", "p50 s", "failures"]
    lines += ["", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for env_id, s in envs.items():
        latency = s.get("latency_s") or {}
        cells = [
            f"`{env_id}`",
            f"{s.get('package') or '-'} {s.get('package_version') or ''}".strip(),
            *[f"{s[f'pass@{k}']:.4f}" for k in ks],
            f"{s['mean_reward']:.4f}",
            _fmt(s.get("completion_tokens_mean")),
            _fmt(s.get("turns_mean")),
            _fmt(latency.get("p50")),
            ", ".join(f"{r}: {c}" for r, c in s["failures"].items()) or "none",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"![pass@k and rewards]({figure})" if figure else "_report.png not drawn: matplotlib is not installed_"
    )
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def load_pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed), or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(path: Path, summary: dict[str, Any], rewards: dict[str, list[float]], ks: list[int]) -> str | None:
    """Draw ``report.png``; returns its file name, or None when matplotlib is missing."""
    plt = load_pyplot()
    if plt is None:
        return None
    envs = _per_env(summary)
    mix = "envs" in summary
    fig, axes = plt.subplots(1, 3 if mix else 2, figsize=(15 if mix else 10, 4))
    curve, hist = axes[0], axes[1]
    for env_id, s in envs.items():
        curve.plot(ks, [s[f"pass@{k}"] for k in ks], marker="o", label=env_id)
    if mix:
        curve.plot(ks, [summary[f"pass@{k}"] for k in ks], marker="s", color="black", linestyle="--", label="mix")
    curve.set(xlabel="k", ylabel="pass@k", title="pass@k", ylim=(0, 1.02))
    curve.set_xticks(ks)
    curve.legend(fontsize=7)
    values = [v for v in rewards.values() if v]
    if values:
        hist.hist(values, bins=20, stacked=True, label=[e for e, v in rewards.items() if v])
        hist.legend(fontsize=7)
    hist.set(xlabel="reward", ylabel="samples", title="reward histogram (completed samples)")
    if mix:
        bars = axes[2]
        names = list(envs)
        bars.barh(names, [envs[e]["pass@1"] if 1 in ks else envs[e]["mean_reward"] for e in names])
        bars.set(xlabel="pass@1" if 1 in ks else "mean reward", title="per env", xlim=(0, 1))
        bars.tick_params(axis="y", labelsize=7)
    if mix:  # the env names on the bars' axis vary in length: measured margins
        fig.tight_layout()
    else:  # fixed margins that fit the two fixed panels, without tight_layout's extra draw (half the render)
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.92, wspace=0.22)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name
