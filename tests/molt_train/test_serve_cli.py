"""``molt-train serve`` as a real process: sessions over HTTP, both SDKs, the trajectory route, delete, shutdown."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import anthropic
import httpx
import openai
import pytest
import torch


@pytest.fixture
def served(tmp_path, tiny_model, tiny_tokenizer):
    from molt_train.models.tiny import save_tiny

    save_tiny(tiny_model, tiny_tokenizer, tmp_path / "model")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "molt_train.cli",
            "serve",
            "--model",
            str(tmp_path / "model"),
            "--port",
            "0",
            "--max-tokens",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    line = ""
    while time.monotonic() < deadline and "session server on" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail(f"molt-train serve exited early: {proc.stderr.read()}")
    url = re.search(r"on (http://\S+) ", line).group(1)
    yield url, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_standalone_server_end_to_end(served, tiny_model):
    url, proc = served
    http = httpx.Client(base_url=url)
    assert http.get("/health").json()["status"] == "ok"
    opened = http.post("/sessions", json={"sampling_params": {"temperature": 1.0, "seed": 4}}).json()
    assert set(opened) == {"session_id", "base_url", "session_url"}
    assert (
        opened["base_url"] == f"{url}/s/{opened['session_id']}/v1"
        and opened["session_url"] == f"{url}/s/{opened['session_id']}"
    )

    client = openai.OpenAI(base_url=opened["base_url"], api_key="EMPTY")
    messages = [{"role": "user", "content": "Tom has 4 apples."}]
    reply = client.chat.completions.create(model="policy", messages=messages)
    messages += [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "How many now?"},
    ]
    client.chat.completions.create(model="policy", messages=messages)
    other = http.post("/sessions").json()
    anthropic.Anthropic(base_url=other["session_url"], api_key="EMPTY").messages.create(
        model="policy", max_tokens=5, messages=[{"role": "user", "content": "hello"}]
    )

    trajectory = http.get(f"/sessions/{opened['session_id']}/trajectory").json()
    [segment] = trajectory["segments"]
    tokens, ranges, log_probs = segment["token_ids"], segment["action_ranges"], segment["log_probs"]
    assert len(ranges) == 2 == len(segment["finish_reasons"]) and len(log_probs) == len(tokens)
    inside = {i for start, end in ranges for i in range(start, end)}
    assert all(lp == 0.0 for i, lp in enumerate(log_probs) if i not in inside)
    # the served process generated over exactly these ids: the same weights reproduce its log-probs
    with torch.no_grad():
        logp = torch.log_softmax(tiny_model(torch.tensor([tokens])).logits[0].float(), -1)
    for start, end in ranges:
        forced = logp[start - 1 : end - 1].gather(-1, torch.tensor(tokens[start:end])[:, None])[:, 0]
        assert torch.allclose(forced, torch.tensor(log_probs[start:end]), atol=1e-4)
    [other_segment] = http.get(f"/sessions/{other['session_id']}/trajectory").json()["segments"]
    assert len(other_segment["action_ranges"]) == 1 and len(range(*other_segment["action_ranges"][0])) <= 5

    assert http.delete(f"/sessions/{opened['session_id']}").json() == {
        "session_id": opened["session_id"],
        "deleted": True,
    }
    assert http.get(f"/sessions/{opened['session_id']}/trajectory").status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.with_options(max_retries=0).chat.completions.create(model="policy", messages=messages)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_serve_refuses_a_missing_model_directory(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "molt_train.cli", "serve", "--model", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "cannot load a model from --model" in out.stderr
