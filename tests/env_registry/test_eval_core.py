"""The shared eval loop in process: pass@k by hand, the in-process engine policy, the durable sample store."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import eval_envs  # noqa: E402,F401  (registers test/*)

from env_registry.errors import Error  # noqa: E402
from env_registry.evaluation import EnginePolicy, EvalSettings, evaluate, load_tasks, pass_at_k, resolve_ks  # noqa: E402
from env_registry.evaluation.chat_driver import Reply, drive_env  # noqa: E402
from env_registry.evaluation.episode import invalid_action  # noqa: E402
from env_registry.evaluation.samples import SampleStore  # noqa: E402
from env_registry.mix import parse_env_mix  # noqa: E402
from env_registry.registry import registry  # noqa: E402
from molt_envs import SamplingParams  # noqa: E402


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2)/C(4,2) draws miss the one pass
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # only {the 3 fails} misses: C(3,3)/C(5,3)
    assert pass_at_k(8, 6, 3) == 1.0  # fewer fails than draws
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_k_must_not_exceed_n():
    assert resolve_ks(None, 3) == [1, 2, 3] and resolve_ks([4, 1, 4], 8) == [1, 4]
    with pytest.raises(Error, match="--k 8 is not possible with -n 4"):
        resolve_ks([1, 8], 4)


def test_engine_policy_evaluates_env_and_chat_agent_ids(tiny_engine, tiny_tokenizer, tmp_path):
    tasks = load_tasks(parse_env_mix(["test/coin-v1", "test/chat-coin-v1", "molt/arith-v1"]), "test", 2)
    settings = EvalSettings(n=3, max_new_tokens=5, concurrency=4, seed=7)
    policy = EnginePolicy(tiny_engine, tiny_tokenizer, 256, "tiny")
    result = asyncio.run(evaluate(tasks, policy, settings, out=tmp_path))
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 2 * 3 and result["failures"] == {}
    assert len({r["seed"] for r in records}) == 18  # every sample its own seed
    coin = [r for r in records if r["env_id"] == "test/coin-v1"]
    assert all(r["actions"] and r["reward"] == eval_envs.coin(r["actions"][0]) for r in coin)  # graded what was said
    by_prompt = {p: [r["reward"] for r in coin if r["prompt_id"] == p] for p in (0, 1)}
    expected = sum(pass_at_k(3, int(sum(v)), 2) for v in by_prompt.values()) / 2
    assert result["envs"]["test/coin-v1"]["pass@2"] == pytest.approx(expected)

    again = asyncio.run(evaluate(tasks, policy, settings, out=tmp_path))  # resumed: nothing left to do
    assert again["samples_this_run"] == 0 and again["envs"] == result["envs"]


def test_engine_policy_shows_a_vision_model_each_rows_image(tiny_vl_engine, tmp_path):
    """A vision env's rows reach the engine with their images, expanded into the prompt's placeholders (the eval
    of a VLM is not image-blind)."""
    from molt_envs.vision import image_digest

    seen = []
    generate = tiny_vl_engine.generate

    async def recording(prompt_ids, params, mm_inputs=None):
        seen.append((prompt_ids, mm_inputs))
        return await generate(prompt_ids, params, mm_inputs)

    tasks = load_tasks(parse_env_mix(["molt/shapes-v1"]), "test", 3)
    policy = EnginePolicy(tiny_vl_engine, tiny_vl_engine.processor, 256, "tiny-vl")
    tiny_vl_engine.generate = recording
    try:
        result = asyncio.run(evaluate(tasks, policy, EvalSettings(n=1, max_new_tokens=3), out=tmp_path))
    finally:
        del tiny_vl_engine.generate
    assert result["failures"] == {} and len(seen) == 3
    for ids, mm in seen:
        assert mm is not None and len(mm) == 1 and ids.count(mm.token_id) == sum(mm.token_counts) > 0
    sent = sorted(image_digest(mm.images[0]) for _, mm in seen)  # the episodes run concurrently: in any order
    assert sent == sorted(image_digest(row["images"][0]) for row in tasks[0].rows)


def test_the_store_drops_a_torn_line_and_refuses_a_corrupt_one(tmp_path):
    good = {"env_id": "e", "prompt_id": 0, "sample": 0, "reward": 1.0}
    (tmp_path / "samples.jsonl").write_text(json.dumps(good) + "\n" + '{"env_id": "e", "pro')
    store = SampleStore(tmp_path)
    assert list(store.records) == [("e", 0, 0)]
    assert (tmp_path / "samples.jsonl").read_text() == json.dumps(good) + "\n"
    (tmp_path / "samples.jsonl").write_text("not json\n" + json.dumps(good) + "\n")
    with pytest.raises(Error, match=r"samples.jsonl:1 is not a sample record"):
        SampleStore(tmp_path)
    (tmp_path / "samples.jsonl").write_bytes(json.dumps(good).encode() + b"\n" + b'{"env_id"' + b"\0" * 4096)
    assert list(SampleStore(tmp_path).records) == [("e", 0, 0)]  # the zero-filled tail a machine crash can leave
    assert (tmp_path / "samples.jsonl").read_text() == json.dumps(good) + "\n"


def test_the_store_writes_each_record_at_once_and_group_commits_the_fsyncs(tmp_path, monkeypatch):
    """A record is in the file when ``add`` returns (a killed eval keeps it); ``fsync``s come one per batch, and the
    last one, at ``close``, covers every record."""
    import os

    from env_registry.evaluation import samples as samples_module

    synced: list[int] = []  # the file's size at each fsync
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_size), real_fsync(fd)))
    monkeypatch.setattr(samples_module, "FSYNC_INTERVAL_S", 3600.0)  # one batch before close, at most
    store = SampleStore(tmp_path)
    for i in range(40):
        store.add({"env_id": "e", "prompt_id": i, "sample": 0, "reward": 1.0})
        assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == i + 1
    store.close()
    size = (tmp_path / "samples.jsonl").stat().st_size
    assert 1 <= len(synced) <= 2 and synced[-1] == size
    assert len(SampleStore(tmp_path).records) == 40


def test_records_added_survive_a_killed_process(tmp_path):
    """SIGKILL right after the last ``add``, with no ``close``: every record is in the file."""
    import subprocess

    code = (
        "import os, signal, sys; from env_registry.evaluation.samples import SampleStore; "
        "store = SampleStore(sys.argv[1]); "
        "[store.add({'env_id': 'e', 'prompt_id': i, 'sample': 0}) for i in range(25)]; "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert sorted(SampleStore(tmp_path).records) == [("e", i, 0) for i in range(25)]


def scripted(*replies: Reply):
    """A model stand-in answering with ``replies`` in order, recording what it was sent."""
    sent: list[list[dict]] = []
    queue = list(replies)

    async def generate(messages, tools, params):
        sent.append([dict(m) for m in messages])
        return queue.pop(0)

    return generate, sent


def test_chat_driver_turns_tool_calls_into_action_text_and_answers_them():
    call = {"id": "call_7", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    generate, sent = scripted(Reply("let me look", [call], prompt_tokens=10, completion_tokens=5), Reply("it is 42"))
    row = {"prompt": [{"role": "user", "content": "what?"}], "label": "42"}
    env = registry.make("test/tool-v1")
    episode = asyncio.run(drive_env(env, row, generate, SamplingParams(), max_turns=3))
    assert episode.failure is None and episode.reward == 1.0 and episode.turns == 2
    assert episode.actions[0] == 'let me look\n<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>'
    assert sent[1][-2] == {"role": "assistant", "content": "let me look", "tool_calls": [call]}
    assert sent[1][-1] == {"role": "tool", "content": "42", "tool_call_id": "call_7"}
    assert episode.completion_tokens is None  # the second reply carried no usage: no partial count


def test_chat_driver_refuses_raw_text_and_counts_bad_actions():
    row = {"prompt": [{"role": "user", "content": "go"}], "label": "0"}
    generate, _ = scripted(Reply("a"))
    raw = asyncio.run(drive_env(registry.make("test/raw-v1"), row, generate, SamplingParams(), max_turns=3))
    assert raw.failure.reason == "unsupported_observation" and raw.reward is None
    assert "molt-train eval" in raw.failure.detail
    generate, _ = scripted(Reply("no tool"))
    bad = asyncio.run(drive_env(registry.make("test/tool-v1"), row, generate, SamplingParams(), max_turns=3))
    assert bad.reward == 0.0 and invalid_action(bad.info).reason == "invalid_action"
