"""``molt-train demo`` at tiny sizes, end to end on a real local Ray instance: the three figures, both curves, the
report, and identical figures from two runs of one seed."""

from __future__ import annotations

import os
from dataclasses import replace
from unittest import mock

import pytest

from molt_train import demo

TINY = replace(
    demo.Recipe(),
    sft_start=2,
    sft_steps=4,
    eval_every=2,
    rl_steps=2,
    rl_eval_every=1,
    eval_rows=40,
    sft_flags=("--model.config", "tiny", "--model.hidden_size", "32", "--train.batch_size", "16"),
    rl_flags=(
        "--algo.advantage.estimator",
        "grpo",
        "--rollout.n_samples_per_prompt",
        "4",
        "--rollout.batch_size",
        "4",
        "--actor.adam.lr",
        "1e-3",
        "--train.force_sync_mode",
    ),  # fmt: skip
)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    import ray

    with mock.patch.dict(os.environ):  # the demo pins numerics through the environment
        demo.start_ray(num_cpus=2)  # what the demo itself does: retried when a loaded machine misses Ray's deadline
        try:
            runs = [demo.run(TINY, tmp_path_factory.mktemp(f"demo{i}"), seed=7, progress=False) for i in range(2)]
        finally:
            ray.shutdown()
    return runs


def test_the_demo_reports_three_figures_and_writes_the_report(two_runs, capsys):
    result = two_runs[0]
    assert [s for s, _, _ in result["sft_curve"]] == [2, 4]
    assert [s for s, _, _ in result["rl_curve"]] == [0, 1, 2]
    assert result["rl_curve"][0][1] == result["sft_start"]["accuracy"]  # RL starts from the SFT start checkpoint
    assert result["baseline"]["accuracy"] == max(a for _, a, _ in result["sft_curve"])
    sft_scores, rl_scores = dict(result["scores"]["sft"]), dict(result["scores"]["rl"])
    assert list(sft_scores) == [2, 4] and list(rl_scores) == [1, 2]  # every evaluation keeps both figures
    assert all(sft_scores[s]["pass@1"] == a for s, a, _ in result["sft_curve"])
    assert all(0 <= v["pass@1"] <= v["accuracy"] <= 1 for v in [*sft_scores.values(), *rl_scores.values()])
    assert result["baseline"]["steps"] == 4 and result["train_prompts"] == 20000 and result["test_rows"] == 40
    assert len(result["rewards"]) == 2 and all(0 <= r <= 1 for _, r in result["rewards"])
    assert os.path.getsize(result["report"]) > 10_000
    demo.print_summary(result)
    printed = capsys.readouterr().out
    for line in ("SFT start", "SFT baseline", "RL  ", "points over the baseline", "exact match, pass@1"):
        assert line in printed
    demo.print_summary(result | {"metric": "accuracy"})  # the GPU recipe's: mean score, with exact match after it
    printed = capsys.readouterr().out
    assert "mean score, the env's partial credit" in printed and "exact match (pass@1): SFT start" in printed


def test_two_runs_of_one_seed_compute_the_same_figures(two_runs):
    first, second = ({k: r[k] for k in ("rewards", "sft_start", "baseline", "rl")} for r in two_runs)
    for figures in (first, second):
        for part in ("sft_start", "baseline", "rl"):
            figures[part] = {k: v for k, v in figures[part].items() if k != "train_s"}  # times differ
    assert first == second


@pytest.mark.gpu
def test_the_gpu_recipe_runs_through_vllm_at_tiny_sizes(tmp_path):
    """``molt-train demo --gpu``'s recipe, shrunk: vLLM colocated with the FSDP2 bf16 rank on one GPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm")
    small = replace(
        demo.GPU_RECIPE,
        demos=16,
        sft_start=2,
        sft_steps=4,
        eval_every=2,
        rl_steps=2,
        rl_eval_every=1,
        max_new_tokens=32,
        rl_flags=demo.GPU_RECIPE.rl_flags + ("--rollout.batch_size", "8", "--train.batch_size", "64"),
    )
    with mock.patch.dict(os.environ):
        result = demo.run(small, tmp_path, seed=0, progress=False)
    assert [s for s, _, _ in result["rl_curve"]] == [0, 1, 2] and result["test_rows"] == 200
    assert os.path.getsize(result["report"]) > 10_000
