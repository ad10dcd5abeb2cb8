"""Where an env is judged on the hub, over HTTP on both backends: its versions side by side (spec hash, verdict,
reference score), the reference evals of two versions compared prompt by prompt (from the stored calibrations:
the hub runs no package code), an uploaded eval's episodes in the viewer's pages, and the env page in the page
cache (a hit until a verdict or an eval upload changes it)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import httpx
import pytest
from packaging_support import SUMMARY, publish

sys.path.insert(0, str(Path(__file__).parent))

from test_hub_pages import active_content  # noqa: E402

from env_registry.evaluation.passk import mean_pass_at_k  # noqa: E402
from env_registry.store.client import RegistryClient  # noqa: E402
from env_registry.store.local import Conflict, LocalRegistry, NotFound  # noqa: E402
from env_registry.validation.calibration import calibration_of  # noqa: E402

ENV, PACKAGE = "hub/versions-v1", "hub-versions"
HOSTILE = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2"> <a href="javascript:alert(3)">x</a>'
# the reference policy's rewards, prompt -> its n = 4 samples, in each version (1.1.0 fixed prompt 0's grader)
REWARDS = {
    "1.0.0": {0: [1.0, 1.0, 0.0, 0.0], 1: [1.0, 1.0, 1.0, 1.0], 2: [0.0, 0.0, 0.0, 0.0]},
    "1.1.0": {0: [1.0, 1.0, 1.0, 1.0], 1: [1.0, 1.0, 1.0, 1.0], 2: [0.0, 0.0, 0.0, 0.5], 3: [1.0, 0.0, 0.0, 0.0]},
}


def spec_of(version: str) -> str:
    """The spec hash the reference eval of ``version`` reports (made up: the hub shows what was stored)."""
    return hashlib.sha256(version.encode()).hexdigest()[:16]


def calibrate(server, version: str, rewards: dict[int, list[float]]) -> dict:
    """Store the gate's verdict on ``version`` with a reference eval of ``rewards`` (its figures made by the
    calibration's own ``calibration_of``, as the jailed worker makes them); returns the figures."""
    records = [{"prompt_id": p, "completed": True, "reward": r} for p, rs in rewards.items() for r in rs]
    n = len(next(iter(rewards.values())))
    counts = [(n, sum(r >= 1.0 for r in rs)) for rs in rewards.values()]
    summary = {
        "n": n, "reward_range": [0.0, 1.0], "pass_threshold": 1.0, "spec_hash": spec_of(version),
        "package_version": version, "split": "test", "num_prompts": len(rewards), "num_samples": len(records),
        **{f"pass@{k}": mean_pass_at_k(counts, k) for k in range(1, n + 1)},
        "mean_reward": sum(r["reward"] for r in records) / len(records), "failures": {}, "turns_mean": 1.0,
        "prompt_tokens_mean": 9.0, "completion_tokens_mean": 3.0, "latency_s": {"mean": 0.2},
        "finished": f"2026-12-0{len(rewards)}T12:00:00Z",
    }  # fmt: skip
    figures = calibration_of(summary, records, "ref model=scripted")
    report = {"isolation": "jail", "checks": [{"name": "determinism", "passed": True, "detail": "", "env_id": ENV}]}
    report["samples"] = {ENV: {"test": [f"Repeat the following text exactly:\nprompt {p}" for p in rewards]}}
    registry = LocalRegistry(server.root, db=server.db)
    try:
        assert registry.set_validation(PACKAGE, version, "passed", {**report, "calibration": {ENV: figures}})
    finally:
        registry.close()
    return figures


def rows(page: str, table: str) -> list[list[str]]:
    """The text of each cell of each body row of ``<table class="{table}">``."""
    body = re.search(rf'<table class="{table}">.*?<tbody>(.*?)</tbody>', page, re.S)[1]
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    ]


