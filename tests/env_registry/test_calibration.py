"""Difficulty calibration at publish: ``molt-env serve --validate --reference-endpoint ...`` plays each env that
passed its checks with the operator's reference policy, in the jail (its model calls piped to the endpoint through a
bound unix socket), stores pass@k for k = 1..n, the mean reward, a reward histogram and the cost per episode with the
release's validation report, on SQLite and on PostgreSQL, and shows them on the env card (an SVG curve, no script),
with a badge for an env the reference policy always solves."""

from __future__ import annotations

import json
import math
import re
import threading
import time
import zipfile

import httpx
import pytest
from eval_support import molt_env
from packaging_support import run_cli, start_server

from env_registry.validation.calibration import Reference, calibration_of, curve_points, sanitize
from env_registry.validation.checkpoint import checkpoint_stamp

N, PROMPTS = 4, 3


def scripted_answer(prompt: str, n: int) -> list[str]:
    """Of ``n`` choices, the first ``len(text) % 3`` repeat the text (the rest do not); a prompt of the 'solved' env
    gets the text every time; reasoning-gym's products (``rg:products``) get the right product in the first
    ``products_right`` choices. Deterministic, so an eval and the gate's reference eval see the same replies."""
    product = re.match(r"Solve the following multiplication: ([\d *]+)\.", prompt)
    if product:
        value = math.prod(int(x) for x in product[1].split("*"))
        right = products_right(product[1], n)
        return [f"<answer>{value if i < right else value + 1}</answer>" for i in range(n)]
    head, _, text = prompt.partition("\n")
    right = n if head.startswith("Echo this") else len(text) % 3
    return [text if i < right else f"not {text}" for i in range(n)]


def products_right(expression: str, n: int) -> int:
    """How many of ``n`` choices the scripted endpoint answers right for a product: the first factor's digits - 1."""
    return min(n, len(expression.split("*")[0].strip()) - 1)


