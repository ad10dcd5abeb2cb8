"""The trainer end to end on a real local Ray instance (num_cpus=2), real gloo FSDP2 ranks and tiny real models:
SFT, FSDP2 1-vs-2-worker parity, failure isolation, async overlap, weight-sync equality, checkpoints, report."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

import sandboxes
from molt_envs import SamplingParams, Trajectory
from molt_train.config import parse
from molt_train.experience import make_experience

AGENTS = Path(__file__).parent / "agents"


@pytest.fixture(scope="module")
def sft_run(ray_local, tmp_path_factory):
    from molt_train import sft_cli

    out = tmp_path_factory.mktemp("sft")
    rc = sft_cli.main(
        [
            "--env",
            "molt/arith-v1",
            "--model.config",
            "tiny",
            "--model.hidden_size",
            "32",
            "--ckpt.output_dir",
            str(out),
            "--train.num_steps",
            "15",
            "--train.batch_size",
            "32",
            "--actor.adam.lr",
            "3e-3",
            "--eval.max_samples",
            "16",
            "--rollout.max_new_tokens",
            "4",
            "--no-logger.progress",
        ]
    )
    assert rc == 0
    return out


def test_sft_trains_from_scratch_and_writes_a_loadable_model(sft_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    losses = [json.loads(line)["train/loss"] for line in (sft_run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 15
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3  # the assistant-only loss falls
    model = AutoModelForCausalLM.from_pretrained(sft_run / "hf")
    tokenizer = AutoTokenizer.from_pretrained(sft_run / "hf")
    assert model.config.vocab_size == len(tokenizer)
    assert [t for t in tokenizer.tokenize("12+345=") if t.isdigit()] == list("12345")  # one token per digit


def synthetic_experience(tokenizer_dir: Path, rows: int = 12) -> object:
    """Random token rows with actions at varying spans and random advantages (fixed seed)."""
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(rows):
        t = Trajectory(reward=float(i % 3), group_id=f"g{i // 4}", rollout_id=f"r{i}")
        prompt_len, action_len = 3 + i % 4, 2 + (i * 5) % 7
        t.append_observation(torch.randint(5, 100, (prompt_len,), generator=g).tolist())
        t.append_action(torch.randint(5, 100, (action_len,), generator=g).tolist(), [-1.0] * action_len)
        trajs.append(t)
    exp = make_experience(trajs, max_len=64, pad_id=0)
    exp.advantages = torch.randn(exp.action_mask.shape, generator=g) * exp.action_mask
    return exp


@pytest.mark.parametrize("agg_mode", ["token-mean", "prompt-mean-token-mean"])
def test_two_fsdp_workers_give_the_same_update_as_one(sft_run, agg_mode):
    from molt_train.worker_group import WorkerGroup

    # Adam with eps 1 makes the step ~ lr * grad (linear), so tiny float differences stay tiny after the update
    cfg = parse(
        "rl",
        [
            "--env",
            "molt/arith-v1",
            "--actor.model_name_or_path",
            str(sft_run / "hf"),
            "--ckpt.output_dir",
            "unused",
            "--actor.adam.lr",
            "1.0",
            "--actor.adam.eps",
            "1.0",
            "--actor.max_norm",
            "0",
            "--train.max_tokens_per_gpu",
            "40",
            "--actor.loss_agg_mode",
            agg_mode,
            "--actor.logprob_chunk_size",
            "16",
        ],
    )
    exp = synthetic_experience(sft_run / "hf")
    states, metrics = [], []
    for workers in (1, 2):
        actor = dataclasses.replace(cfg.actor, num_workers=workers)
        group = WorkerGroup(actor, cfg.train, str(sft_run / "hf"))
        try:
            before = group.call("full_state_dict")[0]
            metrics.append(group.train_step(exp, 0, cfg.algo, temperature=1.0))
            states.append(group.call("full_state_dict")[0])
        finally:
            group.shutdown()
    assert metrics[0]["train/micro_batches"] > 1  # the token budget split the batch
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=1e-5)
    moved = max(float((states[0][k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-3
    for key in states[0]:
        torch.testing.assert_close(states[1][key], states[0][key], atol=2e-5, rtol=1e-4, msg=key)


RL_FLAGS = [
    "--env",
    "molt/arith-v1",
    "--train.agent_path",
    str(AGENTS / "flaky_arith.py"),
    "--rollout.batch_size",
    "8",
    "--rollout.n_samples_per_prompt",
    "4",
    "--algo.advantage.estimator",
    "grpo",
    "--rollout.max_new_tokens",
    "4",
    "--eval.max_samples",
    "16",
    "--actor.adam.lr",
    "1e-3",
    "--no-logger.progress",
]


@pytest.fixture(scope="module")
def rl_run(sft_run, tmp_path_factory):
    from molt_train.rl_trainer import RLTrainer

    out = tmp_path_factory.mktemp("rl")
    cfg = parse(
        "rl",
        RL_FLAGS
        + [
            "--actor.model_name_or_path",
            str(sft_run / "hf"),
            "--ckpt.output_dir",
            str(out),
            "--train.num_steps",
            "4",
            "--ckpt.save_steps",
            "2",
            "--actor.num_workers",
            "2",
            "--algo.advantage.is_correction_level",
            "geo",
            "--algo.advantage.is_correction_threshold",
            "0.2",
            "5",
            "--no-train.force_sync_mode",  # overlapped, one step stale (the IS correction above covers it)
        ],
    )
    trainer = RLTrainer(cfg)
    trainer.run()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    yield trainer, out, records
    trainer.shutdown()


def test_failed_episodes_are_dropped_counted_and_the_run_goes_on(rl_run):
    _, _, records = rl_run
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    total = sum(r["rollout/num_rollouts"] for r in records)
    dropped = sum(r.get("rollout/dropped/failure_step", 0) for r in records)
    assert 0.05 * total <= dropped <= 0.4 * total  # ~20% injected
    for r in records:
        assert r["rollout/kept_rollouts"] + r["rollout/dropped_total"] == r["rollout/num_rollouts"]
        assert r["rollout/dropped_total"] == r.get("rollout/dropped/failure_step", 0)
    assert "eval/accuracy" in records[-1]
    assert all("is_filter_ratio" in r and "mismatch/k3_kl" in r for r in records)


def test_rollout_of_the_next_step_overlaps_training(rl_run):
    _, _, records = rl_run
    overlaps = [
        records[k + 1]["timing/rollout_start"] < records[k]["timing/train_end"] for k in range(len(records) - 1)
    ]
    assert all(overlaps), overlaps


def test_force_sync_mode_waits_for_the_weight_sync(sft_run, tmp_path):
    from molt_train.rl_trainer import RLTrainer

    cfg = parse(
        "rl",
        RL_FLAGS
        + [
            "--actor.model_name_or_path",
            str(sft_run / "hf"),
            "--ckpt.output_dir",
            str(tmp_path),
            "--train.num_steps",
            "3",
            "--train.force_sync_mode",
            "--eval.max_samples",
            "4",
            "--algo.kl.init_coef",
            "0.01",
            "--algo.kl.ref",
            "model",
            "--algo.kl.use_loss",
            "--algo.kl.estimator",
            "k3",
            "--train.check_weight_update_equal",
        ],
    )
    trainer = RLTrainer(cfg)
    try:
        trainer.run()
    finally:
        trainer.shutdown()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for k in range(len(records) - 1):
        assert records[k + 1]["timing/rollout_start"] >= records[k]["timing/train_end"]
        # strictly on-policy: the engine sampled with exactly the trainer's weights
        assert records[k + 1]["mismatch/abs_diff_mean"] < 1e-4
    assert all("kl_loss" in r and "kl" in r for r in records)  # KL to the frozen reference group, as a loss
    assert records[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy still equals the reference
    assert all(r["weight_sync/checked_params"] > 0 for r in records)  # every sync compared, none stale
    assert all({"mismatch/bitwise_frac", "mismatch/abs_diff_mean", "mismatch/k3_kl"} <= set(r) for r in records)


def test_weight_sync_leaves_engine_weights_equal_to_the_trainer(rl_run):
    import ray

    trainer, _, records = rl_run
    engine = ray.get(trainer.rollout.weights.remote())
    policy = trainer.policy.call("full_state_dict")[0]
    assert set(engine) == set(policy)
    for key, value in policy.items():
        assert torch.equal(engine[key], value), key
    assert records[-1]["weight_sync/bytes"] == sum(v.numel() * v.element_size() for v in policy.values())
    assert records[-1]["timing/weight_sync_move_s"] > 0


def test_checkpoints_load_with_automodel_and_hold_the_resume_state(rl_run):
    from transformers import AutoModelForCausalLM

    trainer, out, _ = rl_run
    ckpt = out / "checkpoints" / "step_2"
    assert json.loads((ckpt / "state.json").read_text())["step"] == 2
    assert (out / "checkpoints" / "latest").read_text() == "step_2"
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert {"optimizer", "scheduler", "torch_rng", "python_rng"} <= set(state)
    final = AutoModelForCausalLM.from_pretrained(out / "hf")
    policy = trainer.policy.call("full_state_dict")[0]
    for key, value in final.state_dict().items():
        if key != "lm_head.weight":
            assert torch.equal(value, policy[key]), key
    AutoModelForCausalLM.from_pretrained(ckpt / "hf")
    assert not list(out.glob(".tmp*")) and not list((out / "checkpoints").glob(".tmp*"))


def test_report_plots_the_run(rl_run):
    from molt_train import report

    _, out, _ = rl_run
    assert report.main([str(out)]) == 0
    png = out / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_sigkill_mid_training_then_resume_loses_at_most_one_step(sft_run, tmp_path):
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    from molt_train import checkpoint

    out = tmp_path / "rl"
    cmd = [
        sys.executable,
        "-m",
        "molt_train.cli",
        "rl",
        "--env",
        "molt/arith-v1",
        "--rollout.batch_size",
        "8",
        "--rollout.n_samples_per_prompt",
        "4",
        "--algo.advantage.estimator",
        "rloo",
        "--rollout.max_new_tokens",
        "4",
        "--eval.max_samples",
        "0",
        "--actor.model_name_or_path",
        str(sft_run / "hf"),
        "--ckpt.output_dir",
        str(out),
        "--train.num_steps",
        "5",
        "--ckpt.save_steps",
        "1",
        "--ray.num_cpus",
        "2",
        "--no-logger.progress",
    ]
    metrics = out / "metrics.jsonl"

    def logged_steps() -> list[int]:
        return [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.exists() else []

    with (tmp_path / "first.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while max(logged_steps(), default=0) < 2:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first run never reached step 2"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)  # mid-training: step 3 is in flight
        proc.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what this run started in its own session (its local Ray)
    last_done = max(logged_steps())
    resumed = checkpoint.read_state(checkpoint.latest(out))["step"]
    assert last_done - resumed <= 1
    assert last_done < 5

    second = subprocess.run(
        cmd + ["--ckpt.load_enable"], capture_output=True, text=True, timeout=300, start_new_session=True
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resumed from step {resumed}" in second.stdout
    assert sorted(set(logged_steps())) == list(range(1, 6))
    assert (out / "hf" / "model.safetensors").exists()


def rollout_worker(
    sft_run: Path, agent: str, prompts: list[tuple[str, str]], batch_size: int, timeout_s: float = 60
) -> object:
    """A rollout worker on the SFT run's model that runs the test agent ``agents/<agent>`` on ``prompts`` (each a
    user message and its label), ``batch_size`` prompts a step."""
    from molt_train.rollout import RolloutWorker

    worker = RolloutWorker(
        str(sft_run / "hf"),
        env_id=None,
        agent_path=str(AGENTS / agent),
        max_len=64,
        timeout_s=timeout_s,
        max_batch_size=64,
    )
    rows = [{"prompt": [{"role": "user", "content": prompt}], "label": label} for prompt, label in prompts]
    worker.set_prompts(rows, batch_size, seed=0)
    return worker


async def test_segment_lists_share_a_rollout_and_count_once_in_the_group_baseline(sft_run):
    from molt_train.algorithms import AdvantageInputs, get_estimator

    worker = rollout_worker(sft_run, "segmented_arith.py", [(f"{i}+1=", str(i + 1)) for i in range(6)], batch_size=3)
    batch = await worker.generate_step(0, {"temperature": 1.0, "max_tokens": 4}, n_samples=4, seed=0)
    trajs = batch["trajectories"]
    assert len(trajs) == 2 * 12 and batch["num_rollouts"] == 12
    assert len({t.rollout_id for t in trajs}) == 12 and len({t.group_id for t in trajs}) == 3
    exp = make_experience(trajs, 64, 0)
    exp.rewards = torch.tensor([float((i // 2) % 2 == 0) for i in range(len(trajs))])  # a rollout's segments share it
    adv, _ = get_estimator("rloo")(AdvantageInputs(exp.rewards, exp.action_mask, exp.group_ids, exp.rollout_ids))
    assert torch.equal(adv[0::2], adv[1::2])  # both segments of a rollout carry its advantage
    per_rollout = adv[0::2].sum(1) / exp.action_mask[0::2].sum(1)
    # with segments de-duplicated, each group of 4 rollouts is [1, 0, 1, 0]: leave-one-out gives +-2/3
    assert torch.allclose(per_rollout.abs(), torch.full_like(per_rollout, 2 / 3))


def test_jsonl_prompt_dataset_overrides_the_env_split(tmp_path):
    from molt_train.data import load_rows

    data = tmp_path / "prompts.jsonl"
    data.write_text('{"q": "2+2=", "a": "4"}\n{"q": "3+4=", "a": "7"}\n')
    cfg = parse(
        "rl",
        [
            "--env",
            "molt/arith-v1",
            "--actor.model_name_or_path",
            "m",
            "--ckpt.output_dir",
            "o",
            "--data.prompt_dataset",
            str(data),
            "--data.input_key",
            "q",
            "--data.label_key",
            "a",
        ],
    )
    rows = load_rows(cfg)
    assert rows[1] == {"prompt": [{"role": "user", "content": "3+4="}], "label": "7", "reference": None, "images": []}
    assert load_rows(cfg, "test")[0]["prompt"][-1]["content"].endswith("=")  # eval still reads the env's split
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, input_key="question"))
    with pytest.raises(ValueError, match="set --data.input_key"):
        load_rows(cfg)


async def test_chat_agent_rollouts_become_trainable_rows(sft_run):
    from molt_envs.chat_runner import close_session_servers

    worker = rollout_worker(sft_run, "chat_arith.py", [(f"{i}+2=", str(i + 2)) for i in range(4)], batch_size=2)
    try:
        batch = await worker.generate_step(0, {"temperature": 1.0, "max_tokens": 4}, n_samples=2, seed=0)
    finally:
        await close_session_servers()
    assert batch["dropped"] == {} and batch["num_rollouts"] == 4
    trajs = batch["trajectories"]
    assert len({t.rollout_id for t in trajs}) == 4 and len({t.group_id for t in trajs}) == 2
    exp = make_experience(trajs, 64, 0)
    assert (exp.action_mask.sum(1) > 0).all()
    for t, mask, logp in zip(trajs, exp.action_mask, exp.rollout_logp, strict=True):
        assert torch.allclose(
            logp[mask], torch.tensor([t.log_probs[i] for i in range(1, len(t.token_ids)) if t.action_mask()[i]])
        )


async def test_timeouts_and_raising_runners_are_dropped_by_reason(sft_run):
    prompts = [(p, "2") for p in ("hang", "raise", "1+1=")]
    worker = rollout_worker(sft_run, "misbehaving.py", prompts, batch_size=3, timeout_s=1.0)
    batch = await worker.generate_step(0, {"temperature": 1.0, "max_tokens": 4}, n_samples=2, seed=0)
    assert batch["dropped"] == {"timeout": 2, "runner_RuntimeError": 2}
    assert len(batch["trajectories"]) == 2 and batch["end"] - batch["start"] < 10


def jail_processes() -> dict[int, list[str]]:
    """The processes of this test process's local jails (their per-slot uids), with the cgroup dirs of each."""
    from sandboxes import local

    first, found = local.slot_uid(0), {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if first <= os.stat(f"/proc/{pid}").st_uid < first + local.SLOTS_PER_PROCESS:
                with open(f"/proc/{pid}/cgroup") as handle:  # "id:controllers:/path" (v2: no controllers)
                    fields = [line.strip().split(":", 2) for line in handle if "sandboxes-" in line]
                found[int(pid)] = [os.path.join("/sys/fs/cgroup", f[1].split(",")[0], f[2].lstrip("/")) for f in fields]
        except OSError:
            continue
    return found


@pytest.mark.skipif(bool(sandboxes.probe(docker=False).local_missing), reason="local isolation unavailable")
async def test_an_episode_past_its_deadline_releases_its_jail_and_session_slot(tiny_tokenizer):
    """``--rollout.timeout_s`` is the one deadline of an episode. A tool call spinning forever in its persistent
    sandbox session is cut there: the episode is dropped as "timeout" and everything it held is released: no process
    of its jail is left, its cgroups are gone, its session slot is free. An episode that swallows the cancellation
    and returns anyway is still dropped."""
    import asyncio

    import env_registry
    from molt_envs import Generation
    from molt_train.models.multimodal import placeholder_ids
    from molt_train.rollout import RolloutWorker
    from sandboxes import api, cgroups

    spin = '<tool_call>\n{"name": "python_executor", "arguments": {"code": "while True: pass"}}\n</tool_call>'

    class SpinningModel:  # every turn calls the tool with a snippet that never ends
        async def generate(self, prompt_ids, params, images=None):
            ids = tiny_tokenizer.encode(spin, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
            return Generation(ids, [-0.1] * len(ids), "stop")

    class StubbornRunner:  # ignores its cancellation and returns
        async def run_row(self, *args):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return Trajectory(prompt="p", label="l")

    worker = RolloutWorker.__new__(RolloutWorker)  # the episode path alone: no model is loaded
    worker.runners = {
        "tool": env_registry.runner_for("molt/python-tool-v1", provider="local", persistent=True, wall_s=60.0),
        "stubborn": StubbornRunner(),
    }
    worker.runner, worker.tokenizer, worker.engine = None, tiny_tokenizer, SpinningModel()
    worker.max_len, worker.timeout_s, worker.placeholders = 1024, 2.0, placeholder_ids(tiny_tokenizer)
    worker.top_logprobs, worker.record_routing = 0, False
    row = {"prompt": [{"role": "user", "content": "What is 2 * 3?"}], "label": "6", "env": "tool"}
    before, seen = set(jail_processes()), {}

    async def watch() -> None:
        while True:
            seen.update({pid: dirs for pid, dirs in jail_processes().items() if pid not in before})
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch())
    start = asyncio.get_running_loop().time()
    try:
        assert await worker._episode(row, SamplingParams(max_tokens=64), "0:tool:0") == ([], "timeout")
    finally:
        watcher.cancel()
    assert asyncio.get_running_loop().time() - start < 2.0 + 1.5  # its cleanup kills the jail, no grace period
    assert len(seen) >= 5, seen  # the session's jail ran: launcher, bwrap twice, zygote, the spinning REPL
    assert not [pid for pid in seen if os.path.exists(f"/proc/{pid}")], "a process of the episode's jail is left"
    jail_cgroups = {d for dirs in seen.values() for d in dirs if "/slot" in d}
    assert jail_cgroups or cgroups.version() is None
    assert not [d for d in jail_cgroups if os.path.isdir(d)], "a cgroup of the episode's jail is left"
    pool = next(b.pool for k, b in api._backends.items() if k == ("local", False, ()))
    assert pool.sessions_in_use == 0 and pool.session_waiters == 0

    worker.timeout_s = 0.3
    stubborn = {"prompt": "p", "label": "l", "env": "stubborn"}
    assert await worker._episode(stubborn, SamplingParams(max_tokens=4), "0:stubborn:0") == ([], "timeout")


def test_one_rl_step_through_the_registered_chat_agent(sft_run, tmp_path):
    """`molt/chat-gsm8k-v1` (stock OpenAI SDK against the session server) feeds a real RL step."""
    from molt_train.rl_trainer import RLTrainer

    cfg = parse(
        "rl",
        [
            "--env",
            "molt/chat-gsm8k-v1",
            "--actor.model_name_or_path",
            str(sft_run / "hf"),
            "--ckpt.output_dir",
            str(tmp_path),
            "--train.num_steps",
            "1",
            "--rollout.batch_size",
            "2",
            "--rollout.n_samples_per_prompt",
            "2",
            "--algo.advantage.estimator",
            "grpo",
            "--rollout.max_new_tokens",
            "8",
            "--eval.max_samples",
            "2",
            "--no-logger.progress",
        ],
    )
    trainer = RLTrainer(cfg)
    try:
        trainer.run()
    finally:
        trainer.shutdown()
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["rollout/num_rollouts"] == 4
    assert record["rollout/dropped_total"] == 0 and record["rollout/kept_rollouts"] == 4
    assert record["train/tokens"] > 0  # the captured segments' action tokens were trained on


def test_the_placement_group_is_reserved_and_scheduled_into(ray_local):
    """``placement.reserve`` makes a planned placement group real; an actor asked into one of its bundles runs
    there (the CPU stands in for the GPU bundles of the vllm paths)."""
    import ray

    from molt_train.placement import Placement, in_bundle, reserve

    plan = Placement(
        trainer_gpus=0.0,
        engine_gpus=0.0,
        weight_sync="object_store",
        rollout_threads=1,
        trainer_threads=1,
        reference_threads=1,
        bundles=({"CPU": 1.0},),
        trainer_bundles=(0,),
    )
    group = reserve(plan)
    try:
        probe = ray.remote(num_cpus=1)(lambda: ray.get_runtime_context().get_placement_group_id())
        assert ray.get(probe.options(**in_bundle(group, 0)).remote()) == group.id.hex()
    finally:
        ray.util.remove_placement_group(group)
    assert reserve(dataclasses.replace(plan, bundles=())) is None and in_bundle(None, 0) == {}


def test_tensor_parallel_context_parallel_and_optimizer_offload_give_the_same_update(sft_run):
    """--fsdp.tp_size 2 (DTensor TP on gloo, two ranks holding one model), --fsdp.cp_size 2 (two ranks each running
    half of every row, all-to-all attention on gloo) and --fsdp.offload optimizer (FSDP2's CPUOffloadPolicy) each give
    the log-probs and take the optimizer step of one plain rank, gradient clipping included (one plain run is the
    reference of all)."""
    from molt_train.worker_group import WorkerGroup

    common = ["--env", "molt/arith-v1", "--actor.model_name_or_path", str(sft_run / "hf"), "--ckpt.output_dir", "x"]
    common += ["--actor.adam.lr", "1.0", "--actor.adam.eps", "1.0", "--actor.max_norm", "0.5"]
    runs = {
        "plain": parse("rl", common),
        "tensor-parallel-2": parse("rl", [*common, "--actor.num_workers", "2", "--fsdp.tp_size", "2"]),
        "context-parallel-2": parse("rl", [*common, "--actor.num_workers", "2", "--fsdp.cp_size", "2"]),
        "optimizer-offload": parse("rl", [*common, "--fsdp.offload", "optimizer"]),
    }
    exp = synthetic_experience(sft_run / "hf", rows=11)
    assert exp.input_ids.shape[1] % 2  # odd rows: context parallelism pads them to split them in halves
    states, metrics, logprobs = {}, {}, {}
    for name, cfg in runs.items():
        group = WorkerGroup(cfg.actor, cfg.train, str(sft_run / "hf"), fsdp=cfg.fsdp)
        try:
            before = group.call("full_state_dict")[0]
            logprobs[name] = group.logprobs(exp, 0, 1.0)
            metrics[name] = group.train_step(exp, 0, cfg.algo, temperature=1.0)
            states[name] = group.call("full_state_dict")[0]
            assert logprobs[name].shape == exp.action_mask.shape
        finally:
            group.shutdown()
    plain = metrics["plain"]
    assert plain["grad_norm"] > 0.5  # clipping acted, so the split norm had to be whole to match
    assert max(float((states["plain"][k] - before[k]).abs().max()) for k in before) > 1e-3
    for name in ("tensor-parallel-2", "context-parallel-2", "optimizer-offload"):
        real = exp.attention_mask[:, 1:].bool()  # the log-probs of real next tokens
        torch.testing.assert_close(logprobs[name][real], logprobs["plain"][real], atol=1e-5, rtol=1e-5, msg=name)
        assert metrics[name]["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5), name
        assert metrics[name]["loss"] == pytest.approx(plain["loss"], abs=1e-5), name
        for key in states["plain"]:
            torch.testing.assert_close(states[name][key], states["plain"][key], atol=2e-5, rtol=1e-4, msg=key)


def test_freeze_moe_router_keeps_a_real_moe_routers_weights(sft_run, tmp_path):
    """--actor.freeze_moe_router on a tiny random Qwen3-MoE: after an RL step the router (gate) weights are the
    checkpoint's, the experts moved."""
    from transformers import AutoTokenizer

    from molt_train.models.tiny import build_tiny_moe, save_tiny
    from molt_train.worker_group import WorkerGroup

    tokenizer = AutoTokenizer.from_pretrained(sft_run / "hf")
    moe = build_tiny_moe(tokenizer, num_experts=4, max_positions=128)
    save_tiny(moe, tokenizer, tmp_path / "moe")
    flags_ = ["--env", "molt/arith-v1", "--actor.model_name_or_path", str(tmp_path / "moe"), "--ckpt.output_dir", "x"]
    cfg = parse("rl", [*flags_, "--actor.adam.lr", "0.1", "--actor.freeze_moe_router"])
    group = WorkerGroup(cfg.actor, cfg.train, str(tmp_path / "moe"))
    try:
        before = group.call("full_state_dict")[0]
        group.train_step(synthetic_experience(sft_run / "hf"), 0, cfg.algo, temperature=1.0)
        after = group.call("full_state_dict")[0]
    finally:
        group.shutdown()
    routers = [k for k in before if k.endswith("mlp.gate.weight")]
    assert len(routers) == moe.config.num_hidden_layers
    for key in routers:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0, msg=key)
    experts = [k for k in before if ".experts." in k]
    assert experts and any(not torch.equal(after[k], before[k]) for k in experts)


@pytest.fixture(scope="module")
def tiny_moe(sft_run, tmp_path_factory):
    """A tiny random Qwen3-MoE (2 layers, 4 experts, top-2) on the SFT run's tokenizer."""
    from transformers import AutoTokenizer

    from molt_train.models.tiny import build_tiny_moe, save_tiny

    tokenizer = AutoTokenizer.from_pretrained(sft_run / "hf")
    return save_tiny(
        build_tiny_moe(tokenizer, num_layers=2, num_experts=4, top_k=2, max_positions=128),
        tokenizer,
        tmp_path_factory.mktemp("moe") / "hf",
    )


def test_expert_parallel_gives_the_same_update_as_one_rank(sft_run, tiny_moe, tmp_path):
    """--fsdp.ep_size 2 on a tiny Qwen3-MoE: two ranks, each holding 2 of the 4 experts per layer (DTensors on the
    ep mesh, outside FSDP2) and reading its own micro-batches, take the same two optimizer steps as one plain rank on
    the union of the batches, gradient clipping included; the log-probs, the gathered weights and the saved
    checkpoint are whole."""
    import ray
    from transformers import AutoModelForCausalLM

    from molt_train.worker_group import WorkerGroup

    common = ["--env", "molt/arith-v1", "--actor.model_name_or_path", str(tiny_moe), "--ckpt.output_dir", "x"]
    common += ["--actor.adam.lr", "1.0", "--actor.adam.eps", "1.0", "--actor.max_norm", "0.5"]
    common += ["--train.max_tokens_per_gpu", "40"]
    runs = {
        "plain": parse("rl", common),
        "expert-parallel-2": parse("rl", [*common, "--actor.num_workers", "2", "--fsdp.ep_size", "2"]),
    }
    exp = synthetic_experience(sft_run / "hf")
    states, metrics, logprobs = {}, {}, {}
    for name, cfg in runs.items():
        group = WorkerGroup(cfg.actor, cfg.train, str(tiny_moe), fsdp=cfg.fsdp)
        try:
            before = group.call("full_state_dict")[0]
            metrics[name] = [group.train_step(exp, 0, cfg.algo, temperature=1.0) for _ in range(2)]
            states[name] = group.call("full_state_dict")[0]
            logprobs[name] = group.logprobs(exp, 0, 1.0)
            if name != "plain":
                local = ray.get(
                    [
                        w.__ray_call__.remote(lambda self: [tuple(p.to_local().shape) for p in self.experts])
                        for w in group.workers
                    ]
                )
                group.call("save", directory=str(tmp_path / "ckpt"), tokenizer_path=str(sft_run / "hf"))
        finally:
            group.shutdown()
    layers = 2
    # each rank holds half the experts of every layer: 2 of 4 stacked gate_up and down projections
    assert local[0] == local[1] and len(local[0]) == 2 * layers and all(shape[0] == 2 for shape in local[0])
    plain = metrics["plain"]
    assert plain[0]["train/micro_batches"] > 1 and plain[0]["grad_norm"] > 0.5  # split batch; clipping acted
    experts = [k for k in before if ".experts." in k]
    assert len(experts) == 2 * layers
    # every stacked expert tensor moved by well over the tolerance the runs are compared at
    assert min(float((states["plain"][k] - before[k]).abs().max()) for k in experts) > 2e-4
    ep = metrics["expert-parallel-2"]
    for step in range(2):
        assert ep[step]["grad_norm"] == pytest.approx(plain[step]["grad_norm"], rel=1e-5), step
        assert ep[step]["loss"] == pytest.approx(plain[step]["loss"], abs=1e-5), step
    assert set(states["expert-parallel-2"]) == set(states["plain"])
    for key in states["plain"]:
        torch.testing.assert_close(
            states["expert-parallel-2"][key], states["plain"][key], atol=2e-5, rtol=1e-4, msg=key
        )
    actions = exp.action_mask  # (padding columns differ with the micro-batches' widths)
    torch.testing.assert_close(logprobs["expert-parallel-2"][actions], logprobs["plain"][actions], atol=2e-5, rtol=1e-4)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "hf").state_dict()
    for key in experts:
        assert torch.equal(saved[key], states["expert-parallel-2"][key]), key
    optimizer = torch.load(tmp_path / "ckpt" / "trainer_state.pt", weights_only=False)["optimizer"]
    assert optimizer["state"][f"lm.{experts[0]}"]["exp_avg"].shape == before[experts[0]].shape  # gathered whole


def test_expert_parallel_refuses_a_dense_model_and_an_uneven_expert_count():
    """--fsdp.ep_size at load (the flag combinations it refuses at parse time are in test_config.py): a dense
    model's config has no expert plan, and 2 ranks do not split 3 experts."""
    from transformers import Qwen2Config, Qwen3MoeConfig

    from molt_train.parallel import check_experts

    assert check_experts(Qwen3MoeConfig(num_experts=4), 2) == 4
    with pytest.raises(ValueError, match="a Qwen2Config model has no experts to split"):
        check_experts(Qwen2Config(), 2)
    with pytest.raises(ValueError, match="--fsdp.ep_size 2 must divide the model's 3 experts per layer"):
        check_experts(Qwen3MoeConfig(num_experts=3), 2)