def test_versions_side_by_side_and_what_changed_between_them(server, hub_versions):
    publish(server, hub_versions["1.0.0"], hub_versions["1.1.0"])
    old, new = calibrate(server, "1.0.0", REWARDS["1.0.0"]), calibrate(server, "1.1.0", REWARDS["1.1.0"])
    card = httpx.get(f"{server.url}/envs/{ENV}")
    assert card.status_code == 200
    versions = rows(card.text, "versions")
    assert [r[:6] for r in versions] == [
        ["1.1.0", spec_of("1.1.0"), "passed", f"{new['mean_reward']:.3f}", f"{new['pass_at_k'][0]:.3f}", "vs 1.0.0"],
        ["1.0.0", spec_of("1.0.0"), "passed", f"{old['mean_reward']:.3f}", f"{old['pass_at_k'][0]:.3f}", ""],
    ]
    assert f'href="/envs/{ENV}/diff/1.0.0..1.1.0"' in card.text

    # the newer version's page and the diff page: prompt 0 gained 0.5, 1 is the same, 2 gained 0.125, 3 is new
    expected = [["0", "0.500", "1.000", "+0.500", "2", "4"], ["1", "1.000", "1.000", "+0.000", "4", "4"]]
    expected += [["2", "0.000", "0.125", "+0.125", "0", "0"], ["3", "—", "0.250", "only in 1.1.0", "—", "1"]]
    diff = httpx.get(f"{server.url}/envs/{ENV}/diff/1.0.0..1.1.0")
    assert diff.status_code == 200 and active_content(diff.text) == []
    assert rows(diff.text, "diff") == expected and rows(card.text, "diff") == expected
    assert "3 of 4 prompt(s) changed" in diff.text
    assert f"({new['mean_reward'] - old['mean_reward']:+.3f})" in diff.text
    older = httpx.get(f"{server.url}/envs/{ENV}", params={"version": "1.0.0"}).text
    assert 'id="changes"' not in older  # nothing older to compare with

    for path, status, named in [
        ("/diff/1.0.0..9.9.9", 404, "has no version &#39;9.9.9&#39;"),
        ("/diff/1.0.0", 400, "1.0.0&#39; is not a version range"),
        ("/diff/1.0.0..not a version", 400, "not a version"),
    ]:
        refused = httpx.get(f"{server.url}/envs/{ENV}{path}")
        assert refused.status_code == status and named in refused.text, (path, refused.text[-400:])
    assert httpx.get(f"{server.url}/envs/hub/nothing-v1/diff/1.0.0..1.1.0").status_code == 404


def test_the_env_page_is_cached_until_a_verdict_or_an_eval_changes_it(server, hub_versions):
    publish(server, hub_versions["1.0.0"], hub_versions["1.1.0"])
    url = f"{server.url}/envs/{ENV}?version=1.1.0"
    httpx.get(url)
    again = httpx.get(url)
    assert again.headers["x-cache"] == "hit"
    calibrate(server, "1.1.0", {0: [0.0, 0.0, 0.0, 1.0]})  # a verdict
    after = httpx.get(url)
    assert after.headers["x-cache"] == "miss" and rows(after.text, "versions")[0][4] == "0.250"  # 1 pass of 4
    record = RegistryClient(server.url, server.token).publish_eval(PACKAGE, "1.1.0", {**SUMMARY, **ENV_SUMMARY})
    shown = httpx.get(url)
    assert shown.headers["x-cache"] == "miss" and f'/evals/{record.id}/"' not in shown.text  # no episodes yet
    assert "runs/rl/hf" in shown.text


ENV_SUMMARY = {"env_id": ENV, "package_version": "1.1.0", "num_prompts": 3, "n": 4, "pass@4": 0.5}


def episodes(count: int) -> bytes:
    """``count`` sample records of the env as ``molt-env eval`` writes them, every 7th with hostile text."""
    lines = []
    for i in range(count):
        text = HOSTILE if i % 7 == 0 else f"answer {i}"
        record = {
            "env_id": ENV, "spec_hash": "spec-1.1.0", "package_version": "1.1.0", "prompt_id": i // 4,
            "sample": i % 4, "prompt": [{"role": "user", "content": f"question {i // 4} {HOSTILE}"}],
            "transcript": [{"role": "user", "content": f"question {i // 4}"}, {"role": "assistant", "content": text}],
            "reward": float(i % 2), "completed": True, "failure": None, "turns": 1, "prompt_tokens": 5,
            "completion_tokens": i, "info": {HOSTILE: HOSTILE},
        }  # fmt: skip
        lines.append(json.dumps(record) + "\n")
    return "".join(lines).encode()


