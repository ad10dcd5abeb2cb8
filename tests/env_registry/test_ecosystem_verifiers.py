"""``verifiers:MODULE`` (env_registry/ecosystems/verifiers.py): a verifiers 0.4 taskset written here against
``verifiers.v1``, installed with the real verifiers from PyPI into the verifiers venv (made once, in a tmp
``MOLT_CACHE``), evaluated against a scripted OpenAI-compatible endpoint (exact pass@k) and trained two RL steps on the
tiny model, each rollout verifiers' own (its null harness program, its interception server, its rubric) in an env
server under the venv's python; and the bad inputs."""

from __future__ import annotations

import contextlib
import json
import pickle
import re
import subprocess
import sys
import time
from collections import Counter

import pytest
from verifiers_support import ID, ScriptedChat, serve_scripted

import env_registry
from env_registry.cli import main
from env_registry.errors import EnvServerUnavailable, NameNotFound, UnregisteredEnv


class Scripted(ScriptedChat):
    """The first ``RIGHT[a]`` requests about "What is a+b?" get the sum, later ones a wrong number; the first
    ``RIGHT[w]`` asked to "Say the word w." say it, later ones "wrong"."""

    RIGHT = {100: 4, 101: 0, 102: 1, "berry": 2, "cherry": 4}
    asked: Counter = Counter()
    usage = {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}

    def reply(self, said: str) -> str:
        word = re.search(r"Say the word (\w+)\.", said)  # the OpenEnv env of the mixed eval
        a, b = (0, 0) if word else map(int, re.search(r"What is (\d+)\+(\d+)", said).groups())
        key = word[1] if word else a
        with self.lock:
            right = self.asked[key] < self.RIGHT.get(key, 0)
            self.asked[key] += 1
        return (word[1] if right else "wrong") if word else str(a + b if right else a + b + 1)


@pytest.fixture
def scripted():
    yield from serve_scripted(Scripted)


def test_the_venv_lists_the_taskset_and_its_spec(vf_venv, capsys):
    assert main(["list", "--source", "verifiers"]) == 0
    out = capsys.readouterr().out
    assert f"{ID}  chat_agent available  -- vfx-arith 0.1.0: Add two numbers." in out
    assert "1 IDs of verifiers:, 1 available" in out
    spec = env_registry.spec(f"{ID}?num_tasks=3")
    assert spec.kind == "chat_agent" and (spec.package, spec.package_version) == ("vfx-arith", "0.1.0")
    assert spec.upstream == {"ecosystem": "verifiers", "library": "verifiers", "version": "0.4.0", "license": "MIT"}
    assert spec.kwargs == {"taskset": "vfx_arith", "config": {"num_tasks": 3}, "agent": {}}
    assert env_registry.spec("verifiers:acme/vfx-arith").id == ID  # a Hub-style owner/name resolves as verifiers does
    # verifiers itself is not importable here: it only ever runs in its venv
    assert subprocess.run([sys.executable, "-c", "import verifiers"], capture_output=True).returncode != 0


