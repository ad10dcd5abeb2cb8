"""Several envs in one run (``--env ID:WEIGHT`` repeated): the sampler's proportions and resume, bad mixes refused
before anything starts, per-env rollout metrics and groups; then a real mixed SFT and RL run of three envs (one of
them multi-turn, two seats a game) on a local Ray instance."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter

import pytest

from molt_envs import Trajectory
from molt_train import rl_cli
from molt_train.config import parse
from molt_train.data import MixSampler, env_mix
from molt_train.rl_batch import rollout_metrics

RL_BASE = ["--actor.model_name_or_path", "m", "--ckpt.output_dir", "out"]
MIX = {"a": 0.5, "b": 0.3, "c": 0.2}


def mix_rows(sizes: dict[str, int]) -> list[dict]:
    return [{"prompt": f"{env}{i}", "env": env} for env, n in sizes.items() for i in range(n)]


def test_every_prefix_of_the_draws_follows_the_weights_within_one_row_per_env():
    rows = mix_rows({"a": 7, "b": 5, "c": 3})
    sampler = MixSampler(rows, MIX, batch_size=4, seed=0)
    counts: Counter = Counter()
    for k in range(25):
        counts.update(rows[i]["env"] for i in sampler.batch(k))
        drawn = 4 * (k + 1)
        assert all(abs(counts[e] - w * drawn) < 1 + 1e-9 for e, w in MIX.items()), (k, counts)
    assert sampler.state()["positions"] == {e: counts[e] for e in MIX}


def test_each_env_goes_through_all_its_rows_before_repeating_one():
    rows = mix_rows({"a": 7, "b": 5, "c": 3})
    sampler = MixSampler(rows, MIX, batch_size=5, seed=3)
    drawn = [i for k in range(6) for i in sampler.batch(k)]  # 15 of a's rows: two passes and one more
    of_a = [i for i in drawn if rows[i]["env"] == "a"]
    assert sorted(of_a[:7]) == sorted(of_a[7:14]) == list(range(7))
    assert of_a[:7] != of_a[7:14]  # a fresh permutation per pass


def test_a_resumed_sampler_continues_each_envs_position():
    rows = mix_rows({"a": 7, "b": 5, "c": 3})
    whole = MixSampler(rows, MIX, batch_size=4, seed=1)
    first = [whole.batch(k) for k in range(3)]
    state = json.loads(json.dumps(whole.state()))  # as state.json holds it
    rest = [whole.batch(k) for k in range(3, 8)]
    resumed = MixSampler(rows, MIX, batch_size=4, seed=1, state=state, start=3)
    assert [resumed.batch(k) for k in range(3, 8)] == rest
    assert MixSampler(rows, MIX, batch_size=4, seed=1).batch(2) == first[2]  # random access replays
    # a changed mix on resume: the envs kept continue where they were, a new one starts at its beginning
    changed = MixSampler(rows, {"a": 0.5, "c": 0.5}, batch_size=4, seed=1, state=state, start=3)
    changed.batch(3)
    assert changed.state()["positions"] == {"a": state["positions"]["a"] + 2, "c": state["positions"]["c"] + 2}


def test_repeated_env_flags_parse_into_a_normalised_mix():
    cfg = parse("rl", ["--env", "molt/arith-v1:3", "--env", "molt/gsm8k-v1", *RL_BASE])
    assert cfg.env == ("molt/arith-v1:3", "molt/gsm8k-v1")
    assert [(e.env_id, e.weight) for e in env_mix(cfg)] == [("molt/arith-v1", 0.75), ("molt/gsm8k-v1", 0.25)]
    sft = parse("sft", ["--env", "molt/arith-v1:1", "--env", "molt/gsm8k-v1:1", "--model.config", "tiny", *RL_BASE[2:]])
    assert [e.weight for e in env_mix(sft)] == [0.5, 0.5]
    assert parse("rl", ["--env", "molt/arith-v1", *RL_BASE]).env == ("molt/arith-v1",)  # one env as before


ARITH, GSM = ["--env", "molt/arith-v1"], ["--env", "molt/gsm8k-v1"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*ARITH, "--env", "molt/arithh-v1:0.5"], r"--env 'molt/arithh-v1:0.5'.*molt-env list"),
        (["--env", "molt/arith-v1:0"], r"--env 'molt/arith-v1:0': the weight must be a finite number > 0"),
        (["--env", "molt/arith-v1:-2"], r"finite number > 0, got -2.0"),
        (["--env", "molt/arith-v1:lots"], r"the weight 'lots' is not a number"),
        ([*ARITH, "--env", "molt/arith-v1:2"], r"'molt/arith-v1' is given twice"),
        ([*ARITH, *GSM, "--train.agent_path", "x.py"], r"--train.agent_path 'x.py' .* not a mix"),
        ([*ARITH, *GSM, "--data.prompt_dataset", "p.jsonl"], r"--data.prompt_dataset 'p.jsonl' .* not a mix"),
    ],
)
def test_a_bad_mix_is_refused_by_name_before_any_actor_starts(argv, message, monkeypatch, capsys):
    def no_trainer(cfg):
        raise AssertionError("the trainer (and its Ray actors) started for a refused mix")

    monkeypatch.setattr(rl_cli, "RLTrainer", no_trainer)
    with pytest.raises(SystemExit) as info:
        rl_cli.main([*argv, *RL_BASE])
    assert info.value.code == 2
    assert re.search(message, capsys.readouterr().err), message


def traj(reward: float, rollout: str, group: str, seat: str | None = None) -> Trajectory:
    t = Trajectory(reward=reward, rollout_id=rollout, group_id=group, seat=seat)
    t.append_observation([1, 2])
    t.append_action([3, 4], [-0.1, -0.2])
    return t


def test_rollout_metrics_are_reported_per_env_and_overall():
    trajs = [
        traj(1.0, "r0", "0:x:0"),
        traj(0.0, "r1", "0:x:0"),
        traj(1.0, "r2", "0:y:5/p1"),
        traj(-1, "r3", "0:y:5/p2"),
    ]
    batch = {
        "trajectories": trajs,
        "trajectory_envs": ["x", "x", "y", "y"],
        "dropped": {"timeout": 2},
        "num_rollouts": 5,
        "per_env": {"x": {"num_rollouts": 2, "dropped": {}}, "y": {"num_rollouts": 3, "dropped": {"timeout": 2}}},
        "start": 0.0,
        "end": 1.0,
    }
    m = rollout_metrics(batch)
    assert m["rollout/x/reward_mean"] == 0.5 and m["rollout/x/num_rollouts"] == 2 and m["rollout/x/dropped_total"] == 0
    assert m["rollout/y/kept_rollouts"] == 2 and m["rollout/y/reward_mean"] == 0.0  # a game's two seats
    assert m["rollout/y/dropped/timeout"] == 2 and "rollout/x/dropped/timeout" not in m
    assert m["rollout/num_rollouts"] == 5 and m["rollout/dropped_total"] == 2 and m["rollout/kept_rollouts"] == 4
    assert m["rollout/reward_mean"] == pytest.approx(0.25)


ARITH_ID, GSM_ID, GAME_ID = "molt/arith-v1", "molt/gsm8k-v1", "molt/tictactoe-v1"


def records_of(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def mixed_sft(ray_local, tmp_path_factory):
    """A tiny model SFT'd from scratch on a 3:1 mix of two envs' references (its tokenizer trained on both)."""
    from molt_train import sft_cli

    out = tmp_path_factory.mktemp("mixed-sft")
    argv = ["--env", f"{ARITH_ID}:3", "--env", f"{GSM_ID}:1", "--model.config", "tiny", "--model.hidden_size", "32"]
    argv += ["--train.num_steps", "3", "--train.batch_size", "16", "--actor.adam.lr", "3e-3", "--data.max_len", "512"]
    argv += ["--data.max_samples", "64", "--eval.max_samples", "2", "--rollout.max_new_tokens", "4"]
    argv += ["--ckpt.output_dir", str(out)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert sft_cli.main([*argv, "--no-logger.progress"]) == 0
    return out, printed.getvalue()


@pytest.mark.slow
def test_a_mixed_sft_run_draws_each_batch_by_weight_and_scores_each_env(mixed_sft):
    out, printed = mixed_sft
    records = records_of(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r[f"train/{ARITH_ID}/rows"] == 12 and r[f"train/{GSM_ID}/rows"] == 4 for r in records)
    assert f"{ARITH_ID}: " in printed and f"{GSM_ID}: " in printed  # the final eval, per env


@pytest.mark.slow
def test_a_mixed_rl_run_of_three_envs_reports_each_env_and_keeps_the_proportions(mixed_sft, tmp_path):
    sft_dir = mixed_sft[0]
    import asyncio

    import env_registry
    from molt_train import report
    from molt_train.data import load_rows
    from molt_train.rl_trainer import RLTrainer
    from molt_train.rollout import RolloutWorker

    weights = {ARITH_ID: 0.5, GSM_ID: 0.25, GAME_ID: 0.25}
    argv = [a for env, w in zip(weights, (2, 1, 1), strict=True) for a in ("--env", f"{env}:{w}")]
    argv += ["--actor.model_name_or_path", str(sft_dir / "hf"), "--ckpt.output_dir", str(tmp_path / "rl")]
    argv += ["--train.num_steps", "3", "--ckpt.save_steps", "2", "--rollout.batch_size", "8"]
    argv += ["--rollout.n_samples_per_prompt", "2", "--algo.advantage.estimator", "grpo", "--data.max_len", "512"]
    argv += [
        "--rollout.max_new_tokens",
        "4",
        "--eval.max_samples",
        "2",
        "--actor.adam.lr",
        "1e-3",
        "--no-logger.progress",
    ]
    cfg = parse("rl", argv)

    # one batch straight from the rollout worker: every group holds one env, each sample its env's ID and hash
    worker = RolloutWorker(
        str(sft_dir / "hf"), env_id=list(weights), agent_path=None, max_len=512, timeout_s=120, max_batch_size=64
    )
    worker.set_prompts(load_rows(cfg), 8, seed=0, weights=weights)
    batch = asyncio.run(worker.generate_step(0, {"temperature": 1.0, "max_tokens": 4}, n_samples=2, seed=0))
    groups: dict[str, set] = {}
    for t in batch["trajectories"]:
        groups.setdefault(t.group_id, set()).add(t.env_id)
        assert t.spec_hash == env_registry.spec(t.env_id).hash
    assert all(len(envs) == 1 for envs in groups.values()), groups
    assert {next(iter(e)) for e in groups.values()} == set(weights)
    seats = [t for t in batch["trajectories"] if t.env_id == GAME_ID]
    assert seats and all(t.seat in ("player_1", "player_2") and t.group_id.endswith("/" + t.seat) for t in seats)

    trainer = RLTrainer(cfg)
    try:
        trainer.run()
    finally:
        trainer.shutdown()
    records = records_of(tmp_path / "rl")
    assert [r["step"] for r in records] == [1, 2, 3]
    drawn = Counter()
    for r in records:
        per_env = {env: r[f"rollout/{env}/num_rollouts"] for env in weights}
        assert sum(per_env.values()) == r["rollout/num_rollouts"] == 16
        assert all(abs(per_env[env] / 16 - w) <= 1 / 8 for env, w in weights.items()), per_env  # one prompt
        drawn.update(per_env)
        for env in weights:
            assert f"rollout/{env}/reward_mean" in r
            dropped = sum(v for k, v in r.items() if k.startswith(f"rollout/{env}/dropped/"))
            assert r[f"rollout/{env}/kept_rollouts"] >= r[f"rollout/{env}/num_rollouts"] - dropped  # seats: >=
            assert r[f"rollout/{env}/dropped_total"] == dropped
        assert r["rollout/dropped_total"] == sum(r[f"rollout/{env}/dropped_total"] for env in weights)
    assert all(abs(drawn[env] / 48 - w) <= 0.05 for env, w in weights.items()), drawn
    final = records[-1]
    assert all(final[f"eval/{env}/num_rows"] == 2 and -1 <= final[f"eval/{env}/accuracy"] <= 1 for env in weights)
    assert final["eval/num_rows"] == 6
    state = json.loads((tmp_path / "rl" / "checkpoints" / "step_2" / "state.json").read_text())
    assert state["data"]["positions"] == {ARITH_ID: 8, GSM_ID: 4, GAME_ID: 4}  # each env's position at step 2
    panels = dict(report.curves(records))
    assert set(panels["reward"]) == {"rollout/reward_mean", *(f"rollout/{env}/reward_mean" for env in weights)}
    assert set(panels["held-out accuracy"]) == {"eval/accuracy", *(f"eval/{env}/accuracy" for env in weights)}
    assert report.main([str(tmp_path / "rl")]) == 0


@pytest.mark.slow
def test_a_mixed_run_locks_its_envs_and_a_resume_names_an_env_whose_version_changed(mixed_sft, tmp_path, monkeypatch):
    """``molt_env_lock.json``: the envs trained on (ID, package, version, spec hash, weight) in ``state.json`` and
    every ``hf/``; resuming after an env was re-registered in another version warns naming it (old -> new), and its
    trajectories (still of the old spec in the rollout worker) are counted as ``rollout/<ID>/off_lock``."""
    import env_registry
    from env_registry.registry import registry

    sft_dir = mixed_sft[0]
    sft_lock = json.loads((sft_dir / "hf" / "molt_env_lock.json").read_text())  # SFT stamps its hf/ as well
    assert [(e["id"], e["weight"]) for e in sft_lock["envs"]] == [(ARITH_ID, 0.75), (GSM_ID, 0.25)]

    out = tmp_path / "rl"
    argv = ["--env", f"{ARITH_ID}:3", "--env", f"{GSM_ID}:1", "--actor.model_name_or_path", str(sft_dir / "hf")]
    argv += ["--ckpt.output_dir", str(out), "--ckpt.save_steps", "1", "--rollout.batch_size", "4"]
    argv += ["--rollout.n_samples_per_prompt", "2", "--algo.advantage.estimator", "grpo", "--data.max_len", "512"]
    argv += ["--rollout.max_new_tokens", "4", "--eval.max_samples", "1", "--no-logger.progress"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert rl_cli.main([*argv, "--train.num_steps", "2"]) == 0
    state = json.loads((out / "checkpoints" / "step_1" / "state.json").read_text())
    lock = state["env_lock"]
    expected = [
        (env, "molt-ecosystem", env_registry.spec(env).package_version, env_registry.spec(env).hash, weight)
        for env, weight in ((ARITH_ID, 0.75), (GSM_ID, 0.25))
    ]
    assert [(e["id"], e["package"], e["version"], e["spec_hash"], e["weight"]) for e in lock["envs"]] == expected
    assert json.loads((out / "checkpoints" / "step_1" / "hf" / "molt_env_lock.json").read_text()) == lock
    assert json.loads((out / "hf" / "molt_env_lock.json").read_text()) == lock
    records = records_of(out)
    assert all(f"rollout/{env}/num_rollouts" in r for r in records for env in (ARITH_ID, GSM_ID))
    assert not any(k.endswith("/off_lock") for r in records for k in r)  # every trajectory of the locked specs

    was = env_registry.spec(GSM_ID)
    monkeypatch.setitem(registry._specs, GSM_ID, was)  # the original comes back after the test
    fields = was.model_dump(exclude={"id", "entry_point", "package_version"})
    with pytest.warns(UserWarning, match="overriding the registration"):
        env_registry.register(GSM_ID, was.entry_point, **fields, package_version="9.9.9")
    now = env_registry.spec(GSM_ID)
    with contextlib.redirect_stdout(io.StringIO()), pytest.warns(UserWarning) as caught:
        assert rl_cli.main([*argv, "--train.num_steps", "3", "--ckpt.load_enable"]) == 0
    messages = [str(w.message) for w in caught]
    change = f"{GSM_ID}: molt-ecosystem {was.package_version} -> 9.9.9, spec hash {was.hash} -> {now.hash}"
    assert any(m.startswith("resuming ") and m.endswith(change) for m in messages), messages
    assert not any(ARITH_ID in m and m.startswith("resuming ") for m in messages)  # unchanged: not named
    resumed = json.loads((out / "checkpoints" / "step_2" / "state.json").read_text())["env_lock"]
    assert [e["version"] for e in resumed["envs"]] == [expected[0][2], "9.9.9"]
    step3 = records_of(out)[-1]
    assert step3[f"rollout/{GSM_ID}/off_lock"] == step3[f"rollout/{GSM_ID}/kept_rollouts"] > 0
    assert f"rollout/{ARITH_ID}/off_lock" not in step3
