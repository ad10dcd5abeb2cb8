"""The real Claude Code and Codex CLIs against the trainer's commands, on a tiny long-context policy on CPU:

- ``molt-train rl --env molt/harness-claude-code-v1`` and ``--env molt/harness-codex-v1``: the CLIs, in a jail per
  episode, drive the policy for two RL steps (the real command, the real Ray, the hf engine);
- ``molt-train serve``: each CLI, run as a user runs it (the agents' own command line, pointed at a session's URL),
  completes its task against the standalone server, and its calls are in the session's trajectory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import sandboxes
from molt_envs import SamplingParams
from molt_envs.contract import ChatContext
from molt_envs.envs.harness_agents import SYSTEM_PROMPT, ClaudeCodeAgent, CodexAgent, generate_split
from molt_envs.harness import DEFAULT_INSTALL_DIR, JAIL_HARNESS, JAIL_WORK

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(bool(sandboxes.probe().local_missing), reason="the harness jail needs local isolation"),
]
MOLT_TRAIN = Path(sys.executable).with_name("molt-train")
EOS_SHARE = 0.3  # the tiny policy ends a reply after each token with this probability


def ends_its_replies(model, eos_id: int, share: float) -> None:
    """Make a random tiny model end its replies early, as a trained one does (a random one almost never samples its
    end-of-turn token, and a harness that only ever gets cut-off replies never ends a turn normally).

    One residual dimension ``d`` is held constant at every position (the first layer's value bias, through ``o_proj``)
    and, the embeddings being tied, only the end-of-turn token reads it: every other logit is about 0 and the
    end-of-turn one is set so that it takes ``share`` of the probability.
    """
    import math

    import torch

    attn, embed = model.model.layers[0].self_attn, model.model.embed_tokens.weight
    d, j = 0, 0  # the residual dimension, the value dimension (of the first kv head) that feeds it
    with torch.no_grad():
        attn.v_proj.weight[j] = 0.0
        attn.v_proj.bias[j] = 1.0  # every head reading kv head 0 outputs 1 in value dimension j
        attn.o_proj.weight[:, j :: attn.head_dim] = 0.0
        attn.o_proj.weight[d, j] = 1.0  # residual dimension d: about 1 everywhere, the rest stays small
        hidden = embed.shape[1]
        embed[:, d] = 0.0
        embed[eos_id, d] = math.log(share / (1 - share) * (embed.shape[0] - 1)) / math.sqrt(hidden)
        embed[:] *= torch.where(torch.arange(hidden) == d, 1.0, 1e-3)  # other logits about 0: uniform elsewhere


@pytest.fixture(scope="module")
def long_context_model(tiny_tokenizer, tmp_path_factory):
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, max_positions=4096, seed=0)
    ends_its_replies(model, tiny_tokenizer.eos_token_id, EOS_SHARE)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("tiny-long"))


@pytest.mark.parametrize("env_id", ["molt/harness-claude-code-v1", "molt/harness-codex-v1"])
def test_two_rl_steps_on_a_harness(long_context_model, tmp_path, env_id):
    assert (DEFAULT_INSTALL_DIR / "node_modules" / "@anthropic-ai" / "claude-code").is_dir(), "run make harnesses"
    argv = [str(MOLT_TRAIN), "rl", "--env", env_id]
    argv += ["--actor.model_name_or_path", str(long_context_model), "--ckpt.output_dir", str(tmp_path)]
    argv += ["--train.num_steps", "2", "--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "2"]
    argv += ["--algo.advantage.estimator", "grpo", "--rollout.max_new_tokens", "16", "--data.max_len", "4096"]
    argv += ["--actor.adam.lr", "1e-3", "--eval.max_samples", "0", "--ray.num_cpus", "2", "--no-logger.progress"]
    argv += ["--rollout.timeout_s", "240", "--train.max_tokens_per_gpu", "16384"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        # every episode is kept: a harness crash or timeout (both counted drop reasons) is a defect to explain here
        assert record["rollout/num_rollouts"] == record["rollout/kept_rollouts"] == 2, record
        assert record["rollout/dropped_total"] == 0, record
        assert record["rollout/segments"] >= record["rollout/kept_rollouts"]
        assert record["train/tokens"] > 0  # the captured segments' action tokens were trained on
    # the trainer recomputed the log-probs of exactly the captured ids: a re-tokenized or misaligned capture
    # would differ by whole nats, not by float rounding
    assert records[0]["mismatch/abs_diff_mean"] < 1e-3


@pytest.fixture(scope="module")
def served(long_context_model):
    """``molt-train serve`` on the long-context policy, as a real process on a free loopback port."""
    argv = [str(MOLT_TRAIN), "serve", "--model", str(long_context_model), "--port", "0", "--max-tokens", "16"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ""
    while "session server on" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail(f"molt-train serve exited early: {proc.stderr.read()[-3000:]}")
    yield re.search(r"on (http://\S+) ", line).group(1)
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.parametrize("agent_class", [ClaudeCodeAgent, CodexAgent])
def test_the_cli_completes_its_task_against_molt_train_serve(served, agent_class, tiny_tokenizer, tmp_path):
    http = httpx.Client(base_url=served, timeout=30)
    opened = http.post("/sessions", json={"max_length": 4096}).json()
    task = next(generate_split("test", size=1))
    ctx = ChatContext(
        messages=[{"role": "user", "content": task["question"]}],
        tools=None,
        prompt=task["question"],
        label=task["answer"],
        images=None,
        base_url=opened["base_url"],
        session_url=opened["session_url"],
        model_name="policy",
        api_key="EMPTY",
        session_id=opened["session_id"],
        sampling_params=SamplingParams(max_tokens=16),
        max_length=4096,
    )
    # the agent's own command line, with the jail's paths mapped to the host's; no tool may run here, outside a
    # jail: Claude Code gets none, Codex its own read-only sandbox (the random policy writes no well-formed call)
    agent = agent_class(tools="") if agent_class is ClaudeCodeAgent else agent_class()
    argv, env, files = agent.command(ctx, opened["session_url"])
    unjailed = ("--dangerously-bypass-approvals-and-sandbox", "--dangerously-skip-permissions")  # (refused as root)
    argv = [a for a in argv if a not in unjailed]
    if agent_class is CodexAgent:
        argv[argv.index("exec") + 1 : argv.index("exec") + 1] = ["--sandbox", "read-only"]

    def host(text: str) -> str:
        return text.replace(JAIL_HARNESS, str(agent.install_dir)).replace(JAIL_WORK, str(tmp_path))

    for path, content in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(host(content))
    for name in ("task", "home", "logs"):
        (tmp_path / name).mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), **{k: host(v) for k, v in env.items()}}
    done = subprocess.run(
        [host(a) for a in argv], env=env, cwd=tmp_path / "task", capture_output=True, text=True, timeout=180
    )
    assert 0 <= done.returncode < 126, done.stdout[-2000:] + done.stderr[-2000:]  # it ended by itself
    segments = http.get(f"/sessions/{opened['session_id']}/trajectory").json()["segments"]
    assert segments, done.stdout[-2000:] + done.stderr[-2000:]
    for segment in segments:
        assert segment["action_ranges"] and len(segment["log_probs"]) == len(segment["token_ids"])
        assert segment["prompt_len"] <= 4096
    # what the model read first is the CLI's own request: its system prompt and tools around the dataset's task
    prompt = tiny_tokenizer.decode(segments[0]["token_ids"][: segments[0]["prompt_len"]])
    assert task["question"] in prompt and SYSTEM_PROMPT in prompt