@pytest.fixture(scope="module")
def endpoint():
    """A scripted OpenAI-compatible endpoint on loopback (``/v1/chat/completions`` with ``n``); yields its base URL."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat(request):
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        answers = scripted_answer(prompt if isinstance(prompt, str) else "", int(body.get("n") or 1))
        return JSONResponse(
            {
                "id": "chatcmpl-scripted",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "scripted"),
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": a},
                        "finish_reason": "stop",
                        "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(a.split())},
                    }
                    for i, a in enumerate(answers)
                ],
                "usage": {
                    "prompt_tokens": len(prompt.split()),
                    "completion_tokens": sum(len(a.split()) for a in answers),
                    "total_tokens": len(prompt.split()) + sum(len(a.split()) for a in answers),
                },
            }
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1"
    server.should_exit = True
    thread.join(10)


def _package(tmp_path, name: str, solved: bool):
    from env_registry.packages.scaffold import init

    src = init(tmp_path / name, f"cal/{name}-v1", package=f"cal-{name}")
    if solved:
        pyproject = src / "pyproject.toml"
        text = pyproject.read_text()
        new = text.replace("Repeat the following text exactly", "Echo this text exactly")
        assert new != text
        pyproject.write_text(new)
    return src


def _local_eval(tmp_path, server, package: str, env_id: str, endpoint: str) -> dict:
    """``molt-env eval`` of the published wheel (unpacked onto PYTHONPATH) against the same endpoint."""
    release = httpx.get(f"{server.url}/api/packages/{package}/0.1.0").json()
    wheel = tmp_path / next(f["filename"] for f in release["files"] if f["filename"].endswith(".whl"))
    wheel.write_bytes(httpx.get(f"{server.url}/files/{package}/{wheel.name}").content)
    unpacked = tmp_path / f"{package}-site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(unpacked)
    out = tmp_path / f"{package}-eval"
    done = molt_env(
        "eval", env_id, "--base-url", endpoint, "--model-name", "scripted", "-n", str(N), "--max-samples",
        str(PROMPTS), "--out", str(out), "--quiet", PYTHONPATH=str(unpacked),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]
    return calibration_of(summary, records, "")


@pytest.mark.timeout(1200)
def test_a_publish_with_calibration(backend, request, endpoint, tmp_path):
    db = request.getfixturevalue("postgres").new_database() if backend == "postgresql" else None
    server = start_server(
        tmp_path / "registry",
        *(["--db", db] if db else []),
        "--validate",
        "--validate-timeout", "300",
        "--reference-endpoint", endpoint,
        "--reference-model-name", "scripted",
        "--reference-n", str(N),
        "--reference-prompts", str(PROMPTS),
    )  # fmt: skip
    try:
        registry = ["--registry", server.url, "--token", server.token]
        for name, solved in (("echo", False), ("solved", True)):
            published = run_cli("publish", str(_package(tmp_path, name, solved)), *registry, "--wait", "900")
            assert published.returncode == 0, published.stdout + published.stderr

        got = httpx.get(f"{server.url}/api/packages/cal-echo/0.1.0/validation").json()
        assert got["status"] == "passed", got
        figures = got["report"]["calibration"]["cal/echo-v1"]
        assert "reference endpoint" in got["report"]["isolation"]
        assert figures["policy"] == f"{endpoint} model=scripted" and figures["n"] == N
        assert figures["num_prompts"] == PROMPTS and figures["num_samples"] == N * PROMPTS
        assert figures["passes_per_prompt"] == [2, 2, 0]  # 'short', 'One more line ...', 'UPPER and lower'
        assert figures["pass_at_k"][0] == pytest.approx(1 / 3) and figures["pass_at_k"][-1] == pytest.approx(2 / 3)
        assert figures["pass_at_k"] == sorted(figures["pass_at_k"]) and figures["badge"] is None
        assert figures["reward_histogram"][0] == 8 and figures["reward_histogram"][-1] == 4
        assert figures["mean_reward"] == pytest.approx(1 / 3) and figures["failures"] == {}
        assert figures["turns_mean"] == 1 and figures["seconds_mean"] > 0
        assert figures["prompt_tokens_mean"] > 0 and figures["completion_tokens_mean"] > 0
        assert figures["spec_hash"] and figures["sandbox_calls_mean"] is None

        # the same figures as a `molt-env eval` of the same env against the same endpoint
        local = _local_eval(tmp_path, server, "cal-echo", "cal/echo-v1", endpoint)
        timing = ("policy", "seconds_mean", "finished")
        assert {k: v for k, v in figures.items() if k not in timing} == {
            k: v for k, v in sanitize(local).items() if k not in timing
        }

        card = httpx.get(f"{server.url}/envs/cal/echo-v1").text
        assert "How hard it is" in card and '<svg class="passk"' in card and "<script" not in card
        for x, y in curve_points(figures["pass_at_k"]):
            assert f'cx="{x}" cy="{y}"' in card
        assert f"{endpoint} model=scripted" in card and figures["spec_hash"] in card
        assert "Seconds per episode" in card and "Sandbox calls per episode" in card
        assert "Already solved" not in card
        assert figures["prompt_ids"] == [0, 1, 2] and figures["reward_per_prompt"] == [0.5, 0.5, 0.0]
        versions = card.split('class="versions"')[1]  # the version table: the gate's spec hash, verdict and score
        assert figures["spec_hash"] in versions and "passed" in versions
        assert f"{figures['mean_reward']:.3f}" in versions and f"{figures['pass_at_k'][0]:.3f}" in versions

        solved = httpx.get(f"{server.url}/api/packages/cal-solved/0.1.0/validation").json()
        figures = solved["report"]["calibration"]["cal/solved-v1"]
        assert figures["badge"] == "already solved" and figures["pass_at_k"] == [1.0] * N
        card = httpx.get(f"{server.url}/envs/cal/solved-v1").text
        assert "Already solved" in card and 'class="badge solved"' in card
    finally:
        server.stop()


def test_badges_and_a_hostile_calibration_are_bounded():
    summary = {
        "n": 2,
        "reward_range": [0.0, 1.0],
        "pass_threshold": 1.0,
        "spec_hash": "h",
        "package_version": "1",
        "split": "test",
        "num_prompts": 2,
        "num_samples": 4,
        "pass@1": 0.0,
        "pass@2": 0.0,
        "mean_reward": 0.0,
        "failures": {},
        "turns_mean": 1.0,
        "prompt_tokens_mean": 3.0,
        "completion_tokens_mean": 1.0,
        "latency_s": {"mean": 0.1},
    }
    records = [{"prompt_id": p, "completed": True, "reward": 0.0, "info": {"sandbox_calls": 3}} for p in (0, 0, 1, 1)]
    figures = calibration_of(summary, records, "ref")
    assert figures["badge"] == "nothing to learn" and figures["sandbox_calls_mean"] == 3
    records[2]["reward"] = records[3]["reward"] = 1.0
    records[1]["completed"] = False  # counts as the floor of the reward range
    mixed = calibration_of(summary, records, "ref")
    assert mixed["badge"] == "all or nothing" and mixed["prompt_ids"] == [0, 1]
    assert mixed["reward_per_prompt"] == [0.0, 1.0]
    kept = sanitize({**mixed, "reward_per_prompt": ["<b>", 0.5], "prompt_ids": ["x", 3]})
    assert kept["reward_per_prompt"] == [None, 0.5] and kept["prompt_ids"] == [3]
    hostile = {**figures, "pass_at_k": ["<script>", float("nan"), 0.5], "badge": "<b>", "policy": "x" * 10_000}
    kept = sanitize(hostile)
    assert kept["pass_at_k"] == [None, None] and kept["badge"] is None and len(kept["policy"]) == 300
    assert sanitize({"n": "many"}) is None and sanitize([1]) is None
    with pytest.raises(Exception, match="must be an http:// URL"):
        Reference("file:///etc/passwd")


def _pass_at_k(passes: list[int], n: int) -> list[float]:
    """The unbiased pass@k estimator for k = 1..n, averaged over prompts (what ``molt-env eval`` reports)."""
    return [sum(1 - math.comb(n - c, k) / math.comb(n, k) for c in passes) / len(passes) for k in range(1, n + 1)]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_foreign_id_calibrated_by_the_operator(backend, endpoint, tmp_path):
    """``molt-env calibrate rg:products`` stores the reference eval under the ID; its hub card (cached before) then
    shows the curve, figures and stamp as a native card does, and says so when the installed spec moved on."""
    import env_registry
    from env_registry.datasets import load_split

    server = start_server(tmp_path / "registry")
    try:
        card = httpx.get(f"{server.url}/envs/rg:products", timeout=60)
        assert card.status_code == 200 and "Not calibrated" in card.text and '<svg class="passk"' not in card.text
        done = run_cli(
            "calibrate", "rg:products", "--root", str(server.root), "--reference-endpoint", endpoint,
            "--reference-model-name", "scripted", "--reference-n", str(N), "--reference-prompts", str(PROMPTS),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        stored = json.loads((server.root / "calibrations" / "rg%3Aproducts.json").read_text())
        spec = env_registry.spec("rg:products")
        rows = load_split(spec, "test", PROMPTS)
        expressions = [re.search(r"multiplication: ([\d *]+)\.", r["prompt"][-1]["content"])[1] for r in rows]
        passes = [products_right(e, N) for e in expressions]
        assert len(set(passes)) > 1  # the rows give a curve, not a constant
        assert stored["env_id"] == "rg:products" and stored["policy"] == f"{endpoint} model=scripted"
        assert stored["passes_per_prompt"] == passes and stored["spec_hash"] == spec.hash
        assert stored["pass_at_k"] == pytest.approx(_pass_at_k(passes, N))
        assert stored["num_samples"] == N * PROMPTS and stored["failures"] == {} and stored["split"] == "test"

        card = httpx.get(f"{server.url}/envs/rg:products", timeout=60)
        assert card.headers.get("x-cache") == "miss"  # the store's write advanced the stamp: re-rendered
        text = card.text
        assert "How hard it is" in text and '<svg class="passk"' in text and "Not calibrated" not in text
        for x, y in curve_points(stored["pass_at_k"]):
            assert f'cx="{x}" cy="{y}"' in text
        assert f"{endpoint} model=scripted" in text and "Seconds per episode" in text and "<script" not in text
        assert "reasoning-gym" in text.split('class="stamp"')[1] and "Calibrated against spec hash" not in text

        from env_registry.store.local import LocalRegistry
        from env_registry.validation.foreign import store_calibration

        store = LocalRegistry(server.root)
        store_calibration(store, "rg:products", {**stored, "spec_hash": "0000000000000000"})  # as if upstream moved
        store.close()
        text = httpx.get(f"{server.url}/envs/rg:products", timeout=60).text
        assert "Calibrated against spec hash <code>0000000000000000</code>" in text

        refused = run_cli("calibrate", "cal/echo-v1", "--root", str(server.root), "--reference-endpoint", endpoint)
        assert refused.returncode == 2 and "'cal/echo-v1' is not another ecosystem's ID" in refused.stderr
    finally:
        server.stop()


def test_reference_flags_are_checked_before_anything_starts(tmp_path, capsys):
    from env_registry.cli import main

    root = str(tmp_path / "registry")
    assert main(["serve", "--root", root, "--validate", "--reference-checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--reference-checkpoint {str(tmp_path)!r} is no Hugging Face checkpoint" in err
    with pytest.raises(SystemExit):
        main(
            [
                "serve",
                "--root",
                root,
                "--validate",
                "--reference-checkpoint",
                root,
                "--reference-endpoint",
                "http://x/v1",
            ]
        )
    assert "--reference-endpoint: not allowed with argument --reference-checkpoint" in capsys.readouterr().err
    assert main(["serve", "--root", root, "--reference-endpoint", "http://127.0.0.1:9/v1"]) == 2
    assert "runs only with --validate" in capsys.readouterr().err
    assert main(["validate", str(tmp_path), "--reference-n", "2"]) == 2
    assert "--reference-n set the reference policy's eval, but no policy is given" in capsys.readouterr().err
    assert not (tmp_path / "registry").exists()  # nothing started
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(Exception, match="holds no weights"):
        checkpoint_stamp(tmp_path / "ckpt")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_checkpoint_as_the_reference_policy(backend, tmp_path, tiny_model, tiny_tokenizer):
    """``--reference-checkpoint``: the server serves a tiny checkpoint itself (molt-train serve), the gate calibrates
    through it, the figures and the card are stamped with its path and content hash, and it stops with the server."""
    from molt_train.models.tiny import save_tiny

    checkpoint = save_tiny(tiny_model, tiny_tokenizer, tmp_path / "tiny")
    stamp = checkpoint_stamp(checkpoint)
    server = start_server(
        tmp_path / "registry", "--validate", "--validate-timeout", "300", "--reference-checkpoint", str(checkpoint),
        "--reference-n", "2", "--reference-prompts", "2", "--reference-max-new-tokens", "4", deadline_s=240,
    )  # fmt: skip
    try:
        served = re.search(r"serving the reference checkpoint at (\S+) ", (tmp_path / "registry-serve.log").read_text())
        assert served and httpx.get(served[1].removesuffix("/v1") + "/health").json()["status"] == "ok"
        registry = ["--registry", server.url, "--token", server.token]
        published = run_cli("publish", str(_package(tmp_path, "echo", False)), *registry, "--wait", "600")
        assert published.returncode == 0, published.stdout + published.stderr
        got = httpx.get(f"{server.url}/api/packages/cal-echo/0.1.0/validation").json()
        figures = got["report"]["calibration"]["cal/echo-v1"]
        assert figures["policy"] == f"checkpoint {stamp}" and str(checkpoint.resolve()) in stamp
        assert figures["num_samples"] == 4 and figures["failures"] == {} and figures["completion_tokens_mean"] > 0
        card = httpx.get(f"{server.url}/envs/cal/echo-v1").text
        assert f"checkpoint {stamp}" in card and '<svg class="passk"' in card
    finally:
        server.stop()
    deadline = time.monotonic() + 30  # the served checkpoint stops with the server (a SIGTERM: not at once, loaded)
    with pytest.raises(httpx.HTTPError):
        while time.monotonic() < deadline:
            httpx.get(served[1].removesuffix("/v1") + "/health", timeout=5)
            time.sleep(0.2)
    (checkpoint / "config.json").write_text((checkpoint / "config.json").read_text() + " ")
    assert checkpoint_stamp(checkpoint) != stamp  # the stamp is the content's, not the name's
