"""``rg:NAME``: every reasoning-gym dataset, for real. The catalog against reasoning-gym's own ``DATASETS``, kwargs in
the spec hash, bad input, scripted episodes through the env server with the scorer's exact rewards, ``molt-env check``,
``molt-env eval`` against a scripted endpoint with exact pass@k (alone and in a mix with a native env), and the env
servers gone when the process that started them is."""

from __future__ import annotations

import asyncio
import importlib.metadata as metadata
import json
import os
import signal
import subprocess
import sys
import time
from math import comb
from pathlib import Path

import pytest

import env_registry
from env_registry.cli import main
from env_registry.errors import NameNotFound, UnregisteredEnv
from env_registry.remote import RemoteEnvSpec
from molt_envs import SamplingParams
from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine

reasoning_gym = pytest.importorskip("reasoning_gym")
from reasoning_gym.factory import DATASETS  # noqa: E402
from reasoning_gym.utils import SYSTEM_PROMPTS  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from eval_support import MOLT_ENV, front, samples, summary  # noqa: E402

COUNTDOWN = "rg:countdown?min_numbers=3"
JUMBLE = "rg:letter_jumble?min_word_len=3&max_word_len=5&min_words=3&max_words=3"  # partial credit per word
TOK = ByteChatTokenizer()


def molt_env(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MOLT_ENV, *args], capture_output=True, text=True, timeout=300)


def test_the_catalog_lists_every_reasoning_gym_dataset():
    done = molt_env("list", "--source", "rg")
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  rg:")}
    assert set(listed) == {f"rg:{name}" for name in DATASETS}
    unavailable = {i for i, line in listed.items() if " unavailable: " in line}
    assert unavailable == {"rg:composite"} and "datasets=" in listed["rg:composite"]
    assert f"{len(DATASETS)} IDs of rg:, {len(DATASETS) - 1} available, 1 unavailable" in done.stdout