def test_eval_gives_exact_pass_at_k_against_a_scripted_endpoint(vf_venv, scripted, tmp_path, capsys):
    out = tmp_path / "eval"
    rc = main(["eval", f"{ID}?num_tasks=3", "--base-url", scripted, "-n", "4", "--k", "1,2,4", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures"] == {} and summary["num_prompts"] == 3
    # the test split is a = 100, 101, 102 (train is 0..): 4, 0 and 1 of 4 samples right
    assert summary["pass@1"] == pytest.approx((1 + 0 + 1 / 4) / 3)
    assert summary["pass@2"] == pytest.approx((1 + 0 + (1 - 3 / 6)) / 3)
    assert summary["pass@4"] == pytest.approx((1 + 0 + 1) / 3)
    assert Scripted.asked == {100: 4, 101: 4, 102: 4}  # one model call per sample, through verifiers' harness
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    for r in records:
        reply = r["transcript"][0]["response"]["choices"][0]["message"]["content"]
        right = reply == r["label"]["answer"]
        assert r["reward"] == pytest.approx(0.8 * right + 0.2) and r["info"]["reward/exact"] == right
        assert r["info"]["reply_chars"] == len(reply) and r["completion_tokens"] == 1  # the streamed reply's usage


SAY_APP = """
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

WORDS = ["apple", "berry", "cherry"]


class SayAction(Action):
    word: str


class SayObservation(Observation):
    message: str = ""


class SayEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.word = State(step_count=0), WORDS[0]

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state, self.word = State(episode_id=episode_id, step_count=0), WORDS[(seed or 0) % 3]
        return SayObservation(message=f"Say the word {self.word}.")

    def step(self, action, timeout_s=None, **kwargs):
        return SayObservation(message="done", done=True, reward=float(action.word == self.word))

    @property
    def state(self):
        return self._state


app = create_app(SayEnv, SayAction, SayObservation, env_name="say_word", max_concurrent_envs=16)
"""


@pytest.fixture
def openenv_server(tmp_path):
    """An OpenEnv 0.10 env (say the seed's word) as a real uvicorn process."""
    import socket

    import httpx

    pytest.importorskip("openenv")
    (tmp_path / "say_app.py").write_text(SAY_APP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "uvicorn", "say_app:app", "--app-dir", str(tmp_path), "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_mixed_eval_of_a_verifiers_and_an_openenv_env(vf_venv, openenv_server, scripted, tmp_path, capsys):
    """Both adapters in one eval (the verifiers env server of the test above is reused: same process, same ID)."""
    out = tmp_path / "eval"
    argv = ["eval", f"{ID}?num_tasks=3", f"openenv:{openenv_server}", "--base-url", scripted, "-n", "4"]
    rc = main([*argv, "--k", "1,2,4", "--max-samples", "2", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures"] == {} and summary["env_id"] == [ID, f"openenv:{openenv_server}"]
    assert Scripted.asked == {100: 4, 101: 4, "berry": 4, "cherry": 4}
    mine, theirs = summary["envs"][ID], summary["envs"][f"openenv:{openenv_server}"]
    assert [mine[f"pass@{k}"] for k in (1, 2, 4)] == pytest.approx([0.5, 0.5, 0.5])  # 4 and 0 of 4 right
    assert [theirs[f"pass@{k}"] for k in (1, 2, 4)] == pytest.approx([0.75, (5 / 6 + 1) / 2, 1.0])  # 2 and 4 of 4
    weights = summary["weights"]
    assert summary["pass@1"] == pytest.approx(weights[ID] * 0.5 + weights[f"openenv:{openenv_server}"] * 0.75)


@pytest.fixture(scope="module")
def ray_2cpu(vf_venv):
    import ray

    from molt_train.config import RayConfig
    from molt_train.runtime import init_ray

    init_ray(RayConfig(num_cpus=2))  # its workers get this process's environment: MOLT_CACHE included
    yield
    ray.shutdown()


def test_two_rl_steps_capture_every_turn_with_the_rubrics_reward(ray_2cpu, tiny_tokenizer, tmp_path):
    from molt_train import rl_cli
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = save_tiny(build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0), tiny_tokenizer, tmp_path)
    out, dump = tmp_path / "run", tmp_path / "dump"
    argv = ["--env", ID, "--actor.model_name_or_path", str(model), "--ckpt.output_dir", str(out)]
    argv += ["--train.num_steps", "2", "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2"]
    argv += ["--algo.advantage.estimator", "grpo", "--rollout.max_new_tokens", "6", "--actor.adam.lr", "1e-3"]
    argv += ["--eval.max_samples", "0", "--no-logger.progress", "--train.rollout_dump_dir", str(dump)]
    assert rl_cli.main(argv) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollout/num_rollouts"] == 4 and r["rollout/dropped_total"] == 0 for r in records)
    for step in range(2):
        with (dump / f"batch_{step:06d}.pkl").open("rb") as f:
            trajectories = pickle.load(f)["trajectories"]
        assert len({t.rollout_id for t in trajectories}) == 4
        for t in trajectories:
            start, end = t.action_ranges[0]
            assert len(t.action_ranges) == 1 and 0 < end - start <= 6  # the one model call, token-exact
            prompt = tiny_tokenizer.decode(t.token_ids[:start])
            asked = re.search(r"What is (\d+) ?\+ ?(\d+)", prompt)  # the taskset's prompt, via verifiers' harness
            assert asked, prompt
            # verifiers' rubric scored exactly the captured tokens (as the session server streamed them)
            reply = tiny_tokenizer.decode(t.token_ids[start:end]).strip()
            digits = sum(c.isdigit() for c in reply) / len(reply) if reply else 0.0
            assert t.info["reply_chars"] == len(reply) and t.info["reward/digits"] == pytest.approx(digits)
            assert t.info["reward/exact"] == (reply == str(int(asked[1]) + int(asked[2])))
            assert t.reward == pytest.approx(0.8 * t.info["reward/exact"] + 0.2 * digits) and t.info["turns"] == 1


def test_bad_ids_name_what_to_do(vf_venv, tmp_path, monkeypatch):
    with pytest.raises(NameNotFound, match=r"Did you mean verifiers:vfx_arith\?.*molt-env ecosystem install verifiers"):
        env_registry.spec("verifiers:vfx_arth")
    with pytest.raises(UnregisteredEnv, match="'split' is not a kwarg"):
        env_registry.spec(f"{ID}?split=test")
    # a key the taskset's config does not have: the env server, which has verifiers, refuses it
    with pytest.raises(EnvServerUnavailable, match=r"config has no field 'bogus' to set; its fields: num_tasks"):
        env_registry.datasets.load_split(env_registry.spec(f"{ID}?bogus=1"), "train")
    monkeypatch.setenv("MOLT_CACHE", str(tmp_path))  # no venv here
    with pytest.raises(UnregisteredEnv, match=r"not made yet .* `molt-env ecosystem install verifiers --with"):
        env_registry.spec(ID)
    assert main(["ecosystem", "install", "rg"]) == 2  # reasoning-gym runs in this interpreter: no venv of its own


def test_the_eval_proxy_reassembles_a_streamed_chat_completion():
    """verifiers' harness streams: the eval's proxy records the reply its chunks add up to (tool calls included)."""
    from env_registry.evaluation.proxy import _chat_completion

    def sse(*chunks: dict) -> bytes:
        head = {"id": "c", "created": 1, "model": "m", "object": "chat.completion.chunk"}
        return "".join(f"data: {json.dumps({**head, **c})}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"

    call = {"index": 0, "id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": '}}
    more = {"index": 0, "function": {"arguments": "1}"}}
    reply = _chat_completion(
        sse(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}}]},
            {"choices": [{"index": 0, "delta": {"content": "add.", "tool_calls": [call]}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [more]}, "finish_reason": "tool_calls"}]},
            {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}},
        )
    )
    (choice,) = reply["choices"]
    assert choice["message"]["content"] == "Let me add." and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    ]
    assert reply["usage"]["completion_tokens"] == 5 and reply["model"] == "m"
    assert _chat_completion(b"data: not json\n\n") is None and _chat_completion(b"") is None
