"""``molt-env eval`` as users run it: real processes against a real ``molt-train serve`` endpoint (tiny model)."""

from __future__ import annotations

import contextlib
import html
import json
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import eval_envs  # noqa: E402
from eval_support import MOLT_ENV, cli_env, front, molt_env, samples, serve, stop, summary  # noqa: E402

import env_registry  # noqa: E402
from env_registry.cli import main  # noqa: E402
from env_registry.evaluation import pass_at_k  # noqa: E402

COIN = "eval_envs:test/coin-v1"
COIN1 = "eval_envs:test/coin1-v1"  # the same, declared single-turn (max_turns = 1)
CHAT_COIN = "eval_envs:test/chat-coin-v1"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model, tiny_tokenizer) -> Path:
    from molt_train.models.tiny import save_tiny

    return save_tiny(tiny_model, tiny_tokenizer, tmp_path_factory.mktemp("eval-model") / "hf")


@pytest.fixture(scope="module")
def endpoint(checkpoint):
    url, proc = serve(checkpoint, "--max-tokens", "8")
    yield url
    stop(proc)


def eval_here(capsys, *args: str) -> tuple[int, str, str]:
    """``molt-env eval ARGS`` in this process (the CLI's own code path, without an interpreter start)."""
    rc = main(["eval", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def hand_pass_at_k(records: list[dict], k: int) -> float:
    by_prompt: dict[int, list[float]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], []).append(r["reward"])
    values = [pass_at_k(len(v), sum(x == 1.0 for x in v), k) for v in by_prompt.values()]
    return sum(values) / len(values)


def test_mix_of_env_and_chat_agent_against_the_endpoint(endpoint, tmp_path, capsys, monkeypatch):
    out = tmp_path / "eval"
    rc, _, err = eval_here(
        capsys, "--env", f"{COIN}:3", "--env", CHAT_COIN, "--base-url", f"{endpoint}/v1", "--model-name", "policy",
        "-n", "4", "--k", "1,2,4", "--max-samples", "2", "--max-new-tokens", "6", "--concurrency", "8",
        "--out", str(out),
    )  # fmt: skip
    assert rc == 0, err
    result = summary(out)
    for key in ("env_id", "split", "num_prompts", "n", "pass@1", "pass@4", "mean_reward", "failures", "model", "seed",
                "started", "finished"):  # fmt: skip
        assert key in result, key
    assert result["env_id"] == ["test/coin-v1", "test/chat-coin-v1"] and result["n"] == 4
    assert result["weights"] == {"test/coin-v1": 0.75, "test/chat-coin-v1": 0.25}
    records = samples(out)
    assert len(records) == 2 * 2 * 4 and result["failures"] == {}
    for env_id, per_env in result["envs"].items():
        mine = [r for r in records if r["env_id"] == env_id]
        for key in ("package_version", "spec_hash", "split", "num_prompts"):
            assert key in per_env
        for k in (1, 2, 4):
            assert per_env[f"pass@{k}"] == pytest.approx(hand_pass_at_k(mine, k))
        assert per_env["mean_reward"] == pytest.approx(sum(r["reward"] for r in mine) / len(mine))
        assert all(r["completion_tokens"] and r["prompt_tokens"] and r["turns"] == 1 for r in mine)
    assert result["pass@1"] == pytest.approx(
        0.75 * result["envs"]["test/coin-v1"]["pass@1"] + 0.25 * result["envs"]["test/chat-coin-v1"]["pass@1"]
    )
    assert 0 < result["envs"]["test/coin-v1"]["pass@1"] < 1  # the coin env separates passes from fails
    chat = next(r for r in records if r["env_id"] == "test/chat-coin-v1")
    assert chat["transcript"][0]["request"]["messages"] == chat["prompt"]  # recorded through the eval's proxy
    assert (out / "report.png").stat().st_size > 1000 and "pass@4" in (out / "report.md").read_text()
    lock = json.loads((out / "molt_env_lock.json").read_text())  # the envs evaluated, as training stamps them
    assert lock == result["env_lock"] and lock["format"] == 1
    assert [(e["id"], e["spec_id"], e["weight"]) for e in lock["envs"]] == [
        (COIN, "test/coin-v1", 0.75),
        (CHAT_COIN, "test/chat-coin-v1", 0.25),
    ]
    for entry in lock["envs"]:
        per_env = result["envs"][entry["spec_id"]]
        assert (entry["spec_hash"], entry["version"]) == (per_env["spec_hash"], per_env["package_version"])
        assert {"package", "kwargs", "upstream"} <= set(entry)

    monkeypatch.setenv("MOLT_TEST_FLIP", "1")  # a new grader: every grade inverts
    rc, _, err = eval_here(capsys, "--reverify", str(out))
    assert rc == 0, err
    again = summary(out, "summary.reverified.json")
    assert again["reverified_changed"] == len(records) and samples(out) == records  # the originals stay
    assert again["envs"]["test/coin-v1"]["mean_reward"] == pytest.approx(
        1 - result["envs"]["test/coin-v1"]["mean_reward"]
    )

    # another version of an env re-grades the same samples; the diff names exactly the episodes it changes
    monkeypatch.delenv("MOLT_TEST_FLIP")
    monkeypatch.setattr(env_registry.registry, "_specs", dict(env_registry.registry._specs))  # undone after the test
    env_registry.register(
        "test/coin-v2",
        "eval_envs:CoinEnvV2",
        kind="env",
        max_turns=3,
        datasets={"test": eval_envs.DATA, "train": eval_envs.DATA},
    )
    rc, out_, err = eval_here(capsys, "--reverify", str(out), "eval_envs:test/coin-v2")
    assert rc == 0, err
    diff = json.loads((out / "reverify_diff.json").read_text())
    odd = {
        (r["env_id"], r["prompt_id"], r["sample"])
        for r in records
        if r["env_id"] == "test/coin-v1" and len(r["actions"][0]) % 2
    }
    assert {(c["env_id"], c["prompt_id"], c["sample"]) for c in diff["changed"]} == odd and odd
    assert all(c["delta"] in (-1.0, 1.0) and c["spec_hash"][0] != c["spec_hash"][1] for c in diff["changed"])
    assert diff["replaced"] == {"test/coin-v1": "eval_envs:test/coin-v2"} and f"{len(odd)} rewards changed" in out_
    from env_registry.hub.viewer import load

    index, _ = load(out)  # each changed episode's link opens that episode in the viewer
    for c in diff["changed"]:
        shown = index.record(int(c["episode"].removeprefix("/episodes/")))
        assert (shown["env_id"], shown["prompt_id"], shown["sample"]) == (c["env_id"], c["prompt_id"], c["sample"])
    rc, _, err = eval_here(capsys, "--reverify", str(out), "eval_envs:test/tool-v1")
    assert (
        rc == 2 and "'eval_envs:test/tool-v1' replaces none of the eval's envs (test/coin-v1, test/chat-coin-v1)" in err
    )


def test_anthropic_wire_for_env_and_chat_agent(endpoint, tmp_path, capsys):
    out = tmp_path / "eval"
    rc, _, err = eval_here(
        capsys, COIN, "molt/chat-gsm8k-anthropic-v1", "--base-url", endpoint, "--wire", "anthropic",
        "--max-samples", "1", "--max-new-tokens", "4", "--out", str(out), "--quiet",
    )  # fmt: skip
    assert rc == 0, err
    records = samples(out)
    assert len(records) == 2 and all(r["completed"] and r["completion_tokens"] for r in records)
    assert {r["env_id"] for r in records} == {"test/coin-v1", "molt/chat-gsm8k-anthropic-v1"}
    chat = next(r for r in records if r["env_id"] == "molt/chat-gsm8k-anthropic-v1")
    assert chat["transcript"][0]["wire"] == "anthropic" and chat["transcript"][0]["status"] == 200


def test_a_killed_eval_resumes_without_losing_or_repeating_a_sample(endpoint, tmp_path, capsys):
    out = tmp_path / "eval"
    args = [MOLT_ENV, "eval", COIN, "--base-url", f"{endpoint}/v1", "-n", "2", "--max-samples", "8",
            "--max-new-tokens", "4", "--concurrency", "1", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(args, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        (out / "samples.jsonl").is_file() and len(samples(out)) >= 3
    ):  # wait for some samples
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = samples(out)
    assert 3 <= len(before) < 16
    with (out / "samples.jsonl").open("a") as f:
        f.write('{"env_id": "test/coin-v1", "prompt_id": 0, "sam')  # a line torn by the kill
    done = subprocess.run(args, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = samples(out)
    keys = Counter((r["prompt_id"], r["sample"]) for r in after)
    assert len(after) == 16 and set(keys.values()) == {1}
    assert after[: len(before)] == before  # the samples done before the kill are kept as they were
    result = summary(out)
    assert result["num_samples"] == 16 and result["samples_this_run"] == 16 - len(before)

    rc, _, err = eval_here(capsys, COIN, "--base-url", f"{endpoint}/v1", "--temperature", "0.5", "--out", str(out))
    assert rc == 2 and "temperature" in err and "another --out" in err


def test_model_dir_is_served_for_the_eval(checkpoint, tmp_path, capsys):
    out = tmp_path / "eval"
    rc, _, err = eval_here(capsys, COIN, "--model", str(checkpoint), "--max-samples", "1", "-n", "2",
                           "--max-new-tokens", "4", "--out", str(out), "--quiet")  # fmt: skip
    assert rc == 0, err
    result = summary(out)
    assert result["model"] == f"hf:{checkpoint}" and result["num_samples"] == 2 and result["failures"] == {}


def test_bad_input_is_a_clear_error_before_anything_starts(endpoint, tmp_path, capsys):
    cases = {
        ("--model", str(tmp_path)): "no config.json",
        ("--base-url", "http://127.0.0.1:9/v1"): "cannot reach the endpoint",
        ("--base-url", f"{endpoint}/v1", "-n", "2", "--k", "1,4"): "--k 4 is not possible with -n 2",
        ("--base-url", f"{endpoint}/v1", "--env", f"{COIN}:abc"): "weight 'abc' is not a number",
        ("--base-url", f"{endpoint}/v1", "--env", f"{COIN}:0"): "finite number > 0",
        ("--base-url", f"{endpoint}/v1", "--env", "molt/arith-v9"): "version v9",
        ("--base-url", f"{endpoint}/v1", "--split", "nope"): "no dataset split 'nope'",
    }
    for args, message in cases.items():
        env_ids = [] if "--env" in args else [COIN]
        rc, out, err = eval_here(capsys, *env_ids, *args, "--out", str(tmp_path / "never"))
        assert rc == 2, (args, out, err)
        assert message in err and "Traceback" not in err, (args, err)
    done = molt_env("eval", COIN, "--base-url", "http://127.0.0.1:9/v1")  # the same as a real process
    assert done.returncode == 2 and "cannot reach the endpoint" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "never" / "samples.jsonl").exists()


def test_a_hung_grader_is_a_counted_timeout(endpoint, tmp_path):
    out = tmp_path / "eval"
    done = molt_env("eval", "eval_envs:test/hang-v1", "--base-url", f"{endpoint}/v1", "--max-samples", "1",
                    "--max-new-tokens", "4", "--timeout", "2", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr  # and the process ended, though the grader's thread still sleeps
    assert summary(out)["failures"] == {"timeout": 1}
    assert [r["failure"]["reason"] for r in samples(out)] == ["timeout"]


def test_endpoint_errors_are_retried_then_counted(endpoint, tmp_path, capsys):
    """A flaky front of the endpoint (429, then 503, on each chat call) is retried through with back-off; a front
    that always fails is counted, one endpoint_error per sample."""
    seen: Counter = Counter()
    mode = ["flaky"]

    def answer(path, body):
        seen[(path, body)] += 1
        tries = seen[(path, body)]
        if path.endswith("/chat/completions") and (mode[0] == "dead" or tries <= 2):
            return (500 if mode[0] == "dead" else (429 if tries == 1 else 503)), {"error": {"message": "try again"}}
        return None

    with front(endpoint, answer) as url:
        rc, _, err = eval_here(capsys, COIN, "--base-url", f"{url}/v1", "--max-samples", "2", "--max-new-tokens", "4",
                               "--out", str(tmp_path / "flaky"), "--quiet")  # fmt: skip
        assert rc == 0, err
        assert summary(tmp_path / "flaky")["failures"] == {}
        chats = [n for (path, _), n in seen.items() if path.endswith("/chat/completions")]
        assert chats == [3, 3]  # 429, 503, then the answer
        mode[0] = "dead"
        seen.clear()
        rc, _, err = eval_here(capsys, COIN, "--base-url", f"{url}/v1", "--max-samples", "2",
                               "--max-new-tokens", "4", "--max-retries", "1", "--out", str(tmp_path / "dead"), "--quiet")  # fmt: skip
        assert rc == 0, err
        assert summary(tmp_path / "dead")["failures"] == {"endpoint_error": 2}
        assert all("500" in r["failure"]["detail"] for r in samples(tmp_path / "dead"))
        assert [n for (path, _), n in seen.items() if path.endswith("/chat/completions")] == [2, 2]  # 1 retry


def test_single_turn_samples_go_as_one_request_with_n(endpoint, tmp_path, capsys):
    """-n 4 of a single-turn env: one request with n=4 per prompt to a real molt-train serve, four samples each
    with its own token counts; pass@k as computed by hand; a resume requests only a prompt's missing samples."""
    chats: list[dict] = []

    def count(path, body):
        if path.endswith("/chat/completions"):
            chats.append(json.loads(body))
        return None

    out = tmp_path / "eval"
    with front(endpoint, count) as url:
        rc, _, err = eval_here(capsys, COIN1, "--base-url", f"{url}/v1", "-n", "4", "--k", "1,2,4", "--max-samples",
                               "3", "--max-new-tokens", "6", "--out", str(out), "--quiet")  # fmt: skip
        assert rc == 0, err
        assert [c.get("n") for c in chats] == [4, 4, 4]
        result, records = summary(out), samples(out)
        assert result["requests"]["test/coin1-v1"] == {
            "mode": "n", "n_requests": 3, "single_requests": 0, "why_separate": None
        }  # fmt: skip
        assert len(records) == 12 and result["failures"] == {}
        for k in (1, 2, 4):
            assert result[f"pass@{k}"] == pytest.approx(hand_pass_at_k(records, k))
        assert 0 < result["pass@1"] < 1
        for prompt_id in range(3):
            mine = [r for r in records if r["prompt_id"] == prompt_id]
            assert sorted(r["sample"] for r in mine) == [0, 1, 2, 3]
            assert sorted(r["request"]["choice"] for r in mine) == [0, 1, 2, 3]
            assert all(r["request"]["n"] == 4 and r["completion_tokens"] and r["prompt_tokens"] for r in mine)
            assert len({r["transcript"][-1]["content"] for r in mine}) > 1  # four distinct samples, not one copied
        chats.clear()
        rc, _, err = eval_here(capsys, COIN1, "--base-url", f"{url}/v1", "-n", "6", "--max-samples", "3",
                               "--max-new-tokens", "6", "--out", str(out), "--quiet")  # fmt: skip
        assert rc == 0, err
        assert [c.get("n") for c in chats] == [2, 2, 2]  # only the missing samples 4 and 5 of each prompt
        again = samples(out)
        assert again[:12] == records and len(again) == 18
        assert summary(out)["pass@6"] == pytest.approx(hand_pass_at_k(again, 6))


def test_an_endpoint_that_refuses_n_gets_separate_requests(endpoint, tmp_path, capsys):
    chats: list[dict] = []

    def refuse_n(path, body):
        if path.endswith("/chat/completions"):
            chats.append(json.loads(body))
            if chats[-1].get("n", 1) != 1:
                return 400, {"error": {"message": "n must be 1", "type": "invalid_request_error"}}
        return None

    out = tmp_path / "eval"
    with front(endpoint, refuse_n) as url:
        rc, _, err = eval_here(capsys, COIN1, "--base-url", f"{url}/v1", "-n", "3", "--max-samples", "3",
                               "--max-new-tokens", "6", "--concurrency", "1", "--out", str(out), "--quiet")  # fmt: skip
    assert rc == 0, err
    assert [c.get("n", 1) for c in chats] == [3] + [1] * 9  # refused once, then one request per sample
    requests = summary(out)["requests"]["test/coin1-v1"]
    assert requests["mode"] == "mixed" and requests["n_requests"] == 1 and requests["single_requests"] == 9
    assert "HTTP 400" in requests["why_separate"] and "n must be 1" in requests["why_separate"]
    records = samples(out)
    assert len(records) == 9 and all(r["completed"] and r["completion_tokens"] for r in records)
    assert not any("request" in r for r in records)
    assert summary(out)["pass@3"] == pytest.approx(hand_pass_at_k(records, 3))


def test_multi_turn_envs_and_chat_agents_send_one_request_per_sample(endpoint, tmp_path, capsys):
    out = tmp_path / "eval"
    rc, _, err = eval_here(capsys, "--env", COIN, "--env", CHAT_COIN, "--base-url", f"{endpoint}/v1", "-n", "2",
                           "--max-samples", "1", "--max-new-tokens", "4", "--out", str(out), "--quiet")  # fmt: skip
    assert rc == 0, err
    requests = summary(out)["requests"]
    assert requests["test/coin-v1"]["mode"] == "separate" and requests["test/coin-v1"]["single_requests"] == 2
    assert "multi-turn" in requests["test/coin-v1"]["why_separate"]
    assert (
        requests["test/chat-coin-v1"]["mode"] == "separate"
        and "chat_agent" in requests["test/chat-coin-v1"]["why_separate"]
    )


def test_publish_results_needs_a_registry_server(endpoint, tmp_path, capsys):
    rc, _, err = eval_here(
        capsys, COIN, "--base-url", f"{endpoint}/v1", "--publish-results", "--registry", str(tmp_path)
    )
    assert rc == 2 and "--publish-results needs a registry server" in err


def test_publish_results_uploads_the_summary_per_release(endpoint, server, letter_count, tmp_path, capsys):
    """The example package published to a live registry server; its eval summary uploaded next to the release."""
    import httpx

    from env_registry.packages.build import read_source
    from env_registry.registry import registry
    from env_registry.store.client import RegistryClient
    from env_registry.store.local import Conflict

    with contextlib.suppress(Conflict):  # another test may have published it to the session's server
        RegistryClient(server.url, server.token).publish(letter_count)
    source = read_source(Path(__file__).resolve().parents[2] / "examples" / "envs" / "acme_letter_count")
    sys.path.insert(0, str(source.root))
    [manifest] = source.manifests
    fields = manifest.model_dump(exclude={"id", "entry_point"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # registered again when the server is parametrized
        registry.register(
            manifest.id, manifest.entry_point, **fields, package=source.name, package_version=source.version
        )
    out = tmp_path / "eval"
    rc, printed, err = eval_here(
        capsys, manifest.id, "--base-url", f"{endpoint}/v1", "--max-samples", "2", "--max-new-tokens", "4",
        "--out", str(out), "--publish-results", "--registry", server.url, "--token", server.token, "--quiet",
    )  # fmt: skip
    assert rc == 0, err
    assert f"published the eval of {manifest.id}" in printed
    stored = httpx.get(f"{server.url}/api/packages/{source.name}/{source.version}/evals").json()
    assert stored and stored[-1]["summary"]["spec_hash"] == summary(out)["spec_hash"]
    # its episodes too: on the hub, in the viewer's pages, linked from the env page's eval table
    assert stored[-1]["samples"] and f"published its episodes: {server.url}/evals/{stored[-1]['id']}/" in printed
    episodes = httpx.get(f"{server.url}/evals/{stored[-1]['id']}/")
    assert episodes.status_code == 200 and f"{len(samples(out))} of {len(samples(out))} episodes" in episodes.text
    first = httpx.get(f"{server.url}/evals/{stored[-1]['id']}/episodes/0").text
    record = min(samples(out), key=lambda r: (r["prompt_id"], r["sample"]))
    label = record["label"] if isinstance(record["label"], str) else json.dumps(record["label"])
    assert f"prompt {record['prompt_id']}, sample 0" in first and f"<pre>{html.escape(label)}</pre>" in first
    card = httpx.get(f"{server.url}/envs/{manifest.id}", params={"version": source.version}).text
    assert f'href="/evals/{stored[-1]["id"]}/"' in card
    # the spec hash the hub shows for the version (from the stored manifest) is the one the eval ran under
    assert f"<code>{summary(out)['spec_hash']}</code>" in card.split('class="versions"')[1]


def test_molt_train_eval_is_the_same_loop_with_pass_at_k(checkpoint, capsys):
    """``molt-train eval`` (and the trainer's periodic eval: the same ``RolloutWorker.evaluate``) goes through
    ``env_registry.evaluation``: n samples per row, pass@k for every k <= n, failures by reason."""
    import json

    from molt_train import eval_cli

    argv = ["--env", COIN, "--actor.model_name_or_path", str(checkpoint), "--eval.max_samples", "3",
            "--eval.n_samples_per_prompt", "4", "--eval.temperature", "1.0", "--rollout.max_new_tokens", "4"]  # fmt: skip
    assert eval_cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["num_rows"] == 3 and result["failed"] == 0
    assert [k for k in result if k.startswith("pass@")] == ["pass@1", "pass@2", "pass@3", "pass@4"]
    assert result["accuracy"] == pytest.approx(result["pass@1"])  # 0/1 rewards, every sample completed
    assert result["pass@4"] > 0.0 and result["pass@1"] <= result["pass@4"] <= 1.0


def test_molt_train_eval_scores_each_env_of_a_mix_next_to_the_overall_figures(checkpoint, capsys):
    """``molt-train eval --env A:W --env B``: ``--eval.max_samples`` rows of each env, each env's figures as its own
    eval would give them, the overall ones over all rows (a weight changes nothing at eval)."""
    import json

    from molt_train import eval_cli

    arith, sort = "molt/arith-v1", "molt/sort-v1"
    common = ["--actor.model_name_or_path", str(checkpoint), "--eval.max_samples", "3", "--rollout.max_new_tokens", "4"]

    def run(*envs: str) -> dict:
        assert eval_cli.main([*(a for e in envs for a in ("--env", e)), *common]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    mixed = run(f"{arith}:3", sort)
    assert mixed["env"] == [arith, sort] and mixed["split"] == "test"
    import env_registry

    assert [(e["id"], e["version"], e["spec_hash"], e["weight"]) for e in mixed["env_lock"]["envs"]] == [
        (arith, env_registry.spec(arith).package_version, env_registry.spec(arith).hash, 0.75),
        (sort, env_registry.spec(sort).package_version, env_registry.spec(sort).hash, 0.25),
    ]
    assert mixed["num_rows"] == 6 and mixed[f"{arith}/num_rows"] == mixed[f"{sort}/num_rows"] == 3
    for env_id in (arith, sort):
        alone = run(env_id)
        assert alone["env"] == env_id and alone["num_rows"] == 3  # one env prints as before
        for key in ("accuracy", "failed", "response_length", "pass@1"):
            assert mixed[f"{env_id}/{key}"] == pytest.approx(alone[key]), (env_id, key)
    assert mixed["accuracy"] == pytest.approx((mixed[f"{arith}/accuracy"] + mixed[f"{sort}/accuracy"]) / 2)
    assert mixed["failed"] == mixed[f"{arith}/failed"] + mixed[f"{sort}/failed"]
    assert 0.0 < mixed[f"{sort}/response_length"] <= 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "molt/arith-v1", "--env", "molt/sortt-v1"], r"--env 'molt/sortt-v1'.*molt-env list"),
        (["--env", "molt/arith-v1:0"], r"--env 'molt/arith-v1:0': the weight must be a finite number > 0"),
        (
            ["--env", "molt/arith-v1", "--env", "molt/sort-v1", "--eval.dataset", "rows.jsonl"],
            r"--eval.dataset 'rows.jsonl' holds one env's rows; give one --env with it, not a mix",
        ),
    ],
)
def test_molt_train_eval_refuses_a_bad_mix_by_name_before_loading_a_model(argv, message, monkeypatch, capsys):
    import re

    from molt_train import eval_cli

    def no_eval(cfg, model_path):
        raise AssertionError("the checkpoint was loaded for a refused mix")

    monkeypatch.setattr(eval_cli, "evaluate_checkpoint", no_eval)
    with pytest.raises(SystemExit) as info:
        eval_cli.main([*argv, "--actor.model_name_or_path", "m"])
    assert info.value.code == 2
    assert re.search(message, capsys.readouterr().err), message
