"""Self-play on ``molt/tictactoe-v3`` end to end on a real local Ray instance: a tiny model SFT'd on random legal
moves (``molt-train sft``), then ``molt-train rl`` self-play (two seats a game), scored by the eval path (the
``test`` split: seeded games against a uniformly random player) before and after. Test-sized: it checks the
pipeline, not learning (molt_envs/README.md has the measured numbers)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import env_registry
from molt_envs import SamplingParams

pytestmark = pytest.mark.slow
ENV = "molt/tictactoe-v3"
EVAL_GAMES = 100


def vs_random(model_path: Path) -> dict[str, float]:
    """Outcome rates of the model (greedy) on the test split's seeded games against a random player."""
    from molt_train.engines.hf import HFEngine

    engine = HFEngine.from_pretrained(str(model_path))
    runner = env_registry.runner_for(ENV)
    rows = env_registry.load_split(env_registry.spec(ENV), "test", EVAL_GAMES)
    params = SamplingParams(temperature=0.0, max_tokens=4)

    async def play():
        return await asyncio.gather(
            *[runner.execute(r["prompt"], r["label"], params, 512, engine.tokenizer, engine) for r in rows]
        )

    seats = [trajs[0] for trajs in asyncio.run(play())]
    assert all(t.ok for t in seats), [t.failure for t in seats if not t.ok][:1]
    n = len(seats)
    return {
        "win_or_draw": sum(1 - t.info["loss"] for t in seats) / n,
        "win": sum(t.info["win"] for t in seats) / n,
        "illegal": sum(t.info["illegal_move"] for t in seats) / n,
        "mean_reward": sum(t.reward for t in seats) / n,
    }


def frozen_checkpoint_seat_through_the_rollout_workers_loader(model_path: Path) -> None:
    """The rollout worker hands a game runner an hf engine for a ``checkpoint:PATH`` seat."""
    from molt_train.rollout import RolloutWorker

    worker = RolloutWorker(str(model_path), env_id=ENV, agent_path=None, max_len=512, timeout_s=60, max_batch_size=8)
    runner = env_registry.runner_for(ENV, seat_policies={"player_2": f"checkpoint:{model_path}"})
    runner.engine_loader = worker.runner.engine_loader
    params = SamplingParams(temperature=0.0, max_tokens=4)
    (traj,) = asyncio.run(runner.execute("game", {"seed": 0}, params, 512, worker.tokenizer, worker.engine))
    assert traj.ok and traj.seat == "player_1" and list(runner.engines) == [f"checkpoint:{model_path}"]


def test_self_play_runs_through_sft_rl_and_the_vs_random_eval(ray_local, tmp_path):
    from molt_train import rl_cli, sft_cli

    sft, rl = tmp_path / "sft", tmp_path / "rl"
    common = ["--env", ENV, "--data.max_len", "512", "--no-logger.progress"]
    sft_args = [
        "--data.split",
        "sft",
        "--model.config",
        "tiny",
        "--model.role_tokens",
        "--model.hidden_size",
        "32",
        "--model.num_layers",
        "2",
    ]
    sft_args += ["--train.num_steps", "10", "--train.batch_size", "16", "--actor.adam.lr", "3e-3"]
    assert sft_cli.main([*common, *sft_args, "--ckpt.output_dir", str(sft), "--eval.max_samples", "0"]) == 0
    frozen_checkpoint_seat_through_the_rollout_workers_loader(sft / "hf")
    rl_args = ["--actor.model_name_or_path", str(sft / "hf"), "--ckpt.output_dir", str(rl)]
    rl_args += ["--train.num_steps", "3", "--rollout.batch_size", "8", "--rollout.max_new_tokens", "4"]
    rl_args += ["--actor.adam.lr", "3e-4", "--algo.advantage.estimator", "reinforce", "--train.force_sync_mode"]
    rl_args += ["--eval.eval_at_start", "--eval.max_samples", "8", "--eval.max_new_tokens", "4"]
    assert rl_cli.main([*common, *rl_args]) == 0

    metrics = [json.loads(line) for line in (rl / "metrics.jsonl").read_text().splitlines()]
    evals = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]  # mean reward vs random: win - loss
    assert len(evals) == 2 and all(-1.0 <= e <= 1.0 for e in evals)
    steps = [m for m in metrics if "rollout/num_rollouts" in m]
    assert len(steps) == 3
    for m in steps:  # 8 self-play games a step, each giving its X seat and (unless X forfeited at once) its O seat
        assert m["rollout/num_rollouts"] == 8 and m["rollout/dropped_total"] == 0
        assert 8 <= m["rollout/kept_rollouts"] <= 16 and m["rollout/reward_mean"] >= -1.0
    outcome = vs_random(rl / "hf")
    assert outcome["win"] + outcome["illegal"] <= 1.0 and 0.0 <= outcome["win_or_draw"] <= 1.0
