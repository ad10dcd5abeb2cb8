"""Issue 20's staleness A/B on the demo: the demo's recipe (``molt_train.demo.Recipe``) with RL run three ways, on
several seeds, each from the same SFT start:

- ``on-policy``: ``--train.force_sync_mode`` (the demo's default): rollout k+1 starts after step k's weight sync;
- ``stale``: ``--no-train.force_sync_mode`` (queue 1; the trainer's default before this A/B): rollout k+1 overlaps
  step k, so every batch was sampled by the policy one step behind, and nothing corrects for it;
- ``stale+tis``: the same overlap, with token-level truncated IS correction against the behaviour policy's log-probs
  (``--algo.advantage.is_correction_level token --algo.advantage.is_correction_mode trunc``).

Run: ``.venv/bin/python benchmarks/staleness_ab.py --seeds 42 43 44`` (one demo run per seed and variant, about
5 minutes each on 2 quiet cores; ``--variants`` picks some). ``--env ID`` runs the same A/B on another single-turn
env (e.g. ``rg/letter-counting-v1``): ``--demos`` demonstrations, SFT for ``--sft-steps`` only (the start; no
baseline is trained), RL with answers up to ``--max-new-tokens``. Each run's ``result.json`` lands in
``--output_dir/<variant>/seed<N>`` and is read, not rerun, when it exists. Prints a table of the held-out pass@1
curves (RL step -> accuracy) and the final accuracy per seed and variant, then each variant against ``on-policy``
(mean points of pass@1, and the ratio of RL's training seconds: what the overlap saves).

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): one seed of ``demo_seeds.SMOKE_RECIPE`` (the
recipe at tiny sizes), ``on-policy`` and ``stale+tis`` (whose flags are ``stale``'s plus the correction's), in a
temporary directory: the table and the comparison in about a minute, figures meaningless.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # demo_seeds, when imported from elsewhere

from demo_seeds import SMOKE_RECIPE  # noqa: E402

from molt_train.demo import Recipe, run  # noqa: E402

SYNC = "--train.force_sync_mode"
TIS = ("--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "trunc")


def variants(recipe: Recipe) -> dict[str, Recipe]:
    """The three RL settings, as recipes that differ from ``recipe`` only in their RL flags."""
    stale = tuple("--no-train.force_sync_mode" if f == SYNC else f for f in recipe.rl_flags)
    if stale == recipe.rl_flags:
        raise SystemExit(f"the demo recipe's RL flags lack {SYNC}; this A/B assumes it runs on-policy")
    return {
        "on-policy": recipe,
        "stale": dataclasses.replace(recipe, rl_flags=stale),
        "stale+tis": dataclasses.replace(recipe, rl_flags=stale + TIS),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--variants", nargs="+", default=["on-policy", "stale", "stale+tis"])
    parser.add_argument("--output_dir", default="runs/staleness_ab")
    parser.add_argument("--env", help="another env than the demo's (its start only: SFT for --sft-steps, then RL)")
    parser.add_argument("--demos", type=int, default=256, help="with --env: demonstrations SFT sees")
    parser.add_argument("--sft-steps", type=int, default=100, help="with --env: SFT steps of the RL start")
    parser.add_argument("--max-new-tokens", type=int, default=12, help="with --env: the answer's token budget")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, about a minute: the code path, not figures")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.variants = args.seeds[:1], ["on-policy", "stale+tis"]
        with tempfile.TemporaryDirectory(prefix="staleness-ab-smoke-") as tmp:
            args.output_dir = tmp
            ab(args, SMOKE_RECIPE)
    else:
        ab(args, Recipe())


def ab(args: argparse.Namespace, recipe: Recipe) -> None:
    if args.env:
        recipe = dataclasses.replace(
            recipe, env=args.env, demos=args.demos, sft_start=args.sft_steps, sft_steps=args.sft_steps,
            eval_every=args.sft_steps, max_new_tokens=args.max_new_tokens,
        )  # fmt: skip
    recipes = variants(recipe)
    unknown = sorted(set(args.variants) - set(recipes))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {sorted(recipes)}")
    finals: dict[str, list[float]] = {v: [] for v in args.variants}
    train_s: dict[str, list[float]] = {v: [] for v in args.variants}
    for seed in args.seeds:
        for name in args.variants:
            out = Path(args.output_dir) / name / f"seed{seed}"
            saved = out / "result.json"
            r = json.loads(saved.read_text()) if saved.is_file() else run(recipes[name], out, seed, progress=False)
            finals[name].append(100 * r["rl"]["accuracy"])
            train_s[name].append(r["rl"]["train_s"])
            curve = "  ".join(f"{step}:{100 * acc:.1f}" for step, acc, _ in r["rl_curve"])
            print(f"seed {seed} {name:10s} RL {100 * r['rl']['accuracy']:.1f}%  ({r['rl']['train_s']:.0f} s)  {curve}")
    print("\n| variant | final held-out pass@1 per seed | mean |\n|---|---|---|")
    for name, accs in finals.items():
        print(f"| {name} | {' / '.join(f'{a:.1f}%' for a in accs)} | {statistics.mean(accs):.1f}% |")
    if "on-policy" in finals:
        base_acc, base_s = statistics.mean(finals["on-policy"]), statistics.mean(train_s["on-policy"])
        for name in [v for v in finals if v != "on-policy"]:
            print(
                f"{name} vs on-policy: mean pass@1 {statistics.mean(finals[name]) - base_acc:+.1f} points, "
                f"ratio of RL training s {statistics.mean(train_s[name]) / base_s:.2f}x"
            )


if __name__ == "__main__":
    main()
