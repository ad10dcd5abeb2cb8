"""``molt-env view DIR``: a real eval's output directory (``molt-env eval`` against a scripted endpoint) served by a
real ``molt-env view`` process on loopback: the summary and its filters, episodes turn by turn, hostile samples
arriving inert (over HTTP, and in headless Chromium with JavaScript on)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from eval_support import MOLT_ENV, cli_env, front, molt_env, samples  # noqa: E402
from test_hub_pages import active_content  # noqa: E402

from env_registry.cli import main  # noqa: E402

COIN, TOOL, CHAT = "eval_envs:test/coin-v1", "eval_envs:test/tool-v1", "eval_envs:test/chat-coin-v1"
HOSTILE = '<script>alert(1)</script> <img src=x onerror="alert(2)"> <a href="javascript:alert(3)">click</a> ok'
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
EPISODE = re.compile(r'href="/episodes/(\d+)"')


def scripted(path: str, body: bytes):
    """The model: on a tool result it says 42; else hostile text plus a ``lookup`` call, except on question 1 (no
    call: test/tool-v1 ends it as an invalid action)."""
    if not path.endswith("/chat/completions"):
        return 404, {"error": {"message": "not found"}}
    messages = json.loads(body)["messages"]
    message: dict = {"role": "assistant", "content": "the answer is 42"}
    if messages[-1]["role"] != "tool":
        message = {"role": "assistant", "content": HOSTILE}
        if "question 1:" not in str(messages[-1]["content"]):
            call = {"name": "lookup", "arguments": json.dumps({"q": "<b>x</b>"})}
            message["tool_calls"] = [{"id": "call_1", "type": "function", "function": call}]
    usage = {"prompt_tokens": 10 + len(messages), "completion_tokens": 5 * len(messages), "total_tokens": 20}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return 200, {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [choice],
        "usage": usage,
    }


def synthetic(record: dict) -> dict:
    """A sample a hostile env could leave: images (a PNG, an HTML page, a remote URL) and script in the tool output,
    the info and the failure detail."""
    png = "data:image/png;base64," + base64.b64encode(PNG).decode()
    html = "data:image/png;base64," + base64.b64encode(b"<script>alert(4)</script>").decode()  # lies about its type
    images = [png, html, "https://x.test/a.png"]
    content = [{"type": "text", "text": "look"}, *({"type": "image_url", "image_url": {"url": u}} for u in images)]
    transcript = [{"role": "user", "content": content}, {"role": "tool", "content": HOSTILE, "tool_call_id": "<i>"}]
    failure = {"reason": "grader_error", "detail": HOSTILE}
    hostile = {"env_id": "test/hostile-v1", "prompt_id": 0, "transcript": transcript, "info": {HOSTILE: HOSTILE}}
    return {**record, **hostile, "failure": failure, "completed": False, "reward": None, "label": HOSTILE}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("view") / "eval"
    with front("http://127.0.0.1:9", scripted) as url:
        rc = main(["eval", COIN, TOOL, CHAT, "--base-url", f"{url}/v1", "--max-samples", "2", "--max-retries", "0",
                   "--out", str(out), "--quiet"])  # fmt: skip
    assert rc == 0
    records = samples(out)
    with (out / "samples.jsonl").open("a") as f:
        f.write(json.dumps(synthetic(records[0])) + "\n")
    return out


@pytest.fixture(scope="module")
def viewer(run_dir):
    proc = subprocess.Popen(
        [MOLT_ENV, "view", str(run_dir), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=cli_env(),
    )  # fmt: skip
    deadline, lines = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        lines.append(proc.stdout.readline())
        match = re.search(r" at (http://127\.0\.0\.1:\d+)/", lines[-1])
        if match:
            break
        if not lines[-1] and proc.poll() is not None:
            pytest.fail("molt-env view did not start:\n" + "".join(lines))
    yield match[1]
    proc.terminate()
    proc.wait(20)


def rows(page: str) -> list[int]:
    return [int(i) for i in EPISODE.findall(page)]


def episodes(viewer: str, **params: str) -> list[int]:
    page = httpx.get(f"{viewer}/", params=params)
    assert page.status_code == 200, page.text
    return rows(page.text)


def inert(page: str) -> list[str]:
    """What in ``page`` a browser could run, besides the PNG images the viewer re-encoded itself."""
    return [a for a in active_content(page) if not a.startswith("img[src=data:image/png;base64,")]


def test_the_summary_lists_every_episode_and_filters_narrow_it(viewer, run_dir):
    stored = sorted(samples(run_dir), key=lambda r: (r["env_id"], r["prompt_id"]))
    index = httpx.get(f"{viewer}/")
    assert index.status_code == 200 and index.headers["content-security-policy"].startswith("default-src 'none'")
    for text in ("test/coin-v1", "test/tool-v1", "test/chat-coin-v1", "pass@1", "invalid_action", "7 of 7 episodes"):
        assert text in index.text, text
    assert (
        rows(index.text) == list(range(7))
        and "127.0.0.1" in json.loads((run_dir / "summary.json").read_text())["model"]
    )
    assert 'href="/?failure=invalid_action"' in index.text  # the summary's failures link to their episodes
    failed = episodes(viewer, failure="invalid_action")
    assert len(failed) == 1 and failed == episodes(viewer, failure="invalid_action", env="test/tool-v1")
    assert len(episodes(viewer, failure="any")) == 2 and len(episodes(viewer, failure="none")) == 5
    passed, fails = episodes(viewer, reward="pass"), episodes(viewer, reward="fail")
    assert sorted(passed + fails) == list(range(7)) and len(passed) == sum(r["reward"] == 1.0 for r in stored)
    assert episodes(viewer, reward="1") == passed and len(episodes(viewer, env="test/chat-coin-v1")) == 2
    lengths = [r["completion_tokens"] for r in stored]
    assert len(episodes(viewer, min_len="15")) == sum(n >= 15 for n in lengths if n) > 0
    assert len(episodes(viewer, max_len="5")) == sum(n <= 5 for n in lengths if n) > 0
    refused = httpx.get(f"{viewer}/", params={"min_len": "<b>many</b>"})
    assert refused.status_code == 400 and "&lt;b&gt;many" in refused.text and inert(refused.text) == []


def test_episodes_turn_by_turn(viewer):
    pages = [httpx.get(f"{viewer}/episodes/{i}") for i in range(7)]
    assert all(p.status_code == 200 for p in pages)
    tool = next(p.text for p in pages if "test/tool-v1</code> prompt 0" in p.text)
    assert "tool call <code>lookup</code>" in tool and "answers call_1" in tool  # the call and its result
    assert '<pre class="text">42</pre>' in tool and "the answer is 42" in tool and "prompt 11, completion 20" in tool
    bad = next(p.text for p in pages if "test/tool-v1</code> prompt 1" in p.text)
    assert 'id="failure"' in bad and "invalid_action" in bad and "&#34;invalid_action&#34;: 1.0" in bad  # info
    chat = next(p.text for p in pages if "test/chat-coin-v1</code> prompt 0" in p.text)
    assert "model call 1 (openai, HTTP 200)" in chat and "test question 0: say something" in chat
    assert "test/hostile-v1" in pages[6].text  # the synthetic one comes last
    assert httpx.get(f"{viewer}/episodes/7").status_code == 404 and httpx.get(f"{viewer}/episodes/x").status_code == 400


def test_hostile_samples_arrive_as_text(viewer):
    for path in ["/", *(f"/episodes/{i}" for i in range(7))]:
        page = httpx.get(viewer + path)
        assert page.status_code == 200 and inert(page.text) == [], (path, inert(page.text))
        assert "<script>alert" not in page.text
    page = httpx.get(f"{viewer}/episodes/0").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and 'href="javascript' not in page
    hostile = httpx.get(f"{viewer}/episodes/6").text
    assert hostile.count("<img ") == 1 and "2 image(s) left out" in hostile  # the PNG only: not the HTML, not the URL
    assert "data:image/png;base64," + base64.b64encode(PNG).decode() in hostile and "x.test" not in hostile
    assert hostile.count("&lt;script&gt;alert(1)") >= 4  # the tool output, the info, the failure detail, the label


def test_a_directory_without_samples_is_refused(tmp_path):
    done = molt_env("view", str(tmp_path), "--port", "0", timeout=60)
    assert done.returncode == 2 and f"{tmp_path / 'samples.jsonl'} does not exist" in done.stderr, done.stderr


def test_the_hostile_episode_runs_nothing_in_chromium(viewer):
    from playwright.sync_api import sync_playwright
    from test_hub_browser import ACTIVE, CHROMIUM, FLAGS

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/setup-machine.sh does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        context = browser.new_context()  # JavaScript on: a payload that survived would run
        dialogs: list[str] = []
        context.on("page", lambda p: p.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss())))
        page = context.new_page()
        for i in (0, 6):
            page.goto(f"{viewer}/episodes/{i}")
            assert HOSTILE in page.locator("ol.transcript").inner_text()  # shown as text
            page.hover("text=click")
            assert page.evaluate("typeof window.alert") == "function" and dialogs == []
            assert [a for a in page.evaluate(ACTIVE) if a != "IMG[src]"] == []
        assert page.locator("img.shot").evaluate("img => img.naturalWidth") == 1  # the PNG renders
        browser.close()


def test_a_chat_agents_calls_show_each_message_once():
    """Each call shows what its request adds to the conversation so far; an unrelated request is shown whole."""
    from env_registry.hub.viewer import turns

    user = {"role": "user", "content": "q"}
    reply = {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    tool = {"role": "tool", "content": "r", "tool_call_id": "c1"}
    first = {
        "wire": "openai",
        "status": 200,
        "request": {"messages": [user]},
        "response": {"choices": [{"message": reply}]},
    }
    second = {"wire": "anthropic", "status": 200, "request": {"messages": [user, reply, tool]},
              "response": {"content": [{"type": "text", "text": "done"}]}}  # fmt: skip
    failed = {"wire": "openai", "status": 502, "request": {"messages": [user]}, "response": None, "error": "down"}
    shown = [(m["role"], m["text"]) for m in turns({"transcript": [first, second, failed]})]
    assert shown == [
        ("call", "model call 1 (openai, HTTP 200)"), ("user", "q"), ("assistant", ""),
        ("call", "model call 2 (anthropic, HTTP 200)"), ("tool", "r"), ("assistant", "done"), ("call", "model call 3 (openai, HTTP 502)"), ("user", "q"), ("error", "down"),
    ]  # fmt: skip


def test_odd_records_and_parameters_never_give_a_5xx(tmp_path):
    from fastapi.testclient import TestClient

    from env_registry.hub.viewer import create_app

    odd = [
        {"env_id": ["a"], "failure": "boom", "transcript": ["<|im_start|>user\nhi<|im_end|>"], "reward": "x"},
        {"env_id": "b", "failure": {"reason": [1]}, "transcript": {"weird": True}, "info": {"k": object.__name__}},
        {"env_id": "c", "prompt": [{"role": "user", "content": [{"type": "image", "source": {"type": "url"}}]}]},
        {"env_id": "d", "transcript": [{"request": None, "response": {"choices": [None, {"message": None}]}}]},
    ]
    (tmp_path / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in odd) + '\n[1]\n{"env_id": "torn')
    (tmp_path / "summary.json").write_text('{"pass@x": 1, "envs": []}')
    client = TestClient(create_app(tmp_path))
    index = client.get("/")
    assert index.status_code == 200 and "2 line(s) of samples.jsonl" in index.text and "4 of 4 episodes" in index.text
    for path in ["/episodes/0", "/episodes/1", "/episodes/2", "/episodes/3", "/?failure=boom", "/?reward=pass"]:
        assert client.get(path).status_code == 200, path
    assert "&lt;|im_start|&gt;user" in client.get("/episodes/0").text
    assert "1 image(s) left out" in client.get("/episodes/2").text
    for path in ["/?reward=abc", "/?max_len=1e", "/episodes/-1", "/episodes/99"]:
        assert client.get(path).status_code in (400, 404), path


def big_eval(run_dir: Path, out: Path, count: int = 10_000) -> list[dict]:
    """``count`` episodes of the real run's test/coin-v1 and test/tool-v1 records' shape, in a shuffled order (as a
    concurrent eval finishes them), with the run's summary.json; returns them in the viewer's episode order."""
    import random

    real = {r["env_id"]: r for r in samples(run_dir) if r["env_id"] in ("test/coin-v1", "test/tool-v1")}
    records = []
    for i in range(count):
        env = "test/coin-v1" if i < count // 2 else "test/tool-v1"
        failure = {"reason": "timeout", "detail": "slow"} if i % 7 == 0 else None
        reward = None if failure else float(i % 3 == 0)
        changes = {"prompt_id": (i % (count // 2)) // 4, "sample": i % 4, "completion_tokens": i % 50}
        records.append({**real[env], **changes, "reward": reward, "completed": not failure, "failure": failure})
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    out.mkdir()
    (out / "samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in shuffled))
    (out / "summary.json").write_text((run_dir / "summary.json").read_text())
    return records  # already in (env, prompt, sample) order: coin-v1 comes before tool-v1 in the summary


def test_ten_thousand_episodes_page_by_page(run_dir, tmp_path, monkeypatch):
    """100 episodes a page, prev/next links that keep the filters; the first page parses its own lines only."""
    from fastapi.testclient import TestClient

    from env_registry.hub import viewer

    assert list(json.loads((run_dir / "summary.json").read_text())["envs"])[:2] == [COIN[10:], TOOL[10:]]
    records = big_eval(run_dir, tmp_path / "big")
    client = TestClient(viewer.create_app(tmp_path / "big"))
    parsed = []
    real_record = viewer._record
    monkeypatch.setattr(viewer, "_record", lambda *a: parsed.append(1) or real_record(*a))
    first = client.get("/")
    assert first.status_code == 200 and len(parsed) == 100  # the index read no line as JSON: eval's lines' heads
    assert rows(first.text) == list(range(100)) and "10000 of 10000 episodes; page 1 of 100" in first.text
    assert 'rel="next" href="/?page=2"' in first.text and 'rel="prev"' not in first.text
    last = client.get("/", params={"page": "100"})
    assert rows(last.text) == list(range(9900, 10000)) and 'rel="prev" href="/?page=99"' in last.text
    assert 'rel="next"' not in last.text and f"<td>{records[-1]['prompt_id']}</td><td>3</td>" in last.text
    tail = client.get("/episodes/9999").text
    assert f"test/tool-v1</code> prompt {records[-1]['prompt_id']}, sample 3" in tail

    def want(r: dict, low: int) -> bool:
        return r["reward"] == 1.0 and r["env_id"] == "test/tool-v1" and r["completion_tokens"] >= low

    expected = [i for i, r in enumerate(records) if want(r, 10)]
    params = {"reward": "pass", "env": "test/tool-v1", "min_len": "10"}
    pages = [client.get("/", params={**params, "page": str(n)}) for n in (1, 2, 3)]
    assert f"{len(expected)} of 10000 episodes; page 1 of {-(-len(expected) // 100)}" in pages[0].text
    assert [rows(p.text) for p in pages] == [expected[:100], expected[100:200], expected[200:300]]
    assert 'rel="next" href="/?env=test%2Ftool-v1&amp;reward=pass&amp;min_len=10&amp;page=3"' in pages[1].text
    assert 'rel="prev" href="/?env=test%2Ftool-v1&amp;reward=pass&amp;min_len=10&amp;page=1"' in pages[1].text
    timeouts = [i for i, r in enumerate(records) if r["failure"]]
    assert rows(client.get("/", params={"failure": "timeout", "page": "15"}).text) == timeouts[1400:1500]
    assert client.get("/", params={"page": "101"}).status_code == 404
    assert client.get("/", params={"reward": "pass", "page": str(len(expected) // 100 + 99)}).status_code == 404
    for bad in ("0", "-1", "x"):
        assert client.get("/", params={"page": bad}).status_code == 400, bad
