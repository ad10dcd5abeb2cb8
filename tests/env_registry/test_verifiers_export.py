"""``molt_verifiers`` (env_registry/ecosystems/verifiers_taskset.py): a registered ID as a verifiers 0.4 taskset.
verifiers' own eval CLI (``vf-eval``, in the session's verifiers venv: verifiers_support.py, whose runtime wheel ships
it as module ``molt_verifiers``) loads ``molt/sort-v1`` through verifiers' own loader, runs it against a scripted
OpenAI-compatible endpoint and scores it with the env's grader (in a ``molt-env serve-env`` under this project's
python); every sample's reward equals ``molt-env eval``'s on the same scripted answers. And the bad IDs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from verifiers_support import ScriptedChat, serve_scripted

from env_registry.cli import main

MOLT_ENV = str(Path(sys.executable).with_name("molt-env"))
ID = "molt/sort-v1"


def answers(digits: str) -> list[str]:
    """The scripted replies to "sort:DIGITS=", in the order they are asked: exact, two places swapped, not digits."""
    right = "".join(sorted(digits))
    return [right, right[1] + right[0] + right[2:], "no idea"]


class Scripted(ScriptedChat):
    """The k-th request about "sort:D=" gets ``answers(D)[k % 3]``."""

    asked: Counter = Counter()

    def reply(self, said: str) -> str:
        digits = re.search(r"sort:(\d+)=", said)[1]
        with self.lock:
            k = self.asked[digits]
            self.asked[digits] += 1
        return answers(digits)[k % 3]


@pytest.fixture
def scripted():
    yield from serve_scripted(Scripted)


def vf_eval(venv: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    """verifiers' own ``vf-eval`` on taskset ``molt_verifiers`` (the venv's bin on PATH: verifiers runs its harness's
    program with uv)."""
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "OPENAI_API_KEY": "EMPTY"}
    env.pop("VIRTUAL_ENV", None)
    cmd = [
        str(venv / "bin" / "vf-eval"),
        "molt_verifiers",
        "--no-push",
        "--no-rich",
        "-o",
        str(out),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=out.parent)


def test_vf_eval_scores_a_registered_id_as_molt_env_eval_does(vf_venv, scripted, tmp_path, capsys):
    rows, n = 4, 3
    theirs = tmp_path / "vf"
    argv = ["--env.taskset.env-id", ID, "--env.taskset.num-tasks", str(rows), "--env.taskset.molt-env", MOLT_ENV]
    ran = vf_eval(vf_venv, theirs, *argv, "--client.base-url", scripted, "-m", "scripted", "-r", str(n))
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-4000:]
    (traces_file,) = theirs.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    assert len(episodes) == rows * n and sum(Scripted.asked.values()) == rows * n  # one model call per sample
    vf_rewards = defaultdict(list)
    for episode in episodes:
        assert episode["ok"] and episode["errors"] == [], episode["errors"]
        (trace,) = episode["traces"]
        data = trace["task"]["data"]
        assert data["env_id"] == ID and data["prompt"] == data["messages"]  # the row's chat messages
        ((message,),) = [data["prompt"]]
        assert (
            message["role"] == "user"
            and "".join(sorted(re.fullmatch(r"sort:(\d+)=", message["content"])[1])) == data["label"]
        )
        reply = trace["nodes"][-1]["message"]["content"]
        assert set(trace["rewards"]) == {"molt"} and trace["metrics"]["molt_score"] == float(reply == data["label"])
        vf_rewards[data["label"]].append(trace["rewards"]["molt"]["score"])

    Scripted.asked.clear()
    ours = tmp_path / "molt"
    rc = main(["eval", ID, "--base-url", scripted, "--max-samples", str(rows), "-n", str(n), "--out", str(ours)])
    assert rc == 0, capsys.readouterr().err
    molt_rewards = defaultdict(list)
    for line in (ours / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        molt_rewards[record["label"]].append(record["reward"])
    # the same rows, and per row the same rewards for the same scripted answers (exact, a swap, no digits)
    assert len(molt_rewards) == rows
    assert {k: sorted(v) for k, v in vf_rewards.items()} == {k: sorted(v) for k, v in molt_rewards.items()}
    for label, got in molt_rewards.items():
        assert 1.0 in got and 0.0 in got and any(0 < r < 1 for r in got), (label, got)  # partial credit


def test_an_unknown_id_is_named(vf_venv, tmp_path):
    ran = vf_eval(vf_venv, tmp_path / "vf", "--env.taskset.env-id", "molt/nope-v1", "--env.taskset.molt-env", MOLT_ENV)
    assert ran.returncode != 0
    said = ran.stdout + ran.stderr
    assert "cannot serve env ID 'molt/nope-v1'" in said and "not found" in said, said[-3000:]