def test_kwargs_are_in_the_spec_and_its_hash_and_upstream_names_the_library():
    plain, tuned = env_registry.spec("rg:countdown"), env_registry.spec(COUNTDOWN)
    assert isinstance(tuned, RemoteEnvSpec) and tuned.id == plain.id == "rg:countdown"
    assert tuned.kwargs == {"task": "countdown", "config": {"min_numbers": 3}} and plain.kwargs == {"task": "countdown"}
    assert tuned.hash != plain.hash
    both = env_registry.spec("rg:countdown?min_numbers=3&max_numbers=4")
    assert env_registry.spec("rg:countdown?max_numbers=4&min_numbers=3").hash == both.hash  # order does not matter
    assert tuned.upstream == {
        "ecosystem": "rg",
        "library": "reasoning-gym",
        "version": metadata.version("reasoning-gym"),
        "license": "Apache-2.0",
    }
    rows = env_registry.load_split(tuned, "test", 20)
    assert all(len(r["label"]["metadata"]["numbers"]) >= 3 for r in rows)  # the config reaches the data
    assert rows[0]["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPTS["default"]}
    bare = env_registry.spec("rg:countdown?min_numbers=3&system_prompt=null")  # the question alone
    assert bare.kwargs["system_prompt"] is None and bare.hash != tuned.hash
    (row,) = env_registry.load_split(bare, "test", 1)
    assert row["prompt"] == rows[0]["prompt"][1:] and row["reference"] == rows[0]["reference"]
    siblings = env_registry.spec('rg:aiw?task_types=["siblings"]&task_type_weights=[1.0]')  # an enum field, as JSON
    assert all("brother have?" in r["label"]["question"] for r in env_registry.load_split(siblings, "test", 20))


@pytest.mark.parametrize(
    ("env_id", "error", "message"),
    [
        (
            "rg:countdown?nope=1",
            UnregisteredEnv,
            r"countdown config has no field 'nope' to set; its fields: .*min_numbers",
        ),
        ("rg:countdown?seed=3", UnregisteredEnv, r"no field 'seed' to set"),  # the splits own the seeds
        ("rg:countdown?min_numbers=0", UnregisteredEnv, r"config \{'min_numbers': 0\} does not fit .*min_numbers: int"),
        ("rg:countdown?min_numbers=9&max_numbers=3", UnregisteredEnv, r"does not fit reasoning-gym's countdown"),
        (
            "rg:countdown?system_prompt=nope",
            UnregisteredEnv,
            r"system_prompt 'nope' is not one of reasoning-gym's: .*direct",
        ),
        (
            'rg:aiw?task_types=["cousins"]&task_type_weights=[1]',
            UnregisteredEnv,
            r"task_types=\['cousins'\]: each must be one of 'siblings', 'friends', 'colleagues'",
        ),
        ("rg:countdwn", NameNotFound, r"no env 'countdwn'\. Did you mean rg:countdown\b.*--source rg"),
        ("rg:composite", UnregisteredEnv, r"composite"),
    ],
)
def test_bad_names_and_kwargs_fail_naming_them(env_id, error, message):
    with pytest.raises(error, match=message):
        env_registry.make(env_id)


def test_without_the_library_the_error_says_what_to_install():
    code = (
        "import sys; sys.modules['reasoning_gym'] = None  # not importable, as when it is not installed\n"
        "import env_registry\n"
        "try:\n    env_registry.spec('rg:countdown')\nexcept env_registry.Error as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("MissingLibrary ") and "pip install 'molt-ecosystem[reasoning-gym]'" in out, out


def test_scripted_answers_earn_the_scorers_exact_rewards_through_the_env_server():
    spec = env_registry.spec(JUMBLE)
    assert isinstance(spec, RemoteEnvSpec)  # the env runs in an env server of its own process
    runner = env_registry.runner_for(JUMBLE)
    rows = env_registry.load_split(spec, "test", 3)
    scorer = reasoning_gym.create_dataset("letter_jumble", min_word_len=3, max_word_len=5, min_words=3, max_words=3)
    params = SamplingParams(max_tokens=256)
    for row in rows:
        words = row["label"]["answer"].split()
        wrong = " ".join(words[:-1] + [words[-1][::-1] + "x"])  # the last word wrong
        for answer, expected in [
            (row["reference"], 1.0),
            (f"Let me think. <answer>{wrong}</answer>", scorer.score_answer(wrong, row["label"])),
            ("no answer tags", 0.0),
        ]:
            traj = asyncio.run(
                runner.execute(row["prompt"], row["label"], params, 8192, TOK, ReplayEngine(TOK, answer))
            )
            assert traj.ok and traj.num_turns == 1, traj.failure
            assert traj.reward == expected and traj.env_id == "rg:letter_jumble" and traj.spec_hash == spec.hash
        assert 0 < scorer.score_answer(wrong, row["label"]) < 1  # partial credit: the exact figure is checked


def test_molt_env_check_passes():
    done = molt_env("check", COUNTDOWN)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 passed, 0 failed" in done.stdout and "reference action: reward=1.0" in done.stdout


def scripted_endpoint(answers: dict[str, tuple[int, str, str]], n: int):
    """A front that answers Chat Completions itself: for the prompt whose last user message is a key of ``answers``
    (its index ``j``, a right and a wrong completion), ``j % (n + 1)`` right choices of the ``n`` asked, then wrong
    ones; ``/health`` is not found (no session server)."""

    def answer(path: str, body: bytes):
        if not path.endswith("/chat/completions"):
            return 404, {"error": {"message": "not found"}}
        request = json.loads(body)
        j, right, wrong = answers[request["messages"][-1]["content"]]
        asked = request.get("n", 1)
        choices = [
            {"index": i, "message": {"role": "assistant", "content": right if i < j % (n + 1) else wrong},
             "finish_reason": "stop"}
            for i in range(asked)
        ]  # fmt: skip
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        return 200, {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": choices,
            "usage": usage,
        }

    return front("http://127.0.0.1:9", answer)


def expected_pass_at_k(rows: int, n: int, k: int) -> float:
    return sum(1 - comb(n - j % (n + 1), k) / comb(n, k) for j in range(rows)) / rows


def test_eval_against_a_scripted_endpoint_gives_exact_pass_at_k(tmp_path, capsys):
    spec, n, m = env_registry.spec(COUNTDOWN), 4, 5
    rows = env_registry.load_split(spec, "test", m)
    answers = {r["prompt"][-1]["content"]: (j, r["reference"], "<answer>1 + 2</answer>") for j, r in enumerate(rows)}
    out = tmp_path / "eval"
    with scripted_endpoint(answers, n) as url:
        rc = main(["eval", COUNTDOWN, "--base-url", f"{url}/v1", "-n", str(n), "--k", "1,2,4", "--max-samples", str(m),
                   "--out", str(out), "--quiet"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    result, records = summary(out), samples(out)
    assert len(records) == n * m and result["failures"] == {}
    for k in (1, 2, 4):
        assert result[f"pass@{k}"] == pytest.approx(expected_pass_at_k(m, n, k))
    assert result["pass@1"] == pytest.approx(0.5)  # 0+1+2+3+4 right of 20
    scorer = reasoning_gym.create_dataset("countdown", min_numbers=3)
    for j, row in enumerate(rows):  # each sample's reward is the scorer's for its completion
        wrong = scorer.score_answer("1 + 2", row["label"])
        mine = sorted((r["reward"] for r in records if r["prompt_id"] == j), reverse=True)
        assert mine == [1.0] * (j % (n + 1)) + [wrong] * (n - j % (n + 1)) and wrong < 1.0
    assert all(r["request"]["n"] == n for r in records)  # single turn: one request with n per prompt


def test_a_mix_of_rg_and_a_native_env_parses_and_evaluates(tmp_path, capsys):
    n, m = 2, 3
    answers = {}
    for env_id in ("rg:countdown", "molt/sort-v1"):
        for j, r in enumerate(env_registry.load_split(env_registry.spec(env_id), "test", m)):
            answers[r["prompt"][-1]["content"]] = (j, r["reference"], "<answer>0</answer>" if "rg:" in env_id else "0")
    out = tmp_path / "eval"
    with scripted_endpoint(answers, n) as url:
        rc = main(["eval", "--env", "rg:countdown:1", "--env", "molt/sort-v1:1", "--base-url", f"{url}/v1", "-n", str(n),
                   "--k", "1,2", "--max-samples", str(m), "--out", str(out), "--quiet"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    result = summary(out)
    assert result["env_id"] == ["rg:countdown", "molt/sort-v1"]
    assert result["weights"] == {"rg:countdown": 0.5, "molt/sort-v1": 0.5}
    for env_id in ("rg:countdown", "molt/sort-v1"):
        for k in (1, 2):
            assert result["envs"][env_id][f"pass@{k}"] == pytest.approx(expected_pass_at_k(m, n, k))
    upstream = json.loads((out / "eval.json").read_text())["upstream"]  # what a resume checks
    assert upstream == {"rg:countdown": env_registry.spec("rg:countdown").upstream}
    assert result["pass@1"] == pytest.approx(expected_pass_at_k(m, n, 1))
    assert len(samples(out)) == 2 * n * m and result["failures"] == {}


SERVERS_OF_A_MAKE = """
import asyncio, json, os, sys
from pathlib import Path
import env_registry
env = env_registry.make("rg:countdown")
row = env_registry.load_split(env_registry.spec("rg:countdown"), "test", 1)[0]
start = asyncio.run(env.reset({"observation": row["prompt"], "label": row["label"], "images": []}))
servers = [int(p.name) for p in Path("/proc").glob("[0-9]*")
           if b"serve-env" in (p / "cmdline").read_bytes() and f" {os.getpid()} ".encode() in (p / "stat").read_bytes()]
print(json.dumps(servers), flush=True)
if sys.argv[1] == "wait":
    sys.stdin.read()
"""


def gone(pid: int, within_s: float = 20) -> bool:
    """The process has exited (a zombie nobody reaped counts as exited)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_the_env_servers_a_make_starts_end_with_its_process(how):
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVERS_OF_A_MAKE, "wait" if how == "kill" else "exit"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    servers = json.loads(proc.stdout.readline())
    assert len(servers) == 1, servers  # one env server, a child of the process that made the env
    if how == "kill":
        assert not gone(servers[0], within_s=0.5)
        os.kill(proc.pid, signal.SIGKILL)  # no atexit: the server sees its stdin close and exits
    assert proc.wait(timeout=60) == (-signal.SIGKILL if how == "kill" else 0)
    assert gone(servers[0]), f"the env server {servers[0]} outlived the process that started it ({how})"