def test_an_uploaded_evals_episodes_in_the_viewer_pages(server, hub_versions, tmp_path):
    publish(server, hub_versions["1.1.0"])
    client = RegistryClient(server.url, server.token)
    record = client.publish_eval(PACKAGE, "1.1.0", {**SUMMARY, **ENV_SUMMARY})
    base = f"{server.url}/evals/{record.id}"
    missing = httpx.get(f"{base}/")
    assert missing.status_code == 404 and "has a summary but no episodes" in missing.text

    samples = tmp_path / "samples.jsonl"
    samples.write_bytes(episodes(150))
    stored = client.publish_eval_samples(PACKAGE, "1.1.0", record.id, samples)
    assert stored.samples and [e.samples for e in client.evals(PACKAGE, "1.1.0") if e.id == record.id] == [True]
    with pytest.raises(Conflict, match="stored already"):
        client.publish_eval_samples(PACKAGE, "1.1.0", record.id, samples)

    card = httpx.get(f"{server.url}/envs/{ENV}?version=1.1.0").text
    assert f'<a class="episodes" href="/evals/{record.id}/">view</a>' in card
    assert f'href="/evals/{record.id}/?failure=grader_error"' in card  # a failure reason links to its episodes

    first = httpx.get(f"{base}/")
    assert first.status_code == 200 and "150 of 150 episodes; page 1 of 2" in first.text
    assert first.headers["content-security-policy"].startswith("default-src 'none'")
    assert active_content(first.text) == [] and "&lt;script&gt;window.__xss=1" in first.text
    assert f'href="/envs/{ENV}?version=1.1.0#evals"' in first.text  # back to the env page
    assert f'href="/evals/{record.id}/?page=2"' in first.text and 'href="/episodes/' not in first.text
    passed = httpx.get(f"{base}/", params={"reward": "pass", "page": 2})
    assert passed.status_code == 404  # the 75 that passed fit one page
    passed = httpx.get(f"{base}/", params={"reward": "pass"})
    assert "75 of 150 episodes" in passed.text
    assert re.findall(r'href="/evals/\d+/episodes/(\d+)"', passed.text)[:3] == ["1", "3", "5"]

    episode = httpx.get(f"{base}/episodes/7")
    assert episode.status_code == 200 and active_content(episode.text) == []
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in episode.text and "<script>" not in episode.text
    assert f'href="/evals/{record.id}/episodes/8"' in episode.text

    for path, status, named in [
        (f"{base}/episodes/150", 404, "not 150"),
        (f"{base}/?min_len=lots", 400, "lots&#39; is not a number"),
        (f"{base}/?page=9", 404, "?page=9"),
        (f"{server.url}/evals/999999/", 404, "no eval 999999"),
    ]:
        refused = httpx.get(path)
        assert refused.status_code == status and named in refused.text, (path, refused.text[-300:])


def test_uploaded_episodes_are_checked(server, hub_versions, tmp_path):
    publish(server, hub_versions["1.1.0"])
    client = RegistryClient(server.url, server.token)
    record = client.publish_eval(PACKAGE, "1.1.0", {**SUMMARY, **ENV_SUMMARY})
    bad = {
        "not records": b"hello\n",
        "another env": episodes(2).replace(ENV.encode(), b"acme/echo-v1"),
        "empty": b"\n",
    }
    for why, body in bad.items():
        path = tmp_path / f"{why}.jsonl"
        path.write_bytes(body)
        with pytest.raises(Exception, match="answered 400") as refused:
            client.publish_eval_samples(PACKAGE, "1.1.0", record.id, path)
        assert "samples" in str(refused.value), why
    path = tmp_path / "ok.jsonl"
    path.write_bytes(episodes(2))
    publish(server, hub_versions["1.0.0"])
    with pytest.raises(NotFound, match="is of hub-versions 1.1.0, not hub-versions 1.0.0"):
        client.publish_eval_samples(PACKAGE, "1.0.0", record.id, path)
    url = f"{server.url}/api/packages/{PACKAGE}/1.1.0/evals/{record.id}/samples"
    assert httpx.post(url, content=b"{}").status_code == 401
