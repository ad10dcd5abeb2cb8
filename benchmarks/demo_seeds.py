"""The demo's recipe on ten seeds: ``molt-train demo`` for seeds 42..51, one after another, and a table of the
figures (per seed, then min / median / max of RL's gain over the SFT baseline, failures included) written into
``docs/demo.md`` and ``benchmarks/README.md`` between their ``demo-seeds`` markers.

Run: ``.venv/bin/python benchmarks/demo_seeds.py`` (about 5 minutes a seed on 2 quiet cores). A seed whose
``result.json`` exists under ``--output_dir`` is read, not rerun (``--rerun`` to run it again), so an interrupted
study continues where it stopped.

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): one seed of ``SMOKE_RECIPE`` (the recipe at
tiny sizes: 2 SFT steps of a 32-wide model, 2 RL steps of 4 x 4 samples, 16 test rows) in a temporary directory,
the table printed and written nowhere; figures meaningless.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import tempfile
from pathlib import Path

from molt_train.demo import Recipe, run

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "docs" / "demo.md", ROOT / "benchmarks" / "README.md")
BEGIN, END = "<!-- demo-seeds:begin -->", "<!-- demo-seeds:end -->"
BAR_BASELINE, BAR_START = 15.0, 20.0  # points RL must gain over the SFT baseline and over its start
# `--smoke` (and staleness_ab.py's): the demo's code path at tiny sizes, in seconds
SMOKE_RECIPE = dataclasses.replace(
    Recipe(),
    demos=16,
    sft_start=2,
    sft_steps=2,
    eval_every=2,
    rl_steps=2,
    rl_eval_every=2,
    eval_rows=16,
    sft_flags=("--model.config", "tiny", "--model.hidden_size", "32", "--train.batch_size", "16"),
    rl_flags=(
        "--algo.advantage.estimator", "grpo", "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "4",
        "--actor.adam.lr", "1e-3", "--train.force_sync_mode",
    ),
)  # fmt: skip


def table(results: list[dict]) -> str:
    """Markdown: one row per seed, then the spread of the gain over the baseline."""
    lines = [
        "| seed | SFT start | SFT baseline (best step) | RL | RL - baseline | RL - start | training s: baseline / "
        "start + RL | bars met | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    gains, met = [], 0
    for r in results:
        start, base, rl = (100 * r[k]["accuracy"] for k in ("sft_start", "baseline", "rl"))
        base_s, start_rl_s = r["baseline"]["train_s"], r["sft_start"]["train_s"] + r["rl"]["train_s"]
        gains.append(rl - base)
        ok = rl - base >= BAR_BASELINE and rl - start >= BAR_START and base_s >= start_rl_s
        met += ok
        lines.append(
            f"| {r['seed']} | {start:.1f}% | {base:.1f}% ({r['baseline']['best_step']}) | {rl:.1f}% | "
            f"{rl - base:+.1f} | {rl - start:+.1f} | {base_s:.0f} / {start_rl_s:.0f} | {'yes' if ok else '**no**'} | "
            f"{r['wall_s']:.0f} s |"
        )
    lines.append("")
    lines.append(
        f"Gain over the SFT baseline on {len(results)} seeds: min {min(gains):+.1f}, median "
        f"{statistics.median(gains):+.1f}, max {max(gains):+.1f} points; every bar (+{BAR_BASELINE:.0f} over the "
        f"baseline, +{BAR_START:.0f} over the start, the baseline's training seconds at least SFT start + RL's) met "
        f"on {met} of {len(results)}."
    )
    return "\n".join(lines)


def write_into_doc(text: str, doc: Path) -> None:
    """Replace what is between the markers of ``doc`` with ``text``."""
    content = doc.read_text(encoding="utf-8")
    if BEGIN not in content or END not in content:
        raise SystemExit(f"{doc} has no {BEGIN} ... {END} markers to write the table between")
    block = f"{BEGIN}\n{text}\n{END}"
    doc.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, content, flags=re.S))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(42, 52)))
    parser.add_argument("--output_dir", default="runs/demo_seeds")
    parser.add_argument("--rerun", action="store_true", help="run seeds that already have a result.json again")
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="print the table only")
    parser.add_argument(
        "--smoke", action="store_true", help="one seed of SMOKE_RECIPE, seconds, nothing written: the code path"
    )
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.rerun, args.doc = args.seeds[:1], True, False
        with tempfile.TemporaryDirectory(prefix="demo-seeds-smoke-") as tmp:
            args.output_dir = tmp
            study(args, SMOKE_RECIPE)
    else:
        study(args, Recipe())


def study(args: argparse.Namespace, recipe: Recipe) -> None:
    results = []
    for seed in args.seeds:
        out = Path(args.output_dir) / f"seed{seed}"
        saved = out / "result.json"
        if saved.is_file() and not args.rerun:
            results.append(json.loads(saved.read_text()))
        else:
            results.append(run(recipe, out, seed, progress=False))
        r = results[-1]
        print(
            f"seed {seed}: start {r['sft_start']['accuracy']:.1%}  baseline {r['baseline']['accuracy']:.1%}  "
            f"RL {r['rl']['accuracy']:.1%}  ({r['wall_s']:.0f} s)",
            flush=True,
        )
    text = table(results)
    print(text)
    if args.doc:
        for doc in DOCS:
            write_into_doc(text, doc)
            print(f"written into {doc}")


if __name__ == "__main__":
    main()
