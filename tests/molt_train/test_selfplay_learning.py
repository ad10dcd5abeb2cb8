"""Self-play learning on ``molt/tictactoe-v1``: a tiny model SFT'd on random legal moves (``molt-train sft``), then
``molt-train rl`` self-play, on a real local Ray instance; the eval path (the fixed ``test`` split: seeded games
against a uniformly random player, greedy) scores it before and after. Numbers: molt_envs/README.md."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import env_registry
from molt_envs import SamplingParams

pytestmark = pytest.mark.slow
ENV = "molt/tictactoe-v1"
EVAL_GAMES = 100


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


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


def test_self_play_raises_the_win_or_draw_rate_against_a_random_player(ray_local, tmp_path):
    from molt_train import rl_cli, sft_cli

    sft, rl = tmp_path / "sft", tmp_path / "rl"
    common = ["--env", ENV, "--data.max_len", "512", "--no-logger.progress"]
    sft_args = ["--data.split", "sft", "--model.config", "tiny", "--model.hidden_size", "64", "--model.num_layers", "2"]
    sft_args += ["--train.num_steps", "60", "--train.batch_size", "32", "--actor.adam.lr", "3e-3"]
    assert sft_cli.main([*common, *sft_args, "--ckpt.output_dir", str(sft), "--eval.max_samples", "0"]) == 0
    frozen_checkpoint_seat_through_the_rollout_workers_loader(sft / "hf")
    rl_args = ["--actor.model_name_or_path", str(sft / "hf"), "--ckpt.output_dir", str(rl)]
    rl_args += ["--train.num_steps", "15", "--rollout.batch_size", "16", "--rollout.max_new_tokens", "4"]
    rl_args += ["--actor.adam.lr", "2e-3", "--algo.advantage.estimator", "reinforce", "--train.force_sync_mode"]
    rl_args += ["--eval.eval_at_start", "--eval.max_samples", "40", "--eval.max_new_tokens", "4"]
    assert rl_cli.main([*common, *rl_args]) == 0

    metrics = [json.loads(line) for line in (rl / "metrics.jsonl").read_text().splitlines()]
    evals = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]  # mean reward vs random: win - loss
    assert len(evals) == 2 and evals[1] > evals[0]
    assert all(m["rollout/kept_rollouts"] == 32 for m in metrics if "rollout/kept_rollouts" in m)  # 16 games x 2 seats
    before, after = vs_random(sft / "hf"), vs_random(rl / "hf")
    print(json.dumps({"before": before, "after": after, "eval_accuracy": evals}))
    assert after["win_or_draw"] > before["win_or_draw"] and after["illegal"] < before["illegal"]
